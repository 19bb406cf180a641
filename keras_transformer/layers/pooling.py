"""Latent attention pooling: one learned weight per token, the sentence its weighted sum.

A classifier needs one vector per sentence. [CLS] pooling lets self-attention
gather it into the first token; mean pooling gives every token the same say.
Latent attention (Yang et al. 2016, "Hierarchical Attention Networks";
Lin et al. 2017, "A Structured Self-Attentive Sentence Embedding") learns
how much each token counts from the token's own state in context:

    score_t  = v^T tanh(W h_t + b)          (one number per position t)
    alpha    = softmax(score) over the real tokens (padding gets exactly 0)
    pooled   = sum_t alpha_t h_t

`v` plays the role of a query that is learned rather than computed from an
input: the question "which words matter for this task?" asked once, of every
sentence. The weights `alpha` say which words decided the label, which is why
the layer hands them back for plotting.
"""

import keras
from keras import ops

from keras_transformer.layers.checks import check_positive_int
from keras_transformer.layers.config import Hyperparameters


@keras.saving.register_keras_serializable(package="keras_transformer")
class AttentionPooling(Hyperparameters, keras.layers.Layer):
    """Pools `(batch, length, d_model)` states into `(batch, d_model)` with learned token weights.

    Args:
        hidden_size: the width of `W` (the score network's hidden layer).

    Call arguments:
        states: `(batch, length, d_model)` encoder states.
        mask: optional boolean `(batch, length)`, True at real tokens (a Keras
            mask carried by `states` is used when none is given).
        return_weights: also return the weights `alpha`.

    Returns:
        pooled `(batch, d_model)`, and with `return_weights` the weights
        `(batch, length)`, which sum to 1 over the real tokens and are 0 at padding.

    Example:
    >>> pooling = AttentionPooling(hidden_size=64)
    >>> pooled, weights = pooling(keras.ops.ones((2, 7, 128)), return_weights=True)
    >>> pooled.shape, weights.shape  # (2, 128), (2, 7)
    """

    hyperparameters = ("hidden_size",)

    def __init__(self, hidden_size, **kwargs):
        super().__init__(**kwargs)
        check_positive_int(hidden_size=hidden_size)
        self.store_hyperparameters(locals())
        self.score_hidden = keras.layers.Dense(hidden_size, activation="tanh", dtype=self.dtype_policy, name="hidden")
        # v: no bias, a constant added to every score changes no softmax.
        self.score = keras.layers.Dense(1, use_bias=False, dtype=self.dtype_policy, name="score")
        self.supports_masking = True

    def build(self, states_shape):
        self.score_hidden.build(states_shape)
        self.score.build(tuple(states_shape[:-1]) + (self.hidden_size,))

    def call(self, states, mask=None, return_weights=False):
        scores = ops.squeeze(self.score(self.score_hidden(states)), axis=-1)
        # The softmax in float32: bfloat16 scores round weights of long inputs badly.
        scores = ops.cast(scores, "float32")
        if mask is not None:
            scores = ops.where(mask, scores, ops.cast(-1e9, scores.dtype))
        weights = ops.softmax(scores, axis=-1)
        if mask is not None:
            # A row of padding only (no real token) would get uniform weights: zero them.
            weights = ops.where(mask, weights, ops.zeros_like(weights))
        pooled = ops.einsum("bl,bld->bd", ops.cast(weights, states.dtype), states)
        return (pooled, weights) if return_weights else pooled

    def compute_mask(self, states, mask=None):
        return None  # one vector per sentence: nothing left to mask

    def compute_output_shape(self, states_shape):
        return (states_shape[0], states_shape[-1])
