"""Running the `keras-transformer` command as a user does: a real subprocess, or its entry function here.

`cli` starts a new process, for what a new process is the point of (the
installed entry point, kill -9 and SIGTERM, a fresh import). `cli_here` runs
the same command through `keras_transformer.cli.main` in the test's own
process, with the same exit status, stdout and stderr: no TensorFlow start-up
and no tracing again, for the command's logic (its rerun rules, refusals,
outputs).
"""

import contextlib
import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

CLI = [sys.executable, "-m", "keras_transformer.cli"]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
TINY_MODEL = ["--num-layers", "1", "--d-model", "32", "--num-heads", "2", "--d-ff", "64"]
# The shared data folder (Multi30k, SST-2, ...): read from, never copied into the repository.
DATA = Path(os.environ.get("KERAS_TRANSFORMER_DATA", Path(__file__).parents[2] / "shared" / "data"))


def read_sentences(spec):
    """The data folder's lines a recording names (`{"data": [[file, count], ...], "made": [...]}`), then its own."""
    lines = []
    for name, count in spec["data"]:
        lines += (DATA / name).read_text(encoding="utf-8").splitlines()[:count]
    return lines + spec["made"]


def cli(*arguments, input=None, check=True, timeout=600):
    return run([*CLI, *arguments], input=input, check=check, timeout=timeout)


def cli_here(*arguments, input=None, check=True):
    """`keras-transformer ARGUMENTS` run in this process: a `CompletedProcess` as `cli` returns.

    Its log lines go to its stderr, as the command's do (the command's own
    `logging.basicConfig` does nothing under pytest, whose handlers come first).
    """
    from keras_transformer import cli as command_line

    arguments = [str(part) for part in arguments]
    stdout, stderr = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    # TensorFlow warns when a Python function has been traced on most of its last calls, counting
    # every call in the process: here, the tests' before the command's. The command in a process of
    # its own never sees that history.
    handler.addFilter(lambda record: "triggered tf.function retracing" not in record.getMessage())
    root = logging.getLogger()
    saved_level, saved_stdin = root.level, sys.stdin
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    # Bytes are read as a file or a pipe gives them (the command reads stdin's bytes, `lines.read_lines`).
    sys.stdin = io.TextIOWrapper(io.BytesIO(input)) if isinstance(input, bytes) else io.StringIO(input or "")
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                status = command_line.main(arguments)
            except SystemExit as exit:  # argparse: --help, or a usage error
                status = exit.code if isinstance(exit.code, int) else 2
    finally:
        sys.stdin = saved_stdin
        root.removeHandler(handler)
        root.setLevel(saved_level)
    result = subprocess.CompletedProcess(arguments, status, stdout.getvalue(), stderr.getvalue())
    if check and status != 0:
        raise AssertionError(f"exit {status}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def run(command, input=None, check=True, timeout=600):
    result = subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, input=input, env=ENV, timeout=timeout
    )
    if check and result.returncode != 0:
        raise AssertionError(f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def assert_it_lived(result):
    """A process that took the malformed requests ended well, or a failure naming the request that killed it.

    `malformed_requests.py` prints each request before sending it.
    """
    last_request = (result.stdout.strip().splitlines() or ["none"])[-1]
    assert result.returncode == 0, f"the process died (exit {result.returncode}) on {last_request}\n{result.stderr[-2000:]}"


def check_run_directory(run):
    for name in ("config.json", "model.keras", "metrics.json", "history.csv"):
        assert (run / name).is_file(), name
    assert (run / "vocab" / "source" / "vocab.txt").is_file() and (run / "vocab" / "target" / "vocab.txt").is_file()
    assert list((run / "logs").rglob("events.out.tfevents.*")), "TensorBoard event files"
    assert (run / "checkpoints" / "best.weights.h5").is_file()


# Python source for the fresh-process scripts that load an export: sets
# `op_types`, the ops of the SavedModel in `export_dir`, and `unregistered`,
# those that TensorFlow and tensorflow-text do not register (a server with
# only them could not run the export).
EXPORT_OPS = r"""
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.framework import op_def_registry

saved_model = saved_model_pb2.SavedModel()
with open(f"{export_dir}/saved_model.pb", "rb") as file:
    saved_model.ParseFromString(file.read())
graph = saved_model.meta_graphs[0].graph_def
functions = {function.signature.name for function in graph.library.function}
op_types = {node.op for node in graph.node}
for function in graph.library.function:
    op_types.update(node.op for node in function.node_def)
unregistered = sorted(op for op in op_types if op not in functions and op_def_registry.get(op) is None)


def export_facts():
    # What the test checks of the export itself, for np.savez: its ops, and which of our modules got imported.
    return dict(
        op_types=np.array(sorted(op_types)), unregistered=np.array(unregistered, dtype=str),
        modules=np.array(sorted(name for name in sys.modules if name.split(".")[0] == "keras_transformer")),
    )
"""


def assert_same_weights(actual, expected, rtol=0.0, atol=1e-5):
    """Two trainings' weights `{path: array}` agree, where the math fixes them.

    The key bias adds the same q.b_k to every logit of a query, and the
    softmax is shift-invariant: its exact gradient is zero. What it gets is
    rounding noise (~1e-10), which Adam divides by its epsilon-sized second
    moment into steps of ~1e-5 in a random direction. So the key biases
    (row 0 of `key_value_bias`) are only checked to stay near zero.
    """
    assert sorted(actual) == sorted(expected)
    for name in expected:
        actual_weight, expected_weight = actual[name], expected[name]
        if name.endswith("key_value_bias"):
            for key_bias in (actual_weight[0], expected_weight[0]):
                assert np.abs(key_bias).max() < 1e-2, f"{name}: key biases should stay near 0"
            actual_weight, expected_weight = actual_weight[1], expected_weight[1]
        np.testing.assert_allclose(actual_weight, expected_weight, rtol=rtol, atol=atol, err_msg=name)


# A document as users pipe one in: a byte-order mark, a CRLF line, an empty line, a line of spaces, a
# Latin-1 "é" in a UTF-8 file, a line far longer than any model reads, and a plain last line.
DOCUMENT_LINES = [
    b"\xef\xbb\xbfA dog runs in the park.\r\n", b"\n", b"   \t \n", b"The young cat \xe9 sleeps.\n",
    b" ".join([b"the big dog sees a young cat"] * 300) + b"\n", b"Today the children do not sleep.",
]
DOCUMENT = b"".join(DOCUMENT_LINES)
# Each line as it is read alone: without its BOM and line ending, the bad byte as U+FFFD; None: blank.
DOCUMENT_TEXTS = ["A dog runs in the park.", None, None, "The young cat \ufffd sleeps.",
                  " ".join(["the big dog sees a young cat"] * 300), "Today the children do not sleep."]


def check_one_answer_per_line(result, answer_alone, blank=""):
    """`result` (a command run on `DOCUMENT`) answered each line, line N answering line N as if alone.

    `answer_alone(text)`: the answer to that text given alone; `blank`: the
    answer to a blank line. The bad byte's and the long line's lines are named on stderr.
    """
    answers = result.stdout.split("\n")
    assert answers[-1] == "" and len(answers) - 1 == len(DOCUMENT_TEXTS), result.stdout
    for text, answer in zip(DOCUMENT_TEXTS, answers):
        assert answer == (blank if text is None else answer_alone(text)), (text[:40] if text else text, answer)
    assert "line 4: bytes that are not UTF-8 were read as U+FFFD" in result.stderr
