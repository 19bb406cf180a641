"""An encoder-only classifier: BERT's recipe on the Transformer encoder.

token ids ([CLS] first) -> Encoder -> pool -> dropout -> Linear -> logits

"cls" pooling takes the final state of the first token: with self-attention
it can gather whatever the task needs from every other position, and its
vector is a sentence embedding worth plotting. "mean" pooling averages the
real (unpadded) positions instead.
"""

import keras
from keras import ops

from keras_transformer.layers import Encoder
from keras_transformer.layers.checks import check_positive_int
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.masks import padding_mask

POOLINGS = ("cls", "mean")


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerClassifier(keras.Model):
    """Sequence classification with a Transformer encoder.

    Args:
        vocab_size: vocabulary size; id 0 is padding.
        num_classes: number of output logits.
        num_layers, d_model, num_heads, d_ff, max_length, dropout: as for `Encoder`.
        pooling: "cls" (the first token's final state) or "mean".
        norm_first, position, epsilon, activation, sliding_window: as for `Encoder`.

    Call arguments:
        token_ids: `(batch, length)` integers; with "cls" pooling the
            tokenizer puts the [CLS] id first.
        training: whether dropout is active.

    Returns:
        logits `(batch, num_classes)`, float32. `embed(token_ids)` returns the
        pooled `(batch, d_model)` embedding the head sees.

    Example:
    >>> model = TransformerClassifier(vocab_size=8000, num_classes=2, num_layers=2,
    ...                               d_model=128, num_heads=4, d_ff=256, max_length=256)
    >>> model(keras.ops.ones((3, 40), "int32")).shape  # (3, 2)
    """

    def __init__(
        self,
        vocab_size,
        num_classes,
        num_layers,
        d_model,
        num_heads,
        d_ff,
        max_length,
        dropout=0.1,
        pooling="cls",
        norm_first=False,
        position="sinusoidal",
        epsilon=1e-6,
        activation="relu",
        sliding_window=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int(num_classes=num_classes)
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        self.vocab_size = vocab_size
        self.num_classes = num_classes
        self.num_layers = num_layers
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.max_length = max_length
        self.dropout = dropout
        self.pooling = pooling
        self.norm_first = norm_first
        self.position = position
        self.epsilon = epsilon
        self.activation = activation
        self.sliding_window = sliding_window
        self.encoder = Encoder(
            num_layers=num_layers,
            vocab_size=vocab_size,
            d_model=d_model,
            num_heads=num_heads,
            d_ff=d_ff,
            max_length=max_length,
            dropout=dropout,
            norm_first=norm_first,
            position=position,
            epsilon=epsilon,
            activation=activation,
            sliding_window=sliding_window,
            dtype=self.dtype_policy,
            name="encoder",
        )
        self.head_dropout = Dropout(dropout, dtype=self.dtype_policy)
        self.classifier = keras.layers.Dense(num_classes, dtype=self.dtype_policy, name="classifier")

    def build(self, token_ids_shape):
        self.encoder.build(token_ids_shape)
        self.classifier.build((token_ids_shape[0], self.d_model))

    def embed(self, token_ids, training=None):
        """The pooled `(batch, d_model)` sentence embedding."""
        states = self.encoder(token_ids, training=training)
        if self.pooling == "cls":
            return states[:, 0, :]
        mask = ops.cast(padding_mask(token_ids), states.dtype)[:, :, None]
        total = ops.sum(states * mask, axis=1)
        count = ops.maximum(ops.sum(mask, axis=1), ops.cast(1, states.dtype))
        return total / count

    def call(self, token_ids, training=None):
        pooled = self.head_dropout(self.embed(token_ids, training=training), training=training)
        return ops.cast(self.classifier(pooled), "float32")

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocab_size": self.vocab_size,
                "num_classes": self.num_classes,
                "num_layers": self.num_layers,
                "d_model": self.d_model,
                "num_heads": self.num_heads,
                "d_ff": self.d_ff,
                "max_length": self.max_length,
                "dropout": self.dropout,
                "pooling": self.pooling,
                "norm_first": self.norm_first,
                "position": self.position,
                "epsilon": self.epsilon,
                "activation": self.activation,
                "sliding_window": self.sliding_window,
            }
        )
        return config
