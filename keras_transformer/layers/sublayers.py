"""The residual sub-blocks that encoder and decoder layers are built from.

Section 3.1: "We employ a residual connection around each of the two
sub-layers, followed by layer normalization. That is, the output of each
sub-layer is LayerNorm(x + Sublayer(x))". Section 5.4 adds dropout "to the
output of each sub-layer, before it is added to the sub-layer input".

    post-LN (the paper):  x = LayerNorm(x + Dropout(Sublayer(x)))
    pre-LN (norm_first):  x = x + Dropout(Sublayer(LayerNorm(x)))

Pre-LN keeps an untouched residual path from input to output, which trains
deep stacks without a careful warm-up (Xiong et al., 2020); its stacks need
one final LayerNorm, which `Encoder`/`Decoder` add.

An encoder layer is `AttentionSublayer` + `FeedForwardSublayer`; a decoder
layer adds a second, cross-attention `AttentionSublayer` between them.
"""

import keras

from keras_transformer.layers import local_attention
from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.cached_attention import CachedMultiHeadAttention, CachedPredictiveLocalAttention
from keras_transformer.layers.checks import check_positive_int, check_rate
from keras_transformer.layers.config import Hyperparameters
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.masks import keras_mask


# The attention layer of a sub-layer: (cached, predictive window) -> its class.
_ATTENTION = {
    (False, False): MultiHeadAttention,
    (True, False): CachedMultiHeadAttention,
    (False, True): local_attention.PredictiveLocalAttention,
    (True, True): CachedPredictiveLocalAttention,
}


class ResidualSublayer(Hyperparameters, keras.layers.Layer):
    """Base: residual connection, dropout and LayerNorm around `_sublayer`."""

    hyperparameters = ("dropout", "norm_first", "epsilon")

    def __init__(self, dropout=0.1, norm_first=False, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        check_rate(dropout=dropout)
        self.store_hyperparameters(locals())
        self.norm = keras.layers.LayerNormalization(epsilon=epsilon, dtype=self.dtype_policy, name="norm")
        self.output_dropout = Dropout(dropout, dtype=self.dtype_policy)
        self.supports_masking = True

    def _residual(self, inputs, sublayer, training):
        """`sublayer` (returning `(outputs, extra)`) with the residual around it: `(outputs, extra)`."""
        sublayer_inputs = self.norm(inputs) if self.norm_first else inputs
        outputs, extra = sublayer(sublayer_inputs)
        outputs = inputs + self.output_dropout(outputs, training=training)
        if not self.norm_first:
            outputs = self.norm(outputs)
        return outputs, extra

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        return inputs_shape


@keras.saving.register_keras_serializable(package="keras_transformer")
class AttentionSublayer(ResidualSublayer):
    """Multi-head attention wrapped in residual + dropout + LayerNorm.

    Self-attention when called without `context`; attention over `context`
    (queries from `inputs`, keys and values from `context`) otherwise.

    Args:
        num_heads: attention heads.
        dropout: dropout on the sub-layer output (P_drop of Section 5.4).
        norm_first: pre-LN instead of the paper's post-LN.
        epsilon: LayerNorm epsilon.
        causal: hide later positions (decoder self-attention).
        sliding_window: local attention window, or None for global.
        window_alignment: where the window is centred, "monotonic" (the
            query's own position) or "predictive" (see `local_attention`).
        attention_dropout: dropout on attention weights (not in the paper).
        cached: the attention can decode on a cache (a decoder's:
            `CachedMultiHeadAttention` and `decode_step`).

    Call arguments:
        inputs: `(batch, length, d_model)`.
        context: `(batch, context_length, d_context)` or None.
        inputs_mask, context_mask: `(batch, length)` padding masks; taken
            from the tensors' Keras masks when not given.
        training, return_attention_scores: as for `MultiHeadAttention`.

    Returns:
        `outputs`, or `(outputs, weights)` when `return_attention_scores`.

    Example:
    >>> block = AttentionSublayer(num_heads=4, causal=True)
    >>> block(keras.ops.zeros((2, 10, 64))).shape  # (2, 10, 64)
    """

    hyperparameters = ResidualSublayer.hyperparameters + (
        "num_heads",
        "causal",
        "sliding_window",
        "window_alignment",
        "attention_dropout",
        "cached",
    )

    def __init__(
        self,
        num_heads,
        dropout=0.1,
        norm_first=False,
        epsilon=1e-6,
        causal=False,
        sliding_window=None,
        window_alignment="monotonic",
        attention_dropout=0.0,
        cached=False,
        **kwargs,
    ):
        super().__init__(dropout=dropout, norm_first=norm_first, epsilon=epsilon, **kwargs)
        local_attention.check_window(sliding_window, window_alignment)
        self.store_hyperparameters(locals())
        attention = _ATTENTION[cached, window_alignment == local_attention.PREDICTIVE]
        self.attention = attention(
            num_heads,
            dropout=attention_dropout,
            sliding_window=sliding_window,
            dtype=self.dtype_policy,
            name="attention",
        )

    def build(self, inputs_shape, context_shape=None):
        self.norm.build(inputs_shape)
        self.attention.build(inputs_shape, context_shape or inputs_shape)

    def call(
        self,
        inputs,
        context=None,
        inputs_mask=None,
        context_mask=None,
        training=None,
        return_attention_scores=False,
    ):
        if inputs_mask is None:
            inputs_mask = keras_mask(inputs)
        if context is not None and context_mask is None:
            context_mask = keras_mask(context)

        def attend(queries):
            results = self.attention(
                queries,
                context,  # None: self-attention
                query_mask=inputs_mask,
                value_mask=inputs_mask if context is None else context_mask,
                use_causal_mask=self.causal,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            return results if return_attention_scores else (results, None)

        outputs, weights = self._residual(inputs, attend, training)
        return (outputs, weights) if return_attention_scores else outputs

    def decode_step(self, inputs, cache, cache_index=None, context_mask=None, cache_policy=None):
        """The sub-layer on a decoding cache: `(outputs, cache)` (see `CachedMultiHeadAttention`).

        With `cache_index`, self-attention over the cached positions and
        `inputs`, written into the cache as `cache_policy` keeps it
        (`cached_attention.KeyValueCache`); without, attention over the
        fixed context the cache holds (`context_mask` its padding).
        """

        def attend(queries):
            return self.attention(
                queries,  # decoding pads no query
                value_mask=context_mask,
                use_causal_mask=self.causal,
                cache=cache,
                cache_index=cache_index,
                cache_policy=cache_policy,
            )

        return self._residual(inputs, attend, training=False)


@keras.saving.register_keras_serializable(package="keras_transformer")
class FeedForwardSublayer(ResidualSublayer):
    """The position-wise feed-forward network wrapped in residual + dropout + LayerNorm.

    Args:
        d_ff: hidden size of the feed-forward network.
        dropout: dropout on the sub-layer output.
        norm_first, epsilon: as for `AttentionSublayer`.
        activation: hidden activation ("relu" in the paper).
        activation_dropout: dropout on the hidden activations (not in the paper).

    Call arguments:
        inputs: `(batch, length, d_model)`.
        training: whether dropout is active.

    Returns:
        `(batch, length, d_model)`.

    Example:
    >>> FeedForwardSublayer(d_ff=256)(keras.ops.zeros((2, 10, 64))).shape  # (2, 10, 64)
    """

    hyperparameters = ResidualSublayer.hyperparameters + ("d_ff", "activation", "activation_dropout")

    def __init__(
        self,
        d_ff,
        dropout=0.1,
        norm_first=False,
        epsilon=1e-6,
        activation="relu",
        activation_dropout=0.0,
        **kwargs,
    ):
        super().__init__(dropout=dropout, norm_first=norm_first, epsilon=epsilon, **kwargs)
        check_positive_int(d_ff=d_ff)
        self.store_hyperparameters(locals())

    def build(self, inputs_shape):
        # d_model is the input's size, known only now.
        self.feed_forward = FeedForward(
            inputs_shape[-1],
            self.d_ff,
            activation=self.activation,
            dropout=self.activation_dropout,
            dtype=self.dtype_policy,
            name="feed_forward",
        )
        self.feed_forward.build(inputs_shape)
        self.norm.build(inputs_shape)

    def call(self, inputs, training=None):
        outputs, _ = self._residual(inputs, lambda x: (self.feed_forward(x, training=training), None), training)
        return outputs
