"""Masked-language-model pre-training of the encoder: BERT's first task on our `Encoder`.

    corrupted ids ([CLS] w1 [MASK] w3 ...) -> Encoder -> the hidden positions' states -> transform -> tied output -> logits

A classifier trained from scratch on 67k labelled phrases learns its word
meanings from those labels alone. Pre-training learns them from text, labels
not needed (Devlin et al. 2019, "BERT", Section 3.1): hide some tokens, and
train the encoder to predict them from both sides of their context. The
encoder is then the starting point of a classifier
(`train-classifier --init-from RUN_DIR`).

The output layer is the token embedding, transposed (Section 3.4 of the
Transformer paper, as BERT does): predicting a word and reading it share one
matrix, so the embedding learns from both. Before it, BERT puts a small
"transform" (a dense layer with GELU and a LayerNorm) that lets the last
layer's states specialise for the task without reshaping the embedding.
"""

import keras
from keras import ops

from keras_transformer.layers import Encoder
from keras_transformer.layers.config import Hyperparameters
from keras_transformer.models.multi_worker import MultiWorkerFit


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedLanguageModel(MultiWorkerFit, Hyperparameters, keras.Model):
    """An `Encoder` with BERT's masked-token prediction head (output tied to the embedding).

    Args:
        vocab_size, num_layers, d_model, num_heads, d_ff, max_length, dropout,
        norm_first, position, epsilon, activation: as for `Encoder` (and
        `TransformerClassifier`, which takes this encoder over).

    Call arguments:
        inputs: `token_ids`, `(batch, length)` ids with some replaced by
            `[MASK]` (`data.mask_tokens`), 0 padding; or `(token_ids, positions)`
            with `positions` `(batch, hidden)` int32, the positions to predict
            (`data.hidden_positions`; what training passes).
        training: whether dropout is active.

    Returns:
        logits, float32: the predicted original token at every position,
        `(batch, length, vocab_size)`, or at the given positions only,
        `(batch, hidden, vocab_size)`.

    Example:
    >>> model = MaskedLanguageModel(vocab_size=8000, num_layers=2, d_model=128, num_heads=4,
    ...                             d_ff=256, max_length=64)
    >>> model(keras.ops.ones((3, 20), "int32")).shape  # (3, 20, 8000)
    """

    hyperparameters = (
        "vocab_size",
        "num_layers",
        "d_model",
        "num_heads",
        "d_ff",
        "max_length",
        "dropout",
        "norm_first",
        "position",
        "epsilon",
        "activation",
    )

    def __init__(
        self,
        vocab_size,
        num_layers,
        d_model,
        num_heads,
        d_ff,
        max_length,
        dropout=0.1,
        norm_first=False,
        position="sinusoidal",
        epsilon=1e-6,
        activation="relu",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.store_hyperparameters(locals())
        self.encoder = Encoder(**self.shared_hyperparameters(Encoder), dtype=self.dtype_policy, name="encoder")
        self.transform = keras.layers.Dense(d_model, activation="gelu", dtype=self.dtype_policy, name="transform")
        self.transform_norm = keras.layers.LayerNormalization(
            epsilon=epsilon, dtype=self.dtype_policy, name="transform_norm"
        )

    def build(self, token_ids_shape):
        self.encoder.build(token_ids_shape)
        hidden_shape = tuple(token_ids_shape) + (self.d_model,)
        self.transform.build(hidden_shape)
        self.transform_norm.build(hidden_shape)
        self.output_bias = self.add_weight(name="output_bias", shape=(self.vocab_size,), initializer="zeros")

    def call(self, inputs, training=None):
        token_ids, positions = inputs if isinstance(inputs, (tuple, list)) else (inputs, None)
        states = self.encoder(token_ids, training=training)
        if positions is not None:
            # Only the hidden tokens are scored: the output layer's cost, which
            # grows with the vocabulary, is paid for 15% of the positions.
            states = ops.take_along_axis(states, ops.expand_dims(positions, -1), axis=1)
        hidden = self.transform_norm(self.transform(states))
        embedding = ops.cast(self.encoder.embedding.embeddings, hidden.dtype)
        logits = ops.matmul(hidden, ops.transpose(embedding)) + ops.cast(self.output_bias, hidden.dtype)
        return ops.cast(logits, "float32")
