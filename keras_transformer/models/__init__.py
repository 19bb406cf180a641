"""Models assembled from `keras_transformer.layers`."""

from keras_transformer.models.classifier import TransformerClassifier
from keras_transformer.models.transformer import PRESETS, Transformer

__all__ = ["PRESETS", "Transformer", "TransformerClassifier"]
