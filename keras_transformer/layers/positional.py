"""Position information (Section 3.5).

Attention is order-blind: permuting the tokens permutes its outputs and
nothing else. The paper therefore adds a position signal to the token
embeddings, either fixed sinusoids or learned vectors ("nearly identical
results", Table 3 row E). Both layers here *add* positions to their input so
they are interchangeable; `start_index` gives the position of the first
input row, which incremental decoding needs.
"""

import keras
import numpy as np
from keras import ops

from keras_transformer.layers.checks import check_positive_int
from keras_transformer.layers.config import Hyperparameters


# How a sinusoidal table may differ from the paper's, for a checkpoint trained with another
# (`pretrained/` sets these; the paper's are the defaults):
# - the columns' order: the paper's sine/cosine pairs, or every sine and then every cosine;
COLUMN_ORDERS = ("interleaved", "blocked")
# - the first token's position number (0 in the paper);
# - the frequencies' spacing: the i-th of the depth/2 frequencies is base^(-2i/d) in the paper, or
#   base^(-i/(d/2 - 1)), which runs down to exactly 1/base.
FREQUENCY_SPACINGS = ("2i/d", "i/(d/2-1)")


def check_sinusoid(columns="interleaved", first_position=0, frequency_spacing="2i/d"):
    """Refuse, in one line, a choice of the table's that `positional_encoding` does not have."""
    if columns not in COLUMN_ORDERS:
        raise ValueError(f"columns must be one of {COLUMN_ORDERS}, got {columns!r}")
    if frequency_spacing not in FREQUENCY_SPACINGS:
        raise ValueError(f"frequency_spacing must be one of {FREQUENCY_SPACINGS}, got {frequency_spacing!r}")


def blocked_order(depth):
    """The blocked table's columns as the interleaved table's: the sines (columns 2i), then the cosines (2i+1)."""
    return np.concatenate([np.arange(0, depth, 2), np.arange(1, depth, 2)])


def _spaced_to_base(positions, depth, base):
    """The blocked table of the i/(d/2 - 1) spacing, computed in float32 as the checkpoints that use it were
    (fairseq's and Hugging Face's code), so that they see the very numbers they were trained with."""
    half = depth // 2
    step = np.float32(np.log(base) / (half - 1))
    frequencies = np.exp(np.arange(half, dtype=np.float32) * -step)
    angles = positions.astype(np.float32)[:, None] * frequencies[None, :]
    table = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    if depth % 2:
        table = np.concatenate([table, np.zeros((len(positions), 1), np.float32)], axis=1)
    return table


def positional_encoding(length, depth, base=10000.0, columns="interleaved", first_position=0,
                        frequency_spacing="2i/d"):
    """The sinusoidal table, `(length, depth)` float32, interleaved as in the paper.

        PE(pos, 2i)   = sin(pos / base^(2i / depth))
        PE(pos, 2i+1) = cos(pos / base^(2i / depth))

    Each pair of columns is a rotation at its own frequency, so PE(pos + k)
    is a linear function of PE(pos) for any fixed offset k: the property the
    authors hoped would let attention work with relative positions.

    The other choices (`COLUMN_ORDERS`, `FREQUENCY_SPACINGS`) give the same
    kind of table for a model trained with it: `columns="blocked"` puts the
    same columns in another order, the sines (columns 2i) first and then the
    cosines (2i+1), the same information, but a model learns its weights for
    one order only; `first_position` numbers the first row; and
    `frequency_spacing="i/(d/2-1)"` spaces the frequencies from 1 down to
    exactly 1/base.

    Example:
    >>> positional_encoding(length=2, depth=4)[1]
    array([0.841471, 0.540302, 0.0099998, 0.99995], dtype=float32)
    >>> positional_encoding(length=2, depth=4, columns="blocked")[1]
    array([0.841471, 0.0099998, 0.540302, 0.99995], dtype=float32)
    """
    if int(length) < 1 or int(depth) < 1:
        raise ValueError(f"length and depth must be positive, got length={length}, depth={depth}")
    if base <= 0:
        raise ValueError(f"base must be positive, got {base}")
    check_sinusoid(columns, first_position, frequency_spacing)
    positions = np.arange(first_position, first_position + length, dtype=np.float64)
    if frequency_spacing == "i/(d/2-1)":
        table = _spaced_to_base(positions, depth, base)
        return table if columns == "blocked" else table[:, np.argsort(blocked_order(depth))]
    pair_index = np.arange(depth, dtype=np.float64)[None, :] // 2  # i for columns 2i and 2i+1
    angles = positions[:, None] / np.power(base, 2.0 * pair_index / depth)
    table = np.where(np.arange(depth) % 2 == 0, np.sin(angles), np.cos(angles))
    if columns == "blocked":
        table = table[:, blocked_order(depth)]
    return table.astype(np.float32)


# The tables that had names before their choices did (a layer saved then keeps its numbers).
NAMED_TABLES = {
    "interleaved": {},
    "halves": {"columns": "blocked"},
    "fairseq": {"columns": "blocked", "first_position": 2, "frequency_spacing": "i/(d/2-1)"},
}


def _positions_for(inputs, start_index):
    length = ops.shape(inputs)[1]
    return ops.arange(length) + start_index


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionalEncoding(Hyperparameters, keras.layers.Layer):
    """Adds the fixed sinusoidal encoding to a sequence (Section 3.5).

    Args:
        max_length: the longest sequence (plus decoding offset) supported.
        base: the wavelength base, 10000 in the paper.
        columns, first_position, frequency_spacing: the paper's table by
            default; a checkpoint's own otherwise (see `positional_encoding`).

    Call arguments:
        inputs: `(batch, length, depth)`.
        start_index: position of the first row (an int or scalar tensor).

    Returns:
        `inputs + PE[start_index : start_index + length]`, same shape and dtype.
        The input's Keras mask passes through.

    Example:
    >>> PositionalEncoding(max_length=128)(keras.ops.zeros((2, 10, 64))).shape
    (2, 10, 64)
    """

    hyperparameters = ("max_length", "base", "columns", "first_position", "frequency_spacing")

    def __init__(self, max_length=2048, base=10000.0, columns="interleaved", first_position=0,
                 frequency_spacing="2i/d", **kwargs):
        super().__init__(**kwargs)
        check_positive_int(max_length=max_length)
        self.store_hyperparameters(locals())
        self.supports_masking = True

    @classmethod
    def from_config(cls, config):
        if "layout" in config:  # saved before the table's choices were named one by one
            config = {**{key: value for key, value in config.items() if key != "layout"},
                      **NAMED_TABLES[config["layout"]]}
        return super().from_config(config)

    def build(self, inputs_shape):
        depth = inputs_shape[-1]
        static_length = inputs_shape[1]
        if static_length is not None and static_length > self.max_length:
            raise ValueError(f"sequence length {static_length} exceeds max_length={self.max_length}")
        # A NumPy constant, not a weight: nothing to train and nothing to save.
        # It becomes a tensor inside `call`, so that a layer built inside one
        # tf.function (say, the first step of `fit`) works in every other.
        self.encoding = positional_encoding(self.max_length, depth, self.base, self.columns, self.first_position,
                                            self.frequency_spacing)

    def call(self, inputs, start_index=0):
        positions = _positions_for(inputs, start_index)
        encoding = ops.take(ops.convert_to_tensor(self.encoding), positions, axis=0)
        return inputs + ops.cast(encoding, inputs.dtype)[None]

    def compute_output_shape(self, inputs_shape):
        return inputs_shape


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionEmbedding(Hyperparameters, keras.layers.Layer):
    """Adds a learned vector per position (Section 3.5, the alternative).

    Args:
        max_length: number of positions that get a vector.
        initializer: initializer of the `(max_length, depth)` table.

    Call arguments:
        inputs: `(batch, length, depth)`.
        start_index: position of the first row.

    Returns:
        `inputs + table[start_index : start_index + length]`.

    Example:
    >>> PositionEmbedding(max_length=128)(keras.ops.zeros((2, 10, 64))).shape
    (2, 10, 64)
    """

    hyperparameters = ("max_length", "initializer")

    def __init__(self, max_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        check_positive_int(max_length=max_length)
        self.store_hyperparameters(locals())
        self.initializer = keras.initializers.get(initializer)
        self.supports_masking = True

    def build(self, inputs_shape):
        static_length = inputs_shape[1]
        if static_length is not None and static_length > self.max_length:
            raise ValueError(f"sequence length {static_length} exceeds max_length={self.max_length}")
        self.position_embeddings = self.add_weight(
            name="position_embeddings",
            shape=(self.max_length, inputs_shape[-1]),
            initializer=self.initializer,
        )

    def call(self, inputs, start_index=0):
        positions = _positions_for(inputs, start_index)
        return inputs + ops.take(self.position_embeddings, positions, axis=0)[None]

    def compute_output_shape(self, inputs_shape):
        return inputs_shape
