"""The encoder (Section 3.1, left half of Figure 1).

"The encoder is composed of a stack of N = 6 identical layers. Each layer has
two sub-layers. The first is a multi-head self-attention mechanism, and the
second is a simple, position-wise fully connected feed-forward network."
"""

import keras

from keras_transformer.layers.checks import check_heads_divide, check_positive_int
from keras_transformer.layers.embedding import TokenAndPositionEmbedding
from keras_transformer.layers.masks import padding_mask
from keras_transformer.layers.sublayers import AttentionSublayer, FeedForwardSublayer


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderLayer(keras.layers.Layer):
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
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.dropout = dropout
        self.norm_first = norm_first
        self.epsilon = epsilon
        self.sliding_window = sliding_window
        self.activation = activation
        self.attention_dropout = attention_dropout
        self.activation_dropout = activation_dropout
        residual = dict(dropout=dropout, norm_first=norm_first, epsilon=epsilon, dtype=self.dtype_policy)
        self.self_attention = AttentionSublayer(
            num_heads,
            sliding_window=sliding_window,
            attention_dropout=attention_dropout,
            name="self_attention",
            **residual,
        )
        self.feed_forward = FeedForwardSublayer(
            d_ff,
            activation=activation,
            activation_dropout=activation_dropout,
            name="feed_forward",
            **residual,
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

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "d_ff": self.d_ff,
                "dropout": self.dropout,
                "norm_first": self.norm_first,
                "epsilon": self.epsilon,
                "sliding_window": self.sliding_window,
                "activation": self.activation,
                "attention_dropout": self.attention_dropout,
                "activation_dropout": self.activation_dropout,
            }
        )
        return config


class TransformerStack(keras.layers.Layer):
    """What `Encoder` and `Decoder` share: embedding, N layers, optional final LayerNorm.

    Sizes are checked here once, the embedding is built or shared, and the
    stack's config is written in one place.
    """

    def __init__(
        self,
        num_layers,
        vocab_size,
        d_model,
        num_heads,
        d_ff,
        max_length,
        dropout=0.1,
        norm_first=False,
        epsilon=1e-6,
        position="sinusoidal",
        sliding_window=None,
        activation="relu",
        attention_dropout=0.0,
        activation_dropout=0.0,
        embedding=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int(
            num_layers=num_layers,
            vocab_size=vocab_size,
            d_model=d_model,
            num_heads=num_heads,
            d_ff=d_ff,
            max_length=max_length,
        )
        check_heads_divide(d_model, num_heads)
        self.num_layers = num_layers
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.max_length = max_length
        self.dropout = dropout
        self.norm_first = norm_first
        self.epsilon = epsilon
        self.position = position
        self.sliding_window = sliding_window
        self.activation = activation
        self.attention_dropout = attention_dropout
        self.activation_dropout = activation_dropout
        # A shared embedding (Section 3.4's weight sharing) is passed in by the
        # model that owns it; it is not part of this layer's config.
        self.embedding = embedding or TokenAndPositionEmbedding(
            vocab_size,
            d_model,
            max_length,
            position=position,
            dropout=dropout,
            dtype=self.dtype_policy,
            name="embedding",
        )
        # Pre-LN leaves the residual stream unnormalised; normalise it once at the end.
        self.final_norm = (
            keras.layers.LayerNormalization(epsilon=epsilon, dtype=self.dtype_policy, name="final_norm")
            if norm_first
            else None
        )
        self.supports_masking = True

    def _layer_arguments(self):
        return dict(
            dropout=self.dropout,
            norm_first=self.norm_first,
            epsilon=self.epsilon,
            activation=self.activation,
            attention_dropout=self.attention_dropout,
            activation_dropout=self.activation_dropout,
            dtype=self.dtype_policy,
        )

    def _build_common(self, token_ids_shape):
        if not self.embedding.built:
            self.embedding.build(token_ids_shape)
        hidden_shape = tuple(token_ids_shape) + (self.d_model,)
        if self.final_norm is not None:
            self.final_norm.build(hidden_shape)
        return hidden_shape

    def _finish(self, outputs):
        return outputs if self.final_norm is None else self.final_norm(outputs)

    def compute_mask(self, token_ids, mask=None):
        return padding_mask(token_ids)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_layers": self.num_layers,
                "vocab_size": self.vocab_size,
                "d_model": self.d_model,
                "num_heads": self.num_heads,
                "d_ff": self.d_ff,
                "max_length": self.max_length,
                "dropout": self.dropout,
                "norm_first": self.norm_first,
                "epsilon": self.epsilon,
                "position": self.position,
                "sliding_window": self.sliding_window,
                "activation": self.activation,
                "attention_dropout": self.attention_dropout,
                "activation_dropout": self.activation_dropout,
            }
        )
        return config


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
        position: "sinusoidal" or "learned".
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

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.encoder_layers = [
            EncoderLayer(
                self.num_heads,
                self.d_ff,
                sliding_window=self.sliding_window,
                name=f"layer_{index}",
                **self._layer_arguments(),
            )
            for index in range(self.num_layers)
        ]

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
                scores.update({f"layer_{index}/{name}": value for name, value in layer_scores.items()})
            else:
                outputs = results
        outputs = self._finish(outputs)
        return (outputs, scores) if return_attention_scores else outputs

    def compute_output_shape(self, token_ids_shape):
        return tuple(token_ids_shape) + (self.d_model,)
