"""Decoding: greedy and beam search and sampling over any model's step function, the Transformer's and a language model's steps, and text-to-text Translator and Generator."""

from keras_transformer.backends import require_tensorflow

require_tensorflow("keras_transformer.inference", "its searches run the model inside tf.while_loop")

from keras_transformer.inference.settings import STOP_RULES, DecodingSettings, LengthPenalty, TokenRules
from keras_transformer.inference.search import beam_search, greedy_search, higher_scoring, num_steps
from keras_transformer.inference.sampling import SamplingSettings, filter_logits, sample
from keras_transformer.inference.steps import (
    language_model_prefill,
    language_model_step,
    output_limits,
    score_sequences,
    transformer_search,
    transformer_step,
)
from keras_transformer.inference.generator import Generator
from keras_transformer.inference.translator import Translator

__all__ = [
    "STOP_RULES",
    "DecodingSettings",
    "LengthPenalty",
    "SamplingSettings",
    "TokenRules",
    "Generator",
    "Translator",
    "beam_search",
    "filter_logits",
    "greedy_search",
    "higher_scoring",
    "language_model_prefill",
    "language_model_step",
    "num_steps",
    "output_limits",
    "sample",
    "score_sequences",
    "transformer_search",
    "transformer_step",
]
