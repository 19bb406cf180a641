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


# How the sines and cosines share the depth axis: the paper's pairs, or
# every sine first and then every cosine (Marian's layout, which Hugging
# Face's OPUS-MT checkpoints were trained with), or fairseq's table (M2M100, NLLB).
LAYOUTS = ("interleaved", "halves", "fairseq")
# fairseq numbers positions from its padding id + 1 = 2: the first token is at position 2.
FAIRSEQ_FIRST_POSITION = 2


def fairseq_positional_encoding(length, depth, base=10000.0):
    """fairseq's (tensor2tensor's) table, as M2M100 and NLLB were trained with, from their first position on.

    Sines then cosines like Marian's, but the i-th of the depth/2
    frequencies is base^(-i / (depth/2 - 1)) (the paper's is
    base^(-2i / depth)), and the first token is at position 2. Computed in
    float32 as fairseq and Hugging Face compute it, so that a checkpoint sees
    the very numbers it was trained with.
    """
    half = depth // 2
    step = np.float32(np.log(base) / (half - 1))
    frequencies = np.exp(np.arange(half, dtype=np.float32) * -step)
    positions = np.arange(FAIRSEQ_FIRST_POSITION, FAIRSEQ_FIRST_POSITION + length, dtype=np.float32)
    angles = positions[:, None] * frequencies[None, :]
    table = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    if depth % 2:
        table = np.concatenate([table, np.zeros((length, 1), np.float32)], axis=1)
    return table.astype(np.float32)


def halves_order(depth):
    """The "halves" layout's columns as the interleaved table's: the sines (columns 2i), then the cosines (2i+1)."""
    return np.concatenate([np.arange(0, depth, 2), np.arange(1, depth, 2)])


def positional_encoding(length, depth, base=10000.0, layout="interleaved"):
    """The sinusoidal table, `(length, depth)` float32, interleaved as in the paper.

        PE(pos, 2i)   = sin(pos / base^(2i / depth))
        PE(pos, 2i+1) = cos(pos / base^(2i / depth))

    Each pair of columns is a rotation at its own frequency, so PE(pos + k)
    is a linear function of PE(pos) for any fixed offset k: the property the
    authors hoped would let attention work with relative positions.

    `layout="halves"` puts the same columns in another order, the sines
    (columns 2i) first and then the cosines (2i+1): the same information,
    but a model learns its weights for one order only.

    Example:
    >>> positional_encoding(length=2, depth=4)[1]
    array([0.841471, 0.540302, 0.0099998, 0.99995], dtype=float32)
    >>> positional_encoding(length=2, depth=4, layout="halves")[1]
    array([0.841471, 0.0099998, 0.540302, 0.99995], dtype=float32)
    """
    if int(length) < 1 or int(depth) < 1:
        raise ValueError(f"length and depth must be positive, got length={length}, depth={depth}")
    if base <= 0:
        raise ValueError(f"base must be positive, got {base}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "fairseq":
        return fairseq_positional_encoding(length, depth, base)
    positions = np.arange(length, dtype=np.float64)[:, None]
    pair_index = np.arange(depth, dtype=np.float64)[None, :] // 2  # i for columns 2i and 2i+1
    angles = positions / np.power(base, 2.0 * pair_index / depth)
    table = np.where(np.arange(depth) % 2 == 0, np.sin(angles), np.cos(angles))
    if layout == "halves":
        table = table[:, halves_order(depth)]
    return table.astype(np.float32)


def _positions_for(inputs, start_index):
    length = ops.shape(inputs)[1]
    return ops.arange(length) + start_index


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionalEncoding(Hyperparameters, keras.layers.Layer):
    """Adds the fixed sinusoidal encoding to a sequence (Section 3.5).

    Args:
        max_length: the longest sequence (plus decoding offset) supported.
        base: the wavelength base, 10000 in the paper.
        layout: "interleaved" (the paper's), "halves" (Marian's) or
            "fairseq" (M2M100's and NLLB's), see `positional_encoding`.

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

    hyperparameters = ("max_length", "base", "layout")

    def __init__(self, max_length=2048, base=10000.0, layout="interleaved", **kwargs):
        super().__init__(**kwargs)
        check_positive_int(max_length=max_length)
        self.store_hyperparameters(locals())
        self.supports_masking = True

    def build(self, inputs_shape):
        depth = inputs_shape[-1]
        static_length = inputs_shape[1]
        if static_length is not None and static_length > self.max_length:
            raise ValueError(f"sequence length {static_length} exceeds max_length={self.max_length}")
        # A NumPy constant, not a weight: nothing to train and nothing to save.
        # It becomes a tensor inside `call`, so that a layer built inside one
        # tf.function (say, the first step of `fit`) works in every other.
        self.encoding = positional_encoding(self.max_length, depth, self.base, self.layout)

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
