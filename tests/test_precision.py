"""Precision: `auto` picks what the hardware runs fastest; mixed float16 trains safely under MirroredStrategy."""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import training
from keras_transformer.training.precision import choose_precision, cpu_flags

pytestmark = pytest.mark.tensorflow


@pytest.mark.parametrize(
    "flags, gpus, expected",
    [
        ({"avx2", "fma"}, [], "float32"),  # AVX2 only: bfloat16 is emulated
        ({"avx2", "avx512f", "avx512bw", "avx512_vnni"}, [], "float32"),  # Skylake/Cascade Lake: AVX-512, no bfloat16
        ({"avx2", "avx512f", "avx512_bf16"}, [], "mixed_bfloat16"),  # Cooper Lake, Zen 4
        ({"avx2", "avx512f", "amx_bf16", "amx_tile"}, [], "mixed_bfloat16"),  # Sapphire Rapids
        ({"avx2"}, [(9, 0)], "mixed_bfloat16"),  # H100
        ({"avx2"}, [(8, 0), (8, 0)], "mixed_bfloat16"),  # A100s
        ({"avx512_bf16"}, [(7, 0)], "mixed_float16"),  # V100: the GPU decides, not the host CPU
        ({"avx2"}, [(8, 6), (7, 5)], "mixed_float16"),  # the oldest GPU sets the pace
    ],
)
def test_auto_picks_what_the_hardware_runs_fastest(flags, gpus, expected):
    policy, reason = choose_precision("auto", flags=flags, gpus=gpus)
    assert policy == expected and reason and "\n" not in reason


def test_an_explicit_precision_wins_and_a_wrong_one_is_named():
    assert choose_precision("float32", flags={"amx_bf16"}, gpus=[(9, 0)]) == ("float32", "as asked")
    assert choose_precision("mixed_bfloat16", flags={"avx2"}, gpus=[])[0] == "mixed_bfloat16"
    with pytest.raises(ValueError, match="precision must be one of"):
        choose_precision("float8")


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu avx2 avx512_bf16\n\n")
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "missing") == set()


# -- mixed float16 under MirroredStrategy -------------------------------------

SMALL = dict(src_vocab_size=12, tgt_vocab_size=12, num_layers=1, d_model=32, num_heads=2, d_ff=64, max_length=10,
             dropout=0.0)


def copy_batches(count, batch=16, length=8, seed=0):
    """Learn to copy sequences: a task whose loss falls quickly and smoothly."""
    rng = np.random.default_rng(seed)
    sequences = rng.integers(3, 12, size=(count * batch, length)).astype("int32")
    targets = np.concatenate([np.full((len(sequences), 1), 1, "int32"), sequences], axis=1)
    return (sequences, targets[:, :-1]), targets[:, 1:]


def train_in(precision, strategy, epochs=4):
    keras.config.set_dtype_policy(precision)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = kt.models.Transformer(**SMALL)
        model.build(((None, None), (None, None)))
        optimizer = training.FusedAdam(1e-2)
        model.compile(optimizer=optimizer, loss=training.MaskedSparseCrossEntropy(0.1))
        training.build_optimizer_variables(model)
    inputs, labels = copy_batches(12)
    history = model.fit(inputs, labels, batch_size=16, epochs=epochs, verbose=0, shuffle=False)
    return model, history.history["loss"]


@pytest.mark.slow
def test_mixed_float16_follows_the_mixed_bfloat16_loss_curve(mirrored_strategy):
    model, float16_losses = train_in("mixed_float16", mirrored_strategy)
    # Keras wraps our fused Adam in dynamic loss scaling.
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert isinstance(model.optimizer.inner_optimizer, training.FusedAdam)
    _, bfloat16_losses = train_in("mixed_bfloat16", mirrored_strategy)
    _, float32_losses = train_in("float32", mirrored_strategy)
    assert float16_losses[-1] < 0.75 * float16_losses[0], float16_losses  # it learns
    # float16 keeps 3 more mantissa bits than bfloat16: it is at least as close to float32.
    np.testing.assert_allclose(float16_losses, bfloat16_losses, rtol=0.05)
    np.testing.assert_allclose(float16_losses, float32_losses, rtol=0.05)


def test_an_overflowing_step_is_skipped_and_leaves_no_nan(mirrored_strategy):
    # A loss scale of 2^40 makes float16 gradients overflow to inf: the step
    # must be skipped, the scale halved, the weights left as they were.
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(0)
    with mirrored_strategy.scope():
        model = kt.models.Transformer(**SMALL)
        model.build(((None, None), (None, None)))
        inner = training.transformer_optimizer(d_model=32, warmup_steps=20)
        model.compile(optimizer=keras.optimizers.LossScaleOptimizer(inner, initial_scale=2.0**40),
                      loss=training.MaskedSparseCrossEntropy(0.1))
        training.build_optimizer_variables(model)
    before = [np.array(weight) for weight in model.get_weights()]
    inputs, labels = copy_batches(1)
    model.fit(inputs, labels, batch_size=16, epochs=1, verbose=0)
    after = model.get_weights()
    assert all(np.all(np.isfinite(weight)) for weight in after)
    for old, new in zip(before, after):
        np.testing.assert_array_equal(new, old)
    assert float(keras.ops.convert_to_numpy(model.optimizer.dynamic_scale)) == 2.0**39
    assert int(keras.ops.convert_to_numpy(model.optimizer.inner_optimizer.iterations)) == 0  # no update, so the schedule did not move
    # It recovers: halving until the gradients fit, then training.
    inputs, labels = copy_batches(30, seed=1)
    history = model.fit(inputs, labels, batch_size=16, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert float(keras.ops.convert_to_numpy(model.optimizer.dynamic_scale)) < 2.0**30
    assert int(keras.ops.convert_to_numpy(model.optimizer.inner_optimizer.iterations)) > 0
    assert all(np.all(np.isfinite(weight)) for weight in model.get_weights())


# -- inference computes in float32 by default -----------------------------------


def test_a_mixed_bfloat16_model_is_loaded_for_inference_in_float32(tmp_path):
    """`run_dir.load_trained_model`: model.keras, or the best checkpoint, in float32 unless asked otherwise."""
    from keras_transformer import saving
    from keras_transformer.runs import run_dir

    keras.config.set_dtype_policy("mixed_bfloat16")  # as in the process that trained it
    trained = kt.models.Transformer(**SMALL)
    trained.build(((None, None), (None, None)))
    saving.save_model(trained, str(tmp_path / run_dir.MODEL))
    (tmp_path / "checkpoints").mkdir()
    trained.save_weights(str(tmp_path / run_dir.BEST_CHECKPOINT))

    def build():
        model = kt.models.Transformer(**SMALL)
        model.build(((None, None), (None, None)))
        return model

    inputs = copy_batches(1)[0]
    loaded = run_dir.load_trained_model(tmp_path, build)
    assert {layer.compute_dtype for layer in loaded._flatten_layers()} == {"float32"}
    for ours, saved in zip(loaded.weights, trained.weights):
        assert ours.path == saved.path
        np.testing.assert_array_equal(ours.numpy(), saved.numpy())
    float32_logits = keras.ops.convert_to_numpy(loaded(inputs))
    assert float32_logits.dtype == np.float32
    as_saved = run_dir.load_trained_model(tmp_path, build, precision=None)
    assert as_saved.compute_dtype == "bfloat16"
    # bfloat16 keeps 8 bits of mantissa: the same model, roughly the same logits.
    np.testing.assert_allclose(keras.ops.convert_to_numpy(as_saved(inputs)).astype("float32"), float32_logits, atol=0.1)

    # A run still training (no model.keras yet): its checkpoint, in a model built in float32.
    (tmp_path / run_dir.MODEL).unlink()
    from_checkpoint = run_dir.load_trained_model(tmp_path, build)
    assert from_checkpoint.compute_dtype == "float32" and keras.config.dtype_policy().name == "mixed_bfloat16"
    np.testing.assert_allclose(keras.ops.convert_to_numpy(from_checkpoint(inputs)), float32_logits, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="precision must be one of"):
        run_dir.load_trained_model(tmp_path, build, precision="float8")
