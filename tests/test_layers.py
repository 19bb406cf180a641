"""Every layer: output shapes, config round trips, masks, argument errors."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_transformer as kt

BATCH, SOURCE_LENGTH, TARGET_LENGTH, D_MODEL = 2, 7, 5, 16
STACK = dict(num_layers=2, vocab_size=30, d_model=D_MODEL, num_heads=4, d_ff=32, max_length=20)


def hidden(length, seed=0):
    return np.random.default_rng(seed).normal(size=(BATCH, length, D_MODEL)).astype("float32")


def ids(length, seed=0, vocab=30):
    return np.random.default_rng(seed).integers(1, vocab, size=(BATCH, length)).astype("int32")


# (layer, call arguments, expected output shape)
CASES = {
    "MultiHeadAttention": (
        lambda: kt.layers.MultiHeadAttention(num_heads=4),
        lambda: (hidden(TARGET_LENGTH), hidden(SOURCE_LENGTH, 1)),
        (BATCH, TARGET_LENGTH, D_MODEL),
    ),
    "PositionalEncoding": (lambda: kt.layers.PositionalEncoding(max_length=20), lambda: (hidden(5),), (BATCH, 5, D_MODEL)),
    "PositionEmbedding": (lambda: kt.layers.PositionEmbedding(max_length=20), lambda: (hidden(5),), (BATCH, 5, D_MODEL)),
    "TokenAndPositionEmbedding": (
        lambda: kt.layers.TokenAndPositionEmbedding(30, D_MODEL, 20, position="learned", dropout=0.1),
        lambda: (ids(6),),
        (BATCH, 6, D_MODEL),
    ),
    "FeedForward": (lambda: kt.layers.FeedForward(D_MODEL, 64), lambda: (hidden(5),), (BATCH, 5, D_MODEL)),
    "AttentionSublayer": (
        lambda: kt.layers.AttentionSublayer(num_heads=4, causal=True),
        lambda: (hidden(5),),
        (BATCH, 5, D_MODEL),
    ),
    "FeedForwardSublayer": (lambda: kt.layers.FeedForwardSublayer(d_ff=64, norm_first=True), lambda: (hidden(5),), (BATCH, 5, D_MODEL)),
    "EncoderLayer": (lambda: kt.layers.EncoderLayer(num_heads=4, d_ff=32, sliding_window=2), lambda: (hidden(6),), (BATCH, 6, D_MODEL)),
    "DecoderLayer": (
        lambda: kt.layers.DecoderLayer(num_heads=4, d_ff=32, norm_first=True),
        lambda: (hidden(TARGET_LENGTH), hidden(SOURCE_LENGTH, 1)),
        (BATCH, TARGET_LENGTH, D_MODEL),
    ),
    "DecoderOnlyLayer": (
        lambda: kt.layers.DecoderLayer(num_heads=4, d_ff=32, cross_attention=False),
        lambda: (hidden(TARGET_LENGTH),),
        (BATCH, TARGET_LENGTH, D_MODEL),
    ),
    "Encoder": (lambda: kt.layers.Encoder(**STACK), lambda: (ids(SOURCE_LENGTH),), (BATCH, SOURCE_LENGTH, D_MODEL)),
    "Decoder": (
        lambda: kt.layers.Decoder(**STACK, norm_first=True, position="learned"),
        lambda: (ids(TARGET_LENGTH), hidden(SOURCE_LENGTH, 1)),
        (BATCH, TARGET_LENGTH, D_MODEL),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_shape(name):
    make_layer, make_inputs, expected = CASES[name]
    assert tuple(make_layer()(*make_inputs()).shape) == expected


@pytest.mark.parametrize("name", sorted(CASES))
def test_config_round_trip_gives_the_same_layer(name):
    make_layer, make_inputs, _ = CASES[name]
    layer = make_layer()
    inputs = make_inputs()
    outputs = layer(*inputs)
    config = layer.get_config()
    clone = layer.__class__.from_config(config)
    assert clone.get_config() == config
    # Same config + same weights = same function.
    clone(*inputs)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(clone(*inputs), outputs, atol=1e-6)
    # Registered under the package name, so Keras can find it by name.
    assert keras.saving.get_registered_name(layer.__class__) == f"keras_transformer>{layer.__class__.__name__}"


def test_token_embedding_scales_and_masks_padding():
    layer = kt.layers.TokenAndPositionEmbedding(30, D_MODEL, 20)
    token_ids = np.array([[4, 5, 0, 0]])
    outputs = layer(token_ids)
    np.testing.assert_array_equal(ops.convert_to_numpy(outputs._keras_mask), [[True, True, False, False]])
    table = ops.convert_to_numpy(layer.embeddings)
    expected = table[[4, 5, 0, 0]] * np.sqrt(D_MODEL) + kt.layers.positional_encoding(4, D_MODEL)
    np.testing.assert_allclose(outputs[0], expected, atol=1e-5)
    unscaled = kt.layers.TokenAndPositionEmbedding(30, D_MODEL, 20, scale=False, mask_zero=False)
    assert getattr(unscaled(token_ids), "_keras_mask", None) is None


def test_encoder_output_carries_the_padding_mask():
    encoder = kt.layers.Encoder(**STACK)
    token_ids = np.array([[3, 4, 5, 0], [6, 0, 0, 0]])
    outputs = encoder(token_ids)
    np.testing.assert_array_equal(ops.convert_to_numpy(outputs._keras_mask), token_ids != 0)


def test_encoder_layer_ignores_padding():
    layer = kt.layers.EncoderLayer(num_heads=4, d_ff=32)
    x = hidden(6)
    mask = np.array([[True] * 4 + [False] * 2] * BATCH)
    changed = x.copy()
    changed[:, 4:] = 50.0
    np.testing.assert_allclose(layer(x, mask=mask)[:, :4], layer(changed, mask=mask)[:, :4], atol=1e-5)


def test_pre_ln_stack_has_a_final_norm_and_post_ln_does_not():
    assert kt.layers.Encoder(**STACK, norm_first=True).final_norm is not None
    assert kt.layers.Encoder(**STACK).final_norm is None


@pytest.mark.parametrize("window", [None, 2])
@pytest.mark.parametrize("length", [1, 2])
def test_rows_sharing_a_source_row_read_it_once_as_copies_of_it_would(window, length):
    # A search's rows of one sentence (a beam search's beams) share its source: a decoding
    # step's outputs and cache are those of every row reading its own copy of the
    # cross-attention cache; padded source positions included.
    rows_per_source = 3
    layer = kt.layers.DecoderLayer(num_heads=4, d_ff=32, cross_attention_window=window)
    targets = np.random.default_rng(2).normal(size=(BATCH * rows_per_source, length, D_MODEL)).astype("float32")
    source = hidden(SOURCE_LENGTH, 1)
    source_mask = np.array([[True] * SOURCE_LENGTH, [True] * 4 + [False] * 3])
    copies = lambda values: np.repeat(values, rows_per_source, axis=0)  # noqa: E731
    own = tuple(np.random.default_rng(4).normal(size=(2, BATCH * rows_per_source, 4, 4, D_MODEL // 4)).astype("float32"))

    def decode(source, source_mask, queries_per_source=None):
        return layer.decode_step(targets, own, 1, layer.compute_cross_attention_cache(source), source_mask,
                                 queries_per_source=queries_per_source)

    layer(targets, copies(source))  # build
    with pytest.raises(ValueError, match="queries_per_source must be a positive integer, got 0"):
        decode(source, source_mask, queries_per_source=0)
    expected, expected_cache = decode(copies(source), copies(source_mask))
    # Told, or from the shapes: 6 rows on 2 sentences' source.
    for told in (rows_per_source, None):
        shared, shared_cache = decode(source, source_mask, told)
        np.testing.assert_allclose(ops.convert_to_numpy(shared), ops.convert_to_numpy(expected), atol=1e-5)
        for shared_part, expected_part in zip(shared_cache, expected_cache):
            np.testing.assert_allclose(ops.convert_to_numpy(shared_part), ops.convert_to_numpy(expected_part),
                                       atol=1e-6)
    # Each row reads its own sentence's source: a row given another sentence's would differ.
    swapped, _ = decode(source[::-1], source_mask[::-1])
    assert np.abs(ops.convert_to_numpy(swapped) - ops.convert_to_numpy(expected)).max() > 1e-3
    with pytest.raises(ValueError, match="decoding 6 rows on a source of 4 sentences: each sentence needs the same"):
        decode(np.concatenate([source, source]), np.concatenate([source_mask, source_mask]))


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="a graph with an unknown batch: TensorFlow's")
def test_a_traced_step_with_an_unknown_batch_reads_a_sentences_rows_from_the_shapes():
    # A caller that says nothing of its rows, traced for any batch: the shapes, known only when it
    # runs, say that 6 rows read a 2-sentence source, as queries_per_source=3 would.
    import tensorflow as tf

    layer = kt.layers.DecoderLayer(num_heads=4, d_ff=32)
    targets = np.random.default_rng(2).normal(size=(BATCH * 3, 1, D_MODEL)).astype("float32")
    source, source_mask = hidden(SOURCE_LENGTH, 1), np.array([[True] * SOURCE_LENGTH, [True] * 4 + [False] * 3])
    own = tuple(np.random.default_rng(4).normal(size=(2, BATCH * 3, 4, 4, D_MODEL // 4)).astype("float32"))
    layer(targets, np.repeat(source, 3, axis=0))  # build
    keys, values = layer.compute_cross_attention_cache(source)
    expected, _ = layer.decode_step(targets, own, 1, (keys, values), source_mask, queries_per_source=3)
    spec = lambda value: tf.TensorSpec([None, *value.shape[1:]], value.dtype)  # noqa: E731
    arguments = (targets, *own, keys, values, source_mask)
    traced = tf.function(lambda t, own_keys, own_values, k, v, m: layer.decode_step(t, (own_keys, own_values), 1,
                                                                                   (k, v), m)[0],
                         input_signature=[spec(np.asarray(value)) for value in arguments])
    np.testing.assert_allclose(traced(*arguments).numpy(), ops.convert_to_numpy(expected), atol=1e-5)


def test_decoder_layer_with_cross_attention_needs_the_encoder():
    layer = kt.layers.DecoderLayer(num_heads=4, d_ff=32)
    with pytest.raises(ValueError, match="encoder_outputs"):
        layer(hidden(3))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: kt.layers.Encoder(**{**STACK, "num_heads": 3}), r"d_model=16 is not divisible by num_heads=3"),
        (lambda: kt.layers.Encoder(**{**STACK, "num_layers": 0}), "num_layers must be a positive integer"),
        (lambda: kt.layers.Decoder(**{**STACK, "d_ff": -4}), "d_ff must be a positive integer"),
        (lambda: kt.layers.Decoder(**{**STACK, "vocab_size": 2.5}), "vocab_size must be a positive integer"),
        (lambda: kt.layers.TokenAndPositionEmbedding(30, 16, 20, position="rotary"), "position must be one of"),
        (lambda: kt.layers.TokenAndPositionEmbedding(30, 16, 20, position={"order": "blocked"}), "sinusoid choices are"),
        (lambda: kt.layers.TokenAndPositionEmbedding(30, 16, 20, position={"columns": "halves"}), "columns must be one of"),
        (lambda: kt.layers.EncoderLayer(num_heads=4, d_ff=32, dropout=1.0), r"dropout must be a number in \[0, 1\)"),
        (lambda: kt.layers.FeedForward(d_model=0, d_ff=4), "d_model must be a positive integer"),
        (lambda: kt.layers.sliding_window_mask(4, 4, window=0), "sliding window must be a positive integer"),
    ],
)
def test_bad_arguments_name_the_problem(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_masks():
    np.testing.assert_array_equal(kt.layers.causal_mask(3), np.tril(np.ones((3, 3), bool)))
    # Two new queries at positions 3 and 4 of a 5-long cache.
    np.testing.assert_array_equal(
        kt.layers.causal_mask(2, 5, offset=3), [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    )
    np.testing.assert_array_equal(
        kt.layers.sliding_window_mask(4, 4, window=1),
        [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]],
    )
    np.testing.assert_array_equal(
        kt.layers.sliding_window_mask(4, 4, window=1, causal=True),
        [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]],
    )
    merged = kt.layers.merge_attention_masks(
        3, 3, key_mask=np.array([[1, 1, 0]], bool), causal=True
    )
    assert tuple(merged.shape) == (1, 1, 3, 3)
    np.testing.assert_array_equal(merged[0, 0], [[1, 0, 0], [1, 1, 0], [1, 1, 0]])
    assert kt.layers.merge_attention_masks(3, 3) is None
