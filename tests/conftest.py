"""Test setup, on the Keras backend that KERAS_BACKEND names (TensorFlow by default).

On TensorFlow: two logical CPU devices, so MirroredStrategy has replicas to
mirror. TensorFlow fixes its devices when it first initialises, so this runs
at import time, before any test touches a tensor. On JAX and PyTorch
TensorFlow is never imported, and tests marked `tensorflow` (what is
TensorFlow by nature: graphs, tapes, strategies) are skipped.
"""

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402

ON_TENSORFLOW = keras.backend.backend() == "tensorflow"

if ON_TENSORFLOW:
    import tensorflow as tf

    _cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )


# The files that take longest on each backend (docs/tests.md, "Where the time goes"), longest
# first. `make test` hands whole files to two xdist workers in collection order: starting the long
# ones first keeps a worker from starting one of them when the other has nothing left to do.
LONGEST_FILES = {
    "tensorflow": (
        "test_litert.py",
        "test_multi_worker.py",
        "test_pretrained.py",
        "test_search.py",
        "test_run_directory.py",
        "test_publish.py",
        "test_ctranslate2.py",
        "test_export.py",
        "test_sentencepiece_run.py",
        "test_web.py",
    ),
    # `make test`'s second part: the layer and model files on JAX.
    "jax": ("test_transformer.py", "test_attention.py", "test_layers.py", "test_classifier.py"),
}.get(keras.backend.backend(), ())


def _longest_first(item):
    name = item.path.name
    return LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_longest_first)  # stable: each file's own tests keep their order
    if ON_TENSORFLOW:
        return
    skip = pytest.mark.skip(reason=f"TensorFlow by nature; this run uses the {keras.backend.backend()} backend")
    for item in items:
        if "tensorflow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_autograd_on_torch(request):
    """On PyTorch, outputs compared with NumPy must not track gradients (they could not become arrays).

    Tests that `fit` (marked `trains`) and `gradients()` turn autograd on where they need it.
    """
    if keras.backend.backend() != "torch" or "trains" in request.keywords:
        yield
        return
    import torch

    with torch.no_grad():
        yield


@pytest.fixture(autouse=True)
def _seed_and_policy():
    """Every test starts from the same seed and the float32 policy."""
    keras.utils.set_random_seed(1234)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture(scope="session")
def mirrored_strategy():
    """One MirroredStrategy over the two logical CPUs, shared by every test.

    Several MirroredStrategy objects in one process can hand out clashing
    collective-op keys; sharing one avoids that.
    """
    from keras_transformer.training.distribution import mirrored_strategy

    return mirrored_strategy(tuple(device.name for device in tf.config.list_logical_devices("CPU")[:2]))


def built_once(tmp_path_factory, name, build):
    """A directory that `build(directory)` fills once per test session, shared by every xdist worker.

    The first worker to ask builds it under a file lock in the session's
    temporary directory (the parent of each worker's own); the others wait and
    reuse it. What `build` returns is kept beside it as JSON and returned to
    each. Tests read what is there: a test that changes it works on a copy.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    directory, done = root / "built-once" / name, root / "built-once" / f"{name}.json"
    done.parent.mkdir(exist_ok=True)
    with open(root / "built-once" / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)  # a build that failed halfway
            directory.mkdir()
            done.write_text(json.dumps(build(directory)))
    return directory, json.loads(done.read_text())


@pytest.fixture(scope="session")
def trained_demo_run(tmp_path_factory):
    """A small translator trained by the `train` command on the demo corpus, once per session.

    One device, float32 (`fine_tuned_marian` proves the command mirrored); half a
    minute of training is enough for translations that differ from sentence to
    sentence. Shared by the CLI, export, CTranslate2, LiteRT and explorer tests
    (read-only: a test that writes into it works on a copy). Returns
    `(run_directory, train_stdout)`.
    """

    def train(directory):
        from helpers import cli_here

        result = cli_here(
            "train", "--dataset", "demo", "--out", directory / "demo", "--epochs", 1, "--steps-per-epoch", 100,
            "--warmup-steps", 100, "--limit-train", 3000, "--limit-val", 40,
            "--num-layers", 2, "--d-model", 64, "--num-heads", 2, "--d-ff", 128,
            # One sample's attention maps (drawing each sample's heatmaps at the end takes seconds); no
            # per-epoch BLEU samples, which no test reads (test_tensorboard.py proves them).
            "--attention-samples", 1, "--bleu-samples", 0,
            # float32 on every CPU: CTranslate2 (float32 on a CPU) must translate exactly as it does.
            "--precision", "float32",
            # The demo recipe averages its weights over ~100 steps (ema_momentum 0.99): over 100 steps in
            # all, the average is mostly the half-trained model's; ~10 steps suit a run this short.
            "--ema-momentum", 0.9,
        )
        return result.stdout

    directory, stdout = built_once(tmp_path_factory, "demo", train)
    return Path(directory) / "demo", stdout


@pytest.fixture(scope="session")
def trained_language_model_run(tmp_path_factory):
    """A tiny language model trained by `train-lm` on the demo corpus's English side, once per session.

    A window of 24 tokens, two epochs, one prompt's attention for the Attention
    tab. Shared by the command-line and export tests (read-only). Returns
    `(run_directory, train_stdout)`.
    """

    def train(directory):
        from helpers import TINY_MODEL, cli_here
        from keras_transformer.data import demo_corpus

        texts = directory / "texts.txt"
        texts.write_text("\n".join(source for source, _ in demo_corpus()["train"][:3000]) + "\n", encoding="utf-8")
        result = cli_here(
            "train-lm", "--text", texts, "--out", directory / "lm", *TINY_MODEL, "--vocab-size", 300,
            "--max-length", 24, "--batch-size", 16, "--epochs", 2, "--warmup-steps", 50, "--attention-samples", 1,
        )
        return result.stdout

    directory, stdout = built_once(tmp_path_factory, "language-model", train)
    return Path(directory) / "lm", stdout


# LiteRT exports of the session's runs, shared by test_litert.py and test_on_device.py.


@pytest.fixture(scope="session")
def litert_exports(trained_demo_run, tmp_path_factory):
    """The demo run exported once per session: float32 greedy and beam 4, int8 and float16 greedy; and
    as builtin files (`--ops builtin`), float32 greedy and beam 4 and int8 greedy (`builtin-greedy`, ...)."""
    from keras_transformer.runs import translation

    run, _ = trained_demo_run

    def export(directory):
        for name, beam_size, quantization in (("greedy", 1, None), ("beam", 4, None), ("int8", 1, "int8"),
                                              ("float16", 1, "float16")):
            translation.export_litert(str(run), str(directory / name), quantization=quantization, beam_size=beam_size)
        for name, beam_size, quantization in (("greedy", 1, None), ("beam", 4, None), ("int8", 1, "int8")):
            translation.export_litert(str(run), str(directory / f"builtin-{name}"), quantization=quantization,
                                      beam_size=beam_size, ops="builtin")
        return {}

    directory, _ = built_once(tmp_path_factory, "litert", export)
    return run, Path(directory)


@pytest.fixture(scope="session")
def classifier_exports(tmp_path_factory):
    """A tiny lowercasing classifier trained on 400 labelled reviews by `train-classifier`, and its LiteRT
    exports (float32): `litert` (by the console script) and `builtin` (`--ops builtin`). Returns the
    directory and what the commands printed (`train_stdout`, and the export's `stdout`, `stderr`)."""

    def train(directory):
        from helpers import ENV, cli_here
        from test_classifier_run import write_reviews

        from keras_transformer.runs import classification

        write_reviews(directory / "reviews.csv", 400, seed=0)
        # In this process; no attention or projector samples each epoch, which no test of it reads
        # (test_classifier_run.py and test_attention_explorer.py prove them).
        trained = cli_here("train-classifier", "--dataset", f"csv:{directory / 'reviews.csv'}", "--out",
                           directory / "run", "--epochs", 1, "--vocab-size", 80, "--num-layers", 1, "--d-model", 16,
                           "--num-heads", 2, "--d-ff", 32, "--max-length", 16, "--attention-samples", 0,
                           "--projector-samples", 0)
        # The command a user runs (the installed console script), in a process of its own: what it
        # prints is proved below.
        exported = subprocess.run([str(Path(sys.executable).with_name("keras-transformer")), "export",
                                   str(directory / "run"), str(directory / "litert"), "--format", "litert"],
                                  capture_output=True, text=True, env=ENV, timeout=600, check=True)
        classification.export_litert(str(directory / "run"), str(directory / "builtin"), ops="builtin")
        return {"stdout": exported.stdout, "stderr": exported.stderr, "train_stdout": trained.stdout}

    directory, printed = built_once(tmp_path_factory, "litert-classifier", train)
    return Path(directory), printed


@pytest.fixture(scope="session")
def language_model_export(trained_language_model_run, tmp_path_factory):
    """The language model's LiteRT exports: `(run, the text file's directory)`; `builtin` beside it."""
    run, _ = trained_language_model_run

    def export(directory):
        from keras_transformer.runs import language_model

        language_model.export_litert(str(run), str(directory / "litert"))
        language_model.export_litert(str(run), str(directory / "builtin"), ops="builtin")
        return {}

    directory, _ = built_once(tmp_path_factory, "litert-language-model", export)
    return run, Path(directory) / "litert"


@pytest.fixture(scope="session")
def sentencepiece_run(tmp_path_factory):
    """A tiny demo translator on a shared BPE vocabulary, trained by the `train` command once per session: its run directory.

    Trained in mixed bfloat16, what `--precision auto` picks on a CPU with
    native bfloat16 (on another, bfloat16 is emulated: slower, the same
    numbers); every road reads it in float32 (test_ctranslate2.py proves so).
    Two layers of width 64, 100 steps: translations that differ from
    sentence to sentence. Read-only.
    """

    def train(directory):
        from helpers import cli_here

        cli_here(
            "train", "--dataset", "demo", "--out", directory / "run", "--tokenizer", "sentencepiece",
            "--sentencepiece-model", "bpe", "--vocab-size", 500, "--shared-vocab", "--epochs", 1,
            "--steps-per-epoch", 100, "--warmup-steps", 100, "--limit-train", 3000, "--limit-val", 20,
            "--num-layers", 2, "--d-model", 64, "--num-heads", 2, "--d-ff", 128, "--attention-samples", 0,
            "--precision", "mixed_bfloat16", "--ema-momentum", 0.9,
            "--no-evaluate",  # test_sentencepiece_run evaluates the run itself
        )
        return {}

    directory, _ = built_once(tmp_path_factory, "sentencepiece-run", train)
    return Path(directory) / "run"


@pytest.fixture(scope="session")
def fine_tuned_marian(tmp_path_factory):
    """The marian-shared-swish fixture imported by `import-hf`, then fine-tuned by `train --init-from` on 160
    Multi30k pairs, mirrored over the suite's two logical CPUs, once per session: `(imported run, fine-tuned run)`."""

    def build(directory):
        from helpers import DATA, cli_here

        cli_here("import-hf", Path(__file__).parent / "fixtures" / "pretrained" / "marian-shared-swish",
                 directory / "imported")
        english, german = ((DATA / "multi30k" / name).read_text(encoding="utf-8").splitlines()[2000:2160]
                           for name in ("train.en", "train.de"))
        pairs = directory / "pairs.tsv"
        pairs.write_text("".join(f"{source}\t{target}\n" for source, target in zip(english, german)), encoding="utf-8")
        cli_here("train", "--init-from", directory / "imported", "--dataset", "files", "--train-tsv", pairs,
                 "--epochs", "2", "--batch-size", "16", "--learning-rate-scale", "0.1", "--warmup-steps", "10",
                 # Mirrored over the suite's two logical CPUs, as a user's GPUs would be.
                 "--strategy", "mirrored", "--attention-samples", "0", "--bleu-samples", "0", "--no-evaluate",
                 "--out", directory / "fine-tuned")
        return {}

    directory, _ = built_once(tmp_path_factory, "fine-tuned-marian", build)
    return Path(directory) / "imported", Path(directory) / "fine-tuned"
