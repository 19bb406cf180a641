"""The Transformer's building blocks, one concept per module.

Read them in this order: `masks`, `attention`, `dropout`, `positional`, `embedding`,
`feed_forward`, `sublayers`, `encoder`, `decoder`.
"""

from keras_transformer.layers.attention import MultiHeadAttention, scaled_dot_product_attention
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
from keras_transformer.layers.positional import (
    PositionalEncoding,
    PositionEmbedding,
    positional_encoding,
)
from keras_transformer.layers.sublayers import AttentionSublayer, FeedForwardSublayer

__all__ = [
    "AttentionSublayer",
    "Decoder",
    "DecoderLayer",
    "Dropout",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "FeedForwardSublayer",
    "MultiHeadAttention",
    "PositionEmbedding",
    "PositionalEncoding",
    "TokenAndPositionEmbedding",
    "causal_mask",
    "merge_attention_masks",
    "padding_mask",
    "positional_encoding",
    "scaled_dot_product_attention",
    "sliding_window_mask",
]
