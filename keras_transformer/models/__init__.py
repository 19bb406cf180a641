"""Models assembled from `keras_transformer.layers`, and the names of their attention maps."""

from keras_transformer.models import attention_maps
from keras_transformer.models.attention_maps import (
    attention_map_name,
    attention_map_names,
    parse_attention_map_name,
    queries_and_keys,
    token_sides,
)
from keras_transformer.models.classifier import TransformerClassifier
from keras_transformer.models.language_model import LanguageModel
from keras_transformer.models.masked_lm import MaskedLanguageModel
from keras_transformer.models.multi_worker import MultiWorkerFit
from keras_transformer.models.transformer import PRESETS, Transformer

__all__ = [
    "LanguageModel",
    "MaskedLanguageModel",
    "MultiWorkerFit",
    "PRESETS",
    "Transformer",
    "TransformerClassifier",
    "attention_map_name",
    "attention_map_names",
    "attention_maps",
    "parse_attention_map_name",
    "queries_and_keys",
    "token_sides",
]
