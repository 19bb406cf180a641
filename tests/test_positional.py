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


def test_a_checkpoints_sinusoid_choices_give_the_formulas_they_name():
    paper = kt.layers.positional_encoding(length=6, depth=8)
    # Blocked: the same columns, every sine before every cosine.
    blocked = kt.layers.positional_encoding(length=6, depth=8, columns="blocked")
    np.testing.assert_array_equal(blocked, paper[:, [0, 2, 4, 6, 1, 3, 5, 7]])
    # A first position of 2: the paper's rows from 2 on.
    np.testing.assert_allclose(kt.layers.positional_encoding(length=4, depth=8, first_position=2), paper[2:], atol=1e-6)
    # Frequencies base^(-i / (d/2 - 1)): the last is exactly 1/base.
    spaced = kt.layers.positional_encoding(length=6, depth=8, base=100.0, frequency_spacing="i/(d/2-1)")
    positions = np.arange(6)
    np.testing.assert_allclose(spaced[:, 6], np.sin(positions / 100.0), atol=1e-6)
    np.testing.assert_allclose(spaced[:, 7], np.cos(positions / 100.0), atol=1e-6)
    with pytest.raises(ValueError, match="columns must be one of"):
        kt.layers.positional_encoding(length=2, depth=4, columns="halves")


@pytest.mark.parametrize("name, choices", [
    ("sinusoidal_halves", {"columns": "blocked"}),
    ("sinusoidal_fairseq", {"columns": "blocked", "first_position": 2, "frequency_spacing": "i/(d/2-1)"}),
])
def test_a_run_saved_when_sinusoids_had_names_keeps_its_table(name, choices):
    # Imported runs made before the choices were named one by one stored these names in their configs.
    old = kt.layers.TokenAndPositionEmbedding(30, 8, 12, position=name)
    new = kt.layers.TokenAndPositionEmbedding(30, 8, 12, position=choices)
    old.build((None, None)), new.build((None, None))
    np.testing.assert_array_equal(old.position_embedding.encoding, new.position_embedding.encoding)
    layout = {"sinusoidal_halves": "halves", "sinusoidal_fairseq": "fairseq"}[name]
    saved = kt.layers.PositionalEncoding.from_config({"max_length": 12, "base": 10000.0, "layout": layout})
    saved.build((None, None, 8))
    np.testing.assert_array_equal(saved.encoding, new.position_embedding.encoding)
