"""Positional encodings: the paper's formula, and the layers that add it."""

import numpy as np
import pytest
from keras import ops

import keras_transformer as kt


def test_values_match_the_formula():
    table = kt.layers.positional_encoding(length=2, depth=4)
    assert table.dtype == np.float32 and table.shape == (2, 4)
    np.testing.assert_allclose(table[1], [0.841471, 0.540302, 0.0099998, 0.99995], atol=1e-6)
    np.testing.assert_allclose(table[0], [0, 1, 0, 1])


def test_nearby_positions_are_similar():
    table = kt.layers.positional_encoding(length=4, depth=4)
    unit = table / np.linalg.norm(table, axis=1, keepdims=True)
    np.testing.assert_allclose(unit[1:] @ unit[0], [0.770126, 0.291827, 0.004779], atol=1e-6)


def test_odd_depth_and_base():
    table = kt.layers.positional_encoding(length=3, depth=5, base=100.0)
    assert table.shape == (3, 5)
    np.testing.assert_allclose(table[2, 4], np.sin(2 / 100.0 ** (4 / 5)), atol=1e-6)


@pytest.mark.parametrize("bad", [dict(length=0, depth=4), dict(length=3, depth=0), dict(length=3, depth=4, base=0)])
def test_bad_sizes(bad):
    with pytest.raises(ValueError):
        kt.layers.positional_encoding(**bad)


def test_positional_encoding_adds_the_table_and_has_no_weights():
    layer = kt.layers.PositionalEncoding(max_length=20)
    x = np.random.default_rng(0).normal(size=(2, 6, 8)).astype("float32")
    outputs = layer(x)
    np.testing.assert_allclose(outputs - x, np.broadcast_to(kt.layers.positional_encoding(6, 8), (2, 6, 8)), atol=1e-6)
    assert layer.weights == []
    # start_index: positions 3..5, as a decoder needs for its later steps.
    np.testing.assert_allclose(layer(x[:, :3], start_index=3) - x[:, :3], np.broadcast_to(kt.layers.positional_encoding(6, 8)[3:], (2, 3, 8)), atol=1e-6)


def test_too_long_input_is_rejected():
    with pytest.raises(ValueError, match="exceeds max_length=4"):
        kt.layers.PositionalEncoding(max_length=4)(np.zeros((1, 5, 8), "float32"))
    with pytest.raises(ValueError, match="max_length must be a positive integer"):
        kt.layers.PositionEmbedding(max_length=0)


def test_learned_positions_are_trainable_and_offset():
    layer = kt.layers.PositionEmbedding(max_length=10)
    x = np.zeros((2, 4, 6), "float32")
    outputs = ops.convert_to_numpy(layer(x))
    table = ops.convert_to_numpy(layer.position_embeddings)
    assert layer.trainable_weights[0].shape == (10, 6)
    np.testing.assert_allclose(outputs[0], table[:4])
    np.testing.assert_allclose(layer(x[:, :2], start_index=5)[1], table[5:7])
