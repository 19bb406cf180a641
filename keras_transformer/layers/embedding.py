"""Token embeddings plus positions: the input to every stack (Sections 3.4, 3.5)."""

import math

import keras
from keras import ops

from keras_transformer.layers.checks import check_positive_int, check_rate
from keras_transformer.layers.config import Hyperparameters
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.positional import NAMED_TABLES, PositionalEncoding, PositionEmbedding, check_sinusoid

# Positions to choose from when training: the paper's sinusoids (Section 3.5), or a learned table.
POSITION_KINDS = ("sinusoidal", "learned")
# A checkpoint's sinusoids may differ from the paper's (`positional.positional_encoding`): `position` is
# then a dict of those choices, e.g. {"columns": "blocked"}.
SINUSOID_CHOICES = ("columns", "first_position", "frequency_spacing")


def sinusoid_choices(position):
    """The `PositionalEncoding` arguments a `position` setting stands for (`{}`: the paper's); None if learned.

    Runs saved before the choices had names name their table: "sinusoidal_halves", "sinusoidal_fairseq".
    """
    if position == "learned":
        return None
    if isinstance(position, dict):
        unknown = set(position) - set(SINUSOID_CHOICES)
        if unknown:
            raise ValueError(f"position's sinusoid choices are {SINUSOID_CHOICES}, got {sorted(unknown)}")
        check_sinusoid(**position)
        return dict(position)
    if position == "sinusoidal":
        return {}
    named = position.removeprefix("sinusoidal_") if isinstance(position, str) else None
    if named in NAMED_TABLES and named != "interleaved":
        return NAMED_TABLES[named]
    raise ValueError(f"position must be one of {POSITION_KINDS} or a dict of {SINUSOID_CHOICES}, got {position!r}")


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenAndPositionEmbedding(Hyperparameters, keras.layers.Layer):
    """Embeds token ids, scales them by sqrt(d_model), adds positions, drops out.

    Section 3.4: "In the embedding layers, we multiply those weights by
    sqrt(d_model)", which puts the token vectors on the same scale as the
    positional signal added next. Section 5.4 applies dropout "to the sums of
    the embeddings and the positional encodings".

    Args:
        vocab_size: number of token ids.
        d_model: embedding size.
        max_length: longest sequence (positions are defined up to it).
        position: "sinusoidal" (fixed, Section 3.5), "learned", or a
            checkpoint's own sinusoids: a dict of `SINUSOID_CHOICES` (see
            `positional.positional_encoding`).
        scale: multiply token embeddings by sqrt(d_model).
        mask_zero: id 0 is padding: the output carries a Keras mask.
        dropout: dropout rate on the sum.

    Call arguments:
        token_ids: integer `(batch, length)`.
        start_index: position of the first id (incremental decoding).
        training: whether dropout is active.

    Returns:
        `(batch, length, d_model)`, with a `(batch, length)` mask when
        `mask_zero`.

    Example:
    >>> embed = TokenAndPositionEmbedding(vocab_size=1000, d_model=64, max_length=128)
    >>> embed(keras.ops.convert_to_tensor([[5, 6, 0]])).shape  # (1, 3, 64)
    """

    hyperparameters = (
        "vocab_size",
        "d_model",
        "max_length",
        "position",
        "scale",
        "mask_zero",
        "dropout",
        "embeddings_initializer",
    )

    def __init__(
        self,
        vocab_size,
        d_model,
        max_length,
        position="sinusoidal",
        scale=True,
        mask_zero=True,
        dropout=0.0,
        embeddings_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int(vocab_size=vocab_size, d_model=d_model, max_length=max_length)
        check_rate(dropout=dropout)
        sinusoid = sinusoid_choices(position)
        self.store_hyperparameters(locals())
        # With scaling by sqrt(d_model), unit-variance / sqrt(d_model) vectors
        # come out at unit scale, like the sinusoids they are added to.
        if embeddings_initializer is None:
            embeddings_initializer = keras.initializers.RandomNormal(stddev=d_model**-0.5)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

        self.token_embedding = keras.layers.Embedding(
            vocab_size,
            d_model,
            embeddings_initializer=self.embeddings_initializer,
            mask_zero=mask_zero,
            dtype=self.dtype_policy,
            name="token_embedding",
        )
        if sinusoid is not None:
            self.position_embedding = PositionalEncoding(
                max_length, **sinusoid, dtype=self.dtype_policy, name="position_encoding"
            )
        else:
            self.position_embedding = PositionEmbedding(
                max_length, dtype=self.dtype_policy, name="position_embedding"
            )
        self.dropout_layer = Dropout(dropout, dtype=self.dtype_policy)
        self.supports_masking = mask_zero

    @property
    def embeddings(self):
        """The `(vocab_size, d_model)` token matrix (shared with the output layer when tied)."""
        return self.token_embedding.embeddings

    def build(self, token_ids_shape):
        self.token_embedding.build(token_ids_shape)
        self.position_embedding.build(tuple(token_ids_shape) + (self.d_model,))

    def call(self, token_ids, start_index=0, training=None):
        embedded = self.token_embedding(token_ids)
        if self.scale:
            embedded = embedded * ops.cast(math.sqrt(self.d_model), embedded.dtype)
        embedded = self.position_embedding(embedded, start_index=start_index)
        return self.dropout_layer(embedded, training=training)

    def compute_mask(self, token_ids, mask=None):
        if not self.mask_zero:
            return None
        return ops.not_equal(token_ids, 0)

    def compute_output_shape(self, token_ids_shape):
        return tuple(token_ids_shape) + (self.d_model,)
