"""The encoder (Section 3.1, left half of Figure 1).

"The encoder is composed of a stack of N = 6 identical layers. Each layer has
two sub-layers. The first is a multi-head self-attention mechanism, and the
second is a simple, position-wise fully connected feed-forward network."
"""

import keras

from keras_transformer.layers.checks import check_heads_divide, check_positive_int
from keras_transformer.layers.config import Hyperparameters
from keras_transformer.layers.masks import padding_mask
from keras_transformer.layers.stack import TransformerStack
from keras_transformer.layers.sublayers import AttentionSublayer, FeedForwardSublayer


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderLayer(Hyperparameters, keras.layers.Layer):
    """One encoder layer: self-attention, then the feed-forward network.

    Post-LN as in the paper:

        x = LayerNorm(x + Dropout(SelfAttention(x)))
        x = LayerNorm(x + Dropout(FFN(x)))

    or pre-LN with `norm_first=True` (see `sublayers`).

    Args:
        num_heads: attention heads (8 in the base model).
        d_ff: feed-forward hidden size (2048 in the base model).
        dropout: residual dropout P_drop (0.1 in the base model).
        norm_first: pre-LN instead of post-LN.
        epsilon: LayerNorm epsilon.
        sliding_window: local attention: each position sees +-w neighbours.
        activation: feed-forward activation.
        attention_dropout, activation_dropout: extra dropouts (0 in the paper).

    Call arguments:
        inputs: `(batch, length, d_model)`; its Keras mask marks padding.
        mask: `(batch, length)` padding mask, True at real tokens.
        training: whether dropout is active.
        return_attention_scores: also return `{"self_attention": (batch,
            heads, length, length)}`.

    Returns:
        `(batch, length, d_model)`, or `(outputs, scores)`.

    Example:
    >>> layer = EncoderLayer(num_heads=8, d_ff=2048)
    >>> layer(keras.ops.zeros((2, 10, 512))).shape  # (2, 10, 512)
    """

    hyperparameters = (
        "num_heads",
        "d_ff",
        "dropout",
        "norm_first",
        "epsilon",
        "sliding_window",
        "activation",
        "attention_dropout",
        "activation_dropout",
    )

    def __init__(
        self,
        num_heads,
        d_ff,
        dropout=0.1,
        norm_first=False,
        epsilon=1e-6,
        sliding_window=None,
        activation="relu",
        attention_dropout=0.0,
        activation_dropout=0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int(num_heads=num_heads, d_ff=d_ff)
        self.store_hyperparameters(locals())
        # Each sub-block gets this layer's values of the settings it declares
        # too (num_heads for attention, d_ff for the feed-forward network, ...).
        self.self_attention = AttentionSublayer(
            **self.shared_hyperparameters(AttentionSublayer), dtype=self.dtype_policy, name="self_attention"
        )
        self.feed_forward = FeedForwardSublayer(
            **self.shared_hyperparameters(FeedForwardSublayer), dtype=self.dtype_policy, name="feed_forward"
        )
        self.supports_masking = True

    def build(self, inputs_shape):
        check_heads_divide(inputs_shape[-1], self.num_heads)
        self.self_attention.build(inputs_shape)
        self.feed_forward.build(inputs_shape)

    def call(self, inputs, mask=None, training=None, return_attention_scores=False):
        results = self.self_attention(
            inputs,
            inputs_mask=mask,
            training=training,
            return_attention_scores=return_attention_scores,
        )
        outputs = results[0] if return_attention_scores else results
        outputs = self.feed_forward(outputs, training=training)
        if return_attention_scores:
            return outputs, {"self_attention": results[1]}
        return outputs

    def compute_output_shape(self, inputs_shape):
        return inputs_shape


@keras.saving.register_keras_serializable(package="keras_transformer")
class Encoder(TransformerStack):
    """Token ids -> embeddings + positions -> dropout -> N `EncoderLayer`s.

    Args:
        num_layers: N (6 in the paper).
        vocab_size: source vocabulary size; id 0 is padding.
        d_model: model width (512 in the base model).
        num_heads: attention heads per layer.
        d_ff: feed-forward hidden size.
        max_length: longest source sequence.
        dropout: dropout on embeddings and every sub-layer output.
        norm_first: pre-LN layers plus a final LayerNorm.
        epsilon: LayerNorm epsilon.
        position: "sinusoidal" (the paper's), "learned", or a checkpoint's own sinusoids
            (see `TokenAndPositionEmbedding`).
        sliding_window: local self-attention window, or None.
        activation, attention_dropout, activation_dropout: see `EncoderLayer`.
        embedding: a `TokenAndPositionEmbedding` to use (and share).

    Call arguments:
        token_ids: `(batch, length)` integers, 0 = padding.
        training: whether dropout is active.
        return_attention_scores: also return a dict from "layer_{i}/self_attention"
            to `(batch, heads, length, length)`.

    Returns:
        `(batch, length, d_model)` carrying the padding mask as its Keras mask;
        or `(outputs, scores)`.

    Example:
    >>> encoder = Encoder(num_layers=2, vocab_size=1000, d_model=64, num_heads=4,
    ...                   d_ff=128, max_length=50)
    >>> encoder(keras.ops.ones((2, 7), "int32")).shape  # (2, 7, 64)
    """

    hyperparameters = TransformerStack.hyperparameters + EncoderLayer.hyperparameters

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.encoder_layers = self._make_layers(EncoderLayer)

    def build(self, token_ids_shape):
        hidden_shape = self._build_common(token_ids_shape)
        for layer in self.encoder_layers:
            layer.build(hidden_shape)

    def call(self, token_ids, training=None, return_attention_scores=False):
        # The padding mask is computed once here and handed to every layer.
        mask = padding_mask(token_ids)
        outputs = self.embedding(token_ids, training=training)
        scores = {}
        for index, layer in enumerate(self.encoder_layers):
            results = layer(outputs, mask=mask, training=training, return_attention_scores=return_attention_scores)
            if return_attention_scores:
                outputs, layer_scores = results
                scores.update(self._prefixed_scores(index, layer_scores))
            else:
                outputs = results
        outputs = self._finish(outputs)
        return (outputs, scores) if return_attention_scores else outputs

    def compute_output_shape(self, token_ids_shape):
        return tuple(token_ids_shape) + (self.d_model,)
