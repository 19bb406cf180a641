"""The Transformer's building blocks, one concept per module.

Read them in this order: `masks`, `attention`, `dropout`, `positional`, `embedding`,
`feed_forward`, `sublayers`, `stack`, `encoder`, `decoder`, `pooling`; then what
builds on attention: `local_attention` (a predicted window) and `cached_attention` (decoding). Two helpers serve
them all: `checks` (argument checks) and `config` (each layer declares its
hyperparameters once; `get_config` follows).
"""

from keras_transformer.layers.attention import (
    MultiHeadAttention,
    fused_dot_product_attention,
    scaled_dot_product_attention,
)
from keras_transformer.layers.cached_attention import CachedMultiHeadAttention
from keras_transformer.layers.local_attention import PredictiveLocalAttention
from keras_transformer.layers.config import Hyperparameters
from keras_transformer.layers.decoder import Decoder, DecoderLayer
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.embedding import TokenAndPositionEmbedding
from keras_transformer.layers.encoder import Encoder, EncoderLayer
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.masks import (
    causal_mask,
    merge_attention_masks,
    padding_mask,
    sliding_window_mask,
)
from keras_transformer.layers.pooling import AttentionPooling
from keras_transformer.layers.positional import (
    PositionalEncoding,
    PositionEmbedding,
    positional_encoding,
)
from keras_transformer.layers.stack import TransformerStack, layer_name
from keras_transformer.layers.sublayers import AttentionSublayer, FeedForwardSublayer

__all__ = [
    "AttentionPooling",
    "AttentionSublayer",
    "CachedMultiHeadAttention",
    "Decoder",
    "DecoderLayer",
    "Dropout",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "FeedForwardSublayer",
    "Hyperparameters",
    "MultiHeadAttention",
    "PositionEmbedding",
    "PredictiveLocalAttention",
    "PositionalEncoding",
    "TokenAndPositionEmbedding",
    "TransformerStack",
    "causal_mask",
    "fused_dot_product_attention",
    "layer_name",
    "merge_attention_masks",
    "padding_mask",
    "positional_encoding",
    "scaled_dot_product_attention",
    "sliding_window_mask",
]
