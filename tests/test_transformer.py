"""The encoder-decoder model: what a user relies on when training and decoding."""

import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from keras import ops

import keras_transformer as kt
from gradients import gradients

SMALL = dict(src_vocab_size=40, tgt_vocab_size=50, num_layers=2, d_model=32, num_heads=4, d_ff=64, max_length=24, dropout=0.0)


def token_ids(batch, length, vocab, seed):
    return np.random.default_rng(seed).integers(1, vocab, size=(batch, length)).astype("int32")


@pytest.fixture
def batch():
    return token_ids(3, 9, 40, seed=1), token_ids(3, 7, 50, seed=2)


VARIANTS = {
    "post_ln": {},
    "pre_ln_learned": dict(norm_first=True, position="learned"),
    "shared_tied": dict(src_vocab_size=50, share_embeddings=True, tie_output=True),
    "local_predictive_cross_attention": dict(cross_attention_window=2),
}


@pytest.fixture(params=sorted(VARIANTS))
def model(request):
    return kt.models.Transformer(**{**SMALL, **VARIANTS[request.param]})


def test_logits_shape_and_dtype(model, batch):
    logits = model(batch)
    assert tuple(logits.shape) == (3, 7, 50) and keras.backend.standardize_dtype(logits.dtype) == "float32"


def test_presets():
    base = kt.models.Transformer.from_preset("base", src_vocab_size=10, tgt_vocab_size=10)
    assert (base.num_layers, base.d_model, base.num_heads, base.d_ff, base.dropout) == (6, 512, 8, 2048, 0.1)
    big = kt.models.Transformer.from_preset("big", src_vocab_size=10, tgt_vocab_size=10)
    assert (big.num_layers, big.d_model, big.num_heads, big.d_ff, big.dropout) == (6, 1024, 16, 4096, 0.3)
    small = kt.models.Transformer.from_preset("small", src_vocab_size=10, tgt_vocab_size=10, dropout=0.2)
    assert (small.num_layers, small.d_model, small.num_heads, small.d_ff, small.dropout) == (3, 256, 8, 512, 0.2)
    assert kt.models.PRESETS["small"]["dropout"] == 0.1  # overrides leave the table alone


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: kt.models.Transformer.from_preset("huge", src_vocab_size=1, tgt_vocab_size=1), r"unknown preset 'huge'; choose one of \['base', 'big', 'small'\]"),
        (lambda: kt.models.Transformer.from_preset("small"), "needs src_vocab_size, tgt_vocab_size"),
        (lambda: kt.models.Transformer(**{**SMALL, "num_heads": 5}), "d_model=32 is not divisible by num_heads=5"),
        (lambda: kt.models.Transformer(**{**SMALL, "share_embeddings": True}), "src_vocab_size=40 differs from tgt_vocab_size=50"),
        (lambda: kt.models.Transformer(**{**SMALL, "d_model": 0}), "d_model must be a positive integer"),
    ],
)
def test_bad_arguments(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_decoder_is_causal(model, batch):
    source, target = batch
    logits = ops.convert_to_numpy(model((source, target)))
    for t in range(target.shape[1] - 1):
        changed = target.copy()
        changed[:, t + 1 :] = token_ids(3, target.shape[1] - t - 1, 50, seed=10 + t)
        changed_logits = ops.convert_to_numpy(model((source, changed)))
        np.testing.assert_allclose(changed_logits[:, : t + 1], logits[:, : t + 1], atol=1e-6)
        assert not np.allclose(changed_logits[:, t + 1 :], logits[:, t + 1 :], atol=1e-3)


def test_padding_changes_nothing_at_real_positions(model, batch):
    source, target = batch
    logits = model((source, target))
    padded_source = np.pad(source, ((0, 0), (0, 4)))
    np.testing.assert_allclose(model((padded_source, target)), logits, atol=1e-5)
    padded_target = np.pad(target, ((0, 0), (0, 3)))
    np.testing.assert_allclose(model((source, padded_target))[:, : target.shape[1]], logits, atol=1e-5)


def test_cross_attention_ignores_padded_source(model, batch):
    source, target = batch
    source = source.copy()
    source[0, 5:] = 0
    source[1, 2:] = 0
    _, scores = model((source, target), return_attention_scores=True)
    for layer in range(SMALL["num_layers"]):
        cross = ops.convert_to_numpy(scores[f"decoder/layer_{layer}/cross_attention"])
        assert np.all(cross[0, :, :, 5:] < 1e-9) and np.all(cross[1, :, :, 2:] < 1e-9)
        if model.cross_attention_window is None:
            np.testing.assert_allclose(cross.sum(-1), 1.0, atol=1e-5)
        else:  # local-p: the softmax's weights times a Gaussian of at most 1
            assert np.all(cross.sum(-1) <= 1.0 + 1e-5) and np.all(cross.sum(-1) > 0)


def test_attention_scores_for_every_layer(model, batch):
    source, target = batch
    logits, scores = model(batch, return_attention_scores=True)
    np.testing.assert_allclose(logits, model(batch), atol=1e-6)
    expected = {}
    for layer in range(SMALL["num_layers"]):
        expected[f"encoder/layer_{layer}/self_attention"] = (3, 4, 9, 9)
        expected[f"decoder/layer_{layer}/self_attention"] = (3, 4, 7, 7)
        expected[f"decoder/layer_{layer}/cross_attention"] = (3, 4, 7, 9)
    assert {name: tuple(value.shape) for name, value in scores.items()} == expected
    # Decoder self-attention is causal: nothing above the diagonal.
    assert np.all(np.triu(ops.convert_to_numpy(scores["decoder/layer_1/self_attention"]), k=1) == 0)


def test_cached_decoding_matches_the_full_pass(model, batch):
    source, target = batch
    full_logits = model((source, target))
    memory = model.encode(source)
    cache, source_state = model.build_cache(memory, max_length=12, encoder_padding_mask=kt.layers.padding_mask(source))
    step_logits = []
    for t in range(target.shape[1]):
        logits, cache = model.decode_step(target[:, t : t + 1], cache, t, source_state)
        step_logits.append(logits)
    np.testing.assert_allclose(ops.concatenate(step_logits, axis=1), full_logits, atol=1e-5)


@pytest.mark.tensorflow
def test_cached_decoding_in_a_tf_function(batch):
    """The decode loop of the translation work runs in graph mode on this cache."""
    model = kt.models.Transformer(**SMALL)
    source, target = batch
    full_logits = model((source, target))

    import tensorflow as tf

    @tf.function
    def decode_all(source, target):
        memory = model.encode(source)
        cache, source_state = model.build_cache(memory, target.shape[1], kt.layers.padding_mask(source))
        logits = tf.TensorArray(tf.float32, size=target.shape[1])
        for t in tf.range(target.shape[1]):
            step, cache = model.decode_step(target[:, t : t + 1], cache, t, source_state)
            logits = logits.write(t, step[:, 0])
        return tf.transpose(logits.stack(), [1, 0, 2])

    np.testing.assert_allclose(decode_all(source, target), full_logits, atol=1e-5)


def test_gradients_reach_every_trainable_weight(model, batch):
    source, target = batch
    model(batch)

    def loss():
        logits = model((source, target), training=True)
        return ops.mean(
            keras.losses.sparse_categorical_crossentropy(np.roll(target, -1, axis=1), logits, from_logits=True)
        )

    found = gradients(loss, model.trainable_variables)
    names = [variable.path for variable in model.trainable_variables]
    assert len(names) == len(set(names))
    for variable, gradient in zip(model.trainable_variables, found):
        assert gradient is not None, variable.path
        assert float(ops.max(ops.abs(ops.convert_to_tensor(gradient)))) > 0, variable.path


def test_shared_and_tied_weights_are_one_matrix():
    model = kt.models.Transformer(**{**SMALL, **VARIANTS["shared_tied"]})
    model((token_ids(2, 5, 50, 0), token_ids(2, 4, 50, 1)))
    embeddings = [v for v in model.trainable_variables if "embeddings" in v.path and "position" not in v.path]
    assert len(embeddings) == 1
    untied = kt.models.Transformer(**SMALL)
    untied((token_ids(2, 5, 40, 0), token_ids(2, 4, 50, 1)))
    assert len(model.trainable_variables) < len(untied.trainable_variables)


@pytest.mark.slow
def test_save_and_reload_in_a_fresh_process(tmp_path, batch):
    model = kt.models.Transformer(**{**SMALL, "dropout": 0.1, "norm_first": True, "tie_output": True})
    logits = model(batch)
    path = tmp_path / "model.keras"
    model.save(path)
    np.savez(tmp_path / "batch.npz", source=batch[0], target=batch[1], logits=ops.convert_to_numpy(logits))
    script = textwrap.dedent(
        f"""
        import keras, numpy as np
        import keras_transformer  # registers the layers: no custom_objects needed
        data = np.load({str(tmp_path / "batch.npz")!r})
        model = keras.saving.load_model({str(path)!r})
        logits = keras.ops.convert_to_numpy(model((data["source"], data["target"])))
        assert type(model).__name__ == "Transformer", type(model)
        np.testing.assert_array_equal(logits, data["logits"])
        print("identical")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "identical" in result.stdout


def test_save_and_reload_in_process(tmp_path, batch):
    model = kt.models.Transformer(**{**SMALL, **VARIANTS["shared_tied"]})
    source, target = token_ids(3, 9, 50, 1), batch[1]
    logits = model((source, target))
    model.save(tmp_path / "model.keras")
    reloaded = keras.saving.load_model(tmp_path / "model.keras")
    np.testing.assert_array_equal(ops.convert_to_numpy(reloaded((source, target))), ops.convert_to_numpy(logits))
    assert reloaded.get_config() == model.get_config()


def test_mixed_bfloat16_forward_is_finite_and_close(batch):
    reference = kt.models.Transformer(**SMALL)
    expected = ops.convert_to_numpy(reference(batch))
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = kt.models.Transformer(**SMALL)
    model(batch)
    model.set_weights(reference.get_weights())
    assert model.encoder.encoder_layers[0].self_attention.attention.compute_dtype == "bfloat16"
    assert all(v.dtype == "float32" for v in model.weights)
    logits, scores = model(batch, return_attention_scores=True)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    logits = ops.convert_to_numpy(logits)
    assert np.all(np.isfinite(logits))
    assert np.abs(logits - expected).max() < 0.1 * np.abs(expected).max()
    probabilities = ops.convert_to_numpy(ops.softmax(logits))
    assert np.mean(probabilities.argmax(-1) == expected.argmax(-1)) > 0.9
    assert all(np.all(np.isfinite(ops.convert_to_numpy(ops.cast(s, "float32")))) for s in scores.values())


@pytest.mark.slow  # fit traced for two replicas
@pytest.mark.tensorflow
def test_one_fit_step_under_mirrored_strategy(batch, mirrored_strategy):
    strategy = mirrored_strategy
    source, target = token_ids(8, 9, 40, 1), token_ids(8, 8, 50, 2)
    with strategy.scope():
        model = kt.models.Transformer(**SMALL)
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit((source, target[:, :-1]), target[:, 1:], batch_size=8, epochs=1, verbose=0)
    import tensorflow as tf

    assert all(isinstance(w.value, tf.distribute.DistributedValues) for w in model.trainable_weights)
    assert strategy.num_replicas_in_sync == 2
    assert np.isfinite(history.history["loss"][0])
    # One Adam step from the same initial weights as a single-device model.
    reference = kt.models.Transformer(**SMALL)
    reference((source, target[:, :-1]))
    assert all(not np.allclose(a, b) for a, b in zip(model.get_weights(), reference.get_weights()))
