"""An encoder-only classifier: BERT's recipe on the Transformer encoder.

token ids ([CLS] first) -> Encoder -> pool -> dropout -> Linear -> logits

"cls" pooling takes the final state of the first token: with self-attention
it can gather whatever the task needs from every other position, and its
vector is a sentence embedding worth plotting. "mean" pooling averages the
real (unpadded) positions instead. "attention" pooling learns a weight per
token (`layers.AttentionPooling`) and hands the weights back for plotting:
`token_weights` says which words decided the label.
"""

import keras
from keras import ops

from keras_transformer.layers import Encoder
from keras_transformer.layers.checks import check_positive_int
from keras_transformer.layers.config import Hyperparameters
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.masks import padding_mask
from keras_transformer.layers.pooling import AttentionPooling
from keras_transformer.models.multi_worker import MultiWorkerFit

POOLINGS = ("cls", "mean", "attention")


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerClassifier(MultiWorkerFit, Hyperparameters, keras.Model):
    """Sequence classification with a Transformer encoder.

    Args:
        vocab_size: vocabulary size; id 0 is padding.
        num_classes: number of output logits.
        num_layers, d_model, num_heads, d_ff, max_length, dropout: as for `Encoder`.
        pooling: "cls" (the first token's final state), "mean", or
            "attention" (a learned weight per token, `AttentionPooling`).
        norm_first, position, epsilon, activation, sliding_window: as for `Encoder`.

    Call arguments:
        token_ids: `(batch, length)` integers; with "cls" pooling the
            tokenizer puts the [CLS] id first.
        training: whether dropout is active.

    Returns:
        logits `(batch, num_classes)`, float32. `embed(token_ids)` returns the
        pooled `(batch, d_model)` embedding, and `head(pooled)` its logits:
        one encoder pass gives both.

    Example:
    >>> model = TransformerClassifier(vocab_size=8000, num_classes=2, num_layers=2,
    ...                               d_model=128, num_heads=4, d_ff=256, max_length=256)
    >>> model(keras.ops.ones((3, 40), "int32")).shape  # (3, 2)
    """

    # The encoder gets those of them it declares (all but num_classes and pooling).
    hyperparameters = (
        "vocab_size",
        "num_classes",
        "num_layers",
        "d_model",
        "num_heads",
        "d_ff",
        "max_length",
        "dropout",
        "pooling",
        "norm_first",
        "position",
        "epsilon",
        "activation",
        "sliding_window",
    )

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
        self.store_hyperparameters(locals())
        self.encoder = Encoder(**self.shared_hyperparameters(Encoder), dtype=self.dtype_policy, name="encoder")
        if pooling == "attention":
            self.attention_pooling = AttentionPooling(d_model, dtype=self.dtype_policy, name="attention_pooling")
        self.head_dropout = Dropout(dropout, dtype=self.dtype_policy)
        self.classifier = keras.layers.Dense(num_classes, dtype=self.dtype_policy, name="classifier")

    def build(self, token_ids_shape):
        self.encoder.build(token_ids_shape)
        if self.pooling == "attention":
            self.attention_pooling.build(tuple(token_ids_shape) + (self.d_model,))
        self.classifier.build((token_ids_shape[0], self.d_model))

    def embed(self, token_ids, training=None):
        """The pooled `(batch, d_model)` sentence embedding."""
        states = self.encoder(token_ids, training=training)
        if self.pooling == "cls":
            return states[:, 0, :]
        if self.pooling == "attention":
            return self.attention_pooling(states, mask=padding_mask(token_ids))
        mask = ops.cast(padding_mask(token_ids), states.dtype)[:, :, None]
        total = ops.sum(states * mask, axis=1)
        count = ops.maximum(ops.sum(mask, axis=1), ops.cast(1, states.dtype))
        return total / count

    def token_weights(self, token_ids):
        """"attention" pooling's weights `(batch, length)`: how much each token counted (0 at padding)."""
        if self.pooling != "attention":
            raise ValueError(f"token weights need pooling='attention', this model pools with {self.pooling!r}")
        states = self.encoder(token_ids, training=False)
        _, weights = self.attention_pooling(states, mask=padding_mask(token_ids), return_weights=True)
        return weights

    def head(self, pooled, training=None):
        """Pooled embeddings `(batch, d_model)` -> float32 logits `(batch, num_classes)`."""
        return ops.cast(self.classifier(self.head_dropout(pooled, training=training)), "float32")

    def call(self, token_ids, training=None):
        return self.head(self.embed(token_ids, training=training), training=training)
