"""The same weights give the same outputs on TensorFlow, JAX and PyTorch.

Models are built and saved here (on TensorFlow, the reference), then loaded
in a fresh process on each other installed backend by `backend_outputs.py`:
logits, attention scores and cached decoding must agree within 1e-4 in
float32. On JAX and PyTorch the full pass takes the fused attention kernel
(no one asks for weights), so this also checks that path against
TensorFlow's explicit one.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import backend_outputs
import keras_transformer as kt

HERE = Path(__file__).parent
OTHER_BACKENDS = [name for name in ("jax", "torch") if importlib.util.find_spec(name) is not None]
SIZES = dict(num_layers=2, d_model=32, num_heads=4, d_ff=64, max_length=24, dropout=0.1)


def token_ids(batch, length, vocab, seed, real_lengths):
    ids = np.random.default_rng(seed).integers(3, vocab, size=(batch, length)).astype("int32")
    for row, real in enumerate(real_lengths):
        ids[row, real:] = 0  # padding
    return ids


def models():
    """Each model a user builds, with inputs that have padding."""
    source = token_ids(3, 9, 40, 1, (9, 5, 2))
    target = token_ids(3, 7, 40, 2, (7, 7, 7))
    tokens = token_ids(3, 10, 40, 3, (10, 6, 3))
    translator = dict(src_vocab_size=40, tgt_vocab_size=40, **SIZES)
    yield "post_ln", kt.models.Transformer(**translator), {"source": source, "target": target}
    yield "pre_ln_learned_tied", kt.models.Transformer(
        **translator, norm_first=True, position="learned", share_embeddings=True, tie_output=True
    ), {"source": source, "target": target}
    yield "local_windows", kt.models.Transformer(**translator, sliding_window=2, cross_attention_window=2), {
        "source": source, "target": target}
    for pooling in ("cls", "attention"):
        yield f"classifier_{pooling}", kt.models.TransformerClassifier(
            vocab_size=40, num_classes=3, pooling=pooling, **SIZES), {"tokens": tokens}
    yield "masked_lm", kt.models.MaskedLanguageModel(vocab_size=40, **SIZES), {
        "tokens": tokens, "positions": np.array([[0, 4], [1, 5], [0, 2]], "int32")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The saved models, and their outputs reloaded on TensorFlow (in this process)."""
    models_dir = tmp_path_factory.mktemp("models")
    for name, model, inputs in models():
        model((inputs["source"], inputs["target"]) if "source" in inputs else inputs["tokens"])
        model.save(models_dir / f"{name}.keras")
        np.savez(models_dir / f"{name}.inputs.npz", **inputs)
    backend_outputs.main(models_dir, models_dir / "tensorflow.npz")
    return models_dir, dict(np.load(models_dir / "tensorflow.npz"))


def outputs_on(backend, models_dir, out):
    environment = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    if backend == "jax":
        # JAX compiles each op it runs eagerly; XLA's lowest optimisation level halves that time.
        environment["XLA_FLAGS"] = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    result = subprocess.run([sys.executable, HERE / "backend_outputs.py", models_dir, out], env=environment,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(np.load(out))


@pytest.mark.slow
@pytest.mark.tensorflow  # TensorFlow is the reference the others are compared with
@pytest.mark.parametrize("backend", OTHER_BACKENDS)
def test_the_same_weights_give_the_same_outputs_on_every_backend(reference, backend, tmp_path):
    models_dir, expected = reference
    expected = dict(expected)
    found = outputs_on(backend, models_dir, tmp_path / f"{backend}.npz")
    assert str(found.pop("backend")) == backend
    assert not found.pop("imported_tensorflow"), f"importing keras_transformer on {backend} imported TensorFlow"
    expected.pop("imported_tensorflow"), expected.pop("backend")
    assert sorted(found) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(found[name], value, atol=1e-4, rtol=0, err_msg=name)
    # Cached decoding gives the full pass's logits, on the other backend too.
    for name in found:
        if name.endswith("/cached_logits"):
            np.testing.assert_allclose(found[name], found[name.replace("cached_logits", "logits")], atol=1e-4)


@pytest.mark.slow  # a process on another backend
@pytest.mark.skipif(not OTHER_BACKENDS, reason="no other Keras backend installed")
def test_tensorflow_only_parts_say_so_in_one_line_on_another_backend(tmp_path):
    backend = OTHER_BACKENDS[0]
    environment = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    script = "import keras_transformer as kt\ntry:\n    import keras_transformer.export\nexcept ImportError as error:\n    print(error)\n"
    result = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and "runs on TensorFlow" in lines[0] and backend in lines[0], result.stdout

    # The command line sets the other backend aside, says so, and runs on TensorFlow.
    command = [Path(sys.executable).with_name("keras-transformer"), "translate", tmp_path / "no-run", "Hallo."]
    environment.pop("TF_CPP_MIN_LOG_LEVEL")  # as a user runs it: quiet by itself
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 2, result.stderr[-3000:]
    assert f"KERAS_BACKEND={backend} is set aside" in lines[0] and lines[1].startswith("keras-transformer: error:")
