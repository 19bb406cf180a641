"""Local attention: each query sees a window of keys (Luong et al. 2015, Section 3.2).

"Effective Approaches to Attention-based Neural Machine Translation" lets
each query see only the 2D+1 keys around an aligned position p_t:

* monotonic: p_t = t, the query's own position; a sliding window, which
  `masks.sliding_window_mask` draws (`MultiHeadAttention(sliding_window=D)`).
* predictive: each query predicts where it is aligned (`PredictiveLocalAttention`),

      p_t = S * sigmoid(v_p^T tanh(W_p h_t))        (S: the real keys' count)

  attends to the keys s within [p_t - D, p_t + D], and its weights are
  multiplied by a Gaussian centred there,

      a_t(s) = softmax(scores)_s * exp(-(s - p_t)^2 / (2 sigma^2)),  sigma = D / 2,

  which is what trains W_p and v_p: the window's edges have no gradient, the
  Gaussian does. Every head predicts its own p_t (one column of v_p each).
  It depends on the query alone, so a decoding step computes it as a full
  pass does.

`PredictiveLocalAttention` is `MultiHeadAttention` with W_p and v_p, which
takes the window as its mask and the Gaussian as a weighting of equation
(1)'s weights (`scaled_dot_product_attention(weight_scale=...)`); the rest,
projections and heads, is its parent's. An `AttentionSublayer`'s
`window_alignment` ("monotonic" or "predictive") says which of the two it uses.
"""

import keras
from keras import ops

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.checks import check_positive_int
from keras_transformer.layers.masks import merge_attention_masks
from keras_transformer.layers.position_wise import matrix_product

MONOTONIC, PREDICTIVE = "monotonic", "predictive"
WINDOW_ALIGNMENTS = (MONOTONIC, PREDICTIVE)


def check_window(sliding_window, window_alignment):
    """Refuse a window that is not a positive D, or an alignment we do not know, in one line."""
    if sliding_window is not None:
        check_positive_int(sliding_window=sliding_window)
    if window_alignment not in WINDOW_ALIGNMENTS:
        raise ValueError(f"window_alignment must be one of {WINDOW_ALIGNMENTS}, got {window_alignment!r}")
    if window_alignment == PREDICTIVE and sliding_window is None:
        raise ValueError("window_alignment='predictive' needs sliding_window, the window's half-width D")


def predict_positions(query, alignment_kernel, alignment_vector, key_mask, key_length):
    """p_t = S sigmoid(v_p^T tanh(W_p h_t)): `(batch, heads, query_length)` float32 positions in [0, S].

    Args:
        query: `(batch, query_length, d_model)`, the h_t.
        alignment_kernel: W_p, `(d_model, d_model)`.
        alignment_vector: v_p, `(d_model, heads)`: one column per head.
        key_mask: `(batch, key_length)` padding mask, or None.
        key_length: the keys' count; S is each sentence's number of real
            keys (from `key_mask`), or `key_length` when nothing is padded.
    """
    hidden = ops.tanh(matrix_product(query, alignment_kernel))
    fraction = ops.sigmoid(ops.cast(matrix_product(hidden, alignment_vector), "float32"))
    if key_mask is None:
        source_length = ops.cast(key_length, "float32")
    else:
        source_length = ops.sum(ops.cast(key_mask, "float32"), axis=-1)[:, None, None]
    return ops.transpose(source_length * fraction, (0, 2, 1))


def predictive_window(positions, key_length, half_width):
    """The window `(batch, heads, query_length, key_length)` of keys within `half_width` of each p_t,
    and the Gaussian (sigma = D / 2) its weights are multiplied by.

    Example:
    >>> window, gaussian = predictive_window(ops.ones((1, 2, 3)) * 4.0, key_length=10, half_width=2)
    >>> window.shape, gaussian.shape  # ((1, 2, 3, 10), (1, 2, 3, 10))
    """
    distance = ops.cast(ops.arange(key_length), "float32")[None, None, None, :] - positions[..., None]
    window = ops.abs(distance) <= half_width
    sigma = half_width / 2.0
    return window, ops.exp(-ops.square(distance) / (2.0 * sigma * sigma))


@keras.saving.register_keras_serializable(package="keras_transformer")
class PredictiveLocalAttention(MultiHeadAttention):
    """`MultiHeadAttention` on the 2D+1 keys around a position each query predicts (local-p, above).

    It adds W_p and v_p to its parent's weights, and changes the mask (the
    predicted window, not one around the query's own position) and the
    weights (times the Gaussian). It is for a fixed context, cross-attention:
    p_t scales with the key count, which a growing decoding cache does not
    have yet.

    Args:
        num_heads: as for `MultiHeadAttention`.
        sliding_window: D, the window's half-width.
        **kwargs: `MultiHeadAttention`'s other arguments.

    Call arguments and returns: `MultiHeadAttention`'s.

    Example:
    >>> attention = PredictiveLocalAttention(num_heads=2, sliding_window=3)
    >>> attention(keras.random.normal((2, 5, 16)), keras.random.normal((2, 12, 16))).shape  # (2, 5, 16)
    """

    def __init__(self, num_heads, sliding_window, **kwargs):
        check_positive_int(sliding_window=sliding_window)
        super().__init__(num_heads, sliding_window=sliding_window, **kwargs)

    def build(self, query_shape, value_shape=None, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        query_dim, initializer = query_shape[-1], self.kernel_initializer
        # W_p and v_p of p_t = S sigmoid(v_p^T tanh(W_p h_t)); one v_p column per head.
        self.alignment_kernel = self.add_weight(name="alignment_kernel", shape=(query_dim, query_dim),
                                                initializer=initializer)
        self.alignment_vector = self.add_weight(name="alignment_vector", shape=(query_dim, self.num_heads),
                                                initializer=initializer)

    def _mask(self, query, query_length, key_length, query_mask, key_padding, attention_mask, causal, **decoding):
        # No window around the query's own position: the predicted one, and its Gaussian.
        mask = merge_attention_masks(query_length, key_length, query_mask=query_mask, key_mask=key_padding,
                                     attention_mask=attention_mask, causal=causal, **decoding)
        positions = self.aligned_positions(query, key_padding, key_length)
        window, gaussian = predictive_window(positions, key_length, self.sliding_window)
        return (window if mask is None else ops.logical_and(mask, window)), gaussian

    def aligned_positions(self, query, key_mask, key_length):
        """The window's centres p_t: `(batch, heads, query_length)` (see `predict_positions`)."""
        return predict_positions(query, self._weight(self.alignment_kernel), self._weight(self.alignment_vector),
                                 key_mask, key_length)


@keras.saving.register_keras_serializable(package="keras_transformer", name="SavedAsMultiHeadAttention")
class SavedAsMultiHeadAttention(PredictiveLocalAttention):
    """A `PredictiveLocalAttention` loaded from a layer saved before it had a class of its own.

    It was `MultiHeadAttention(window_alignment="predictive")` then
    (`MultiHeadAttention.from_config` reads that config). Keras finds a
    layer's weights in a `.keras` file by its class's name, so this class
    keeps that name: the file it came from loads, and so does the layer
    saved again (under this class's registered name).
    """


SavedAsMultiHeadAttention.__name__ = SavedAsMultiHeadAttention.__qualname__ = MultiHeadAttention.__name__
