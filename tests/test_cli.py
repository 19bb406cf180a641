"""`keras-transformer` end to end, as a user runs it: real subprocesses, real run directories."""

import csv
import json
import signal
import subprocess
import time

import pytest

from helpers import CLI, ENV, TINY_MODEL, check_run_directory, cli
from keras_transformer import data, runs


@pytest.mark.slow
@pytest.mark.skipif(not (data.multi30k_directory() / "train.de").exists(), reason="../shared/data/multi30k is not present")
def test_train_on_a_slice_of_multi30k(tmp_path):
    run = tmp_path / "multi30k"
    cli(
        "train", "--dataset", "multi30k", "--out", run, "--epochs", 1, "--steps-per-epoch", 4,
        "--limit-train", 1500, "--limit-val", 30, "--vocab-size", 2000, "--tokens-per-batch", 2048,
        *TINY_MODEL, "--no-evaluate",
    )
    check_run_directory(run)
    config = json.loads((run / "config.json").read_text())
    assert config["data"]["dataset"] == "multi30k" and config["data"]["direction"] == "de-en"
    source_vocab = (run / "vocab" / "source" / "vocab.txt").read_text(encoding="utf-8")
    assert "ä" in source_vocab or "ü" in source_vocab  # German on the source side
    scores = json.loads(cli("evaluate", run, "--beam-size", 1).stdout.strip().splitlines()[-1])
    assert 0.0 <= scores["bleu"] <= 100.0


@pytest.mark.slow
def test_a_killed_run_resumes_at_the_next_epoch(tmp_path):
    run = tmp_path / "resumable"
    arguments = [
        "train", "--dataset", "demo", "--out", run, "--epochs", 2, "--steps-per-epoch", 30,
        "--limit-train", 2000, "--limit-val", 20, "--no-evaluate", *TINY_MODEL,
    ]
    process = subprocess.Popen(CLI + [str(a) for a in arguments], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    history = run / "history.csv"
    deadline = time.time() + 300
    # The first epoch is done (and backed up) once its row is in history.csv.
    while time.time() < deadline and process.poll() is None:
        if history.exists() and len(history.read_text().splitlines()) >= 2:
            break
        time.sleep(0.1)
    assert process.poll() is None, "the run finished before it could be killed: give it more steps"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert (run / "backup").exists() and not (run / "model.keras").exists()
    # Until training finishes, the run translates with its best checkpoint so far.
    checkpoint_translation = runs.translate(run, ["the dog sees a cat ."], beam_size=1)
    assert len(checkpoint_translation) == 1 and checkpoint_translation[0].strip()

    result = cli(*arguments)
    assert "Epoch 2/2" in result.stdout and "Epoch 1/2" not in result.stdout
    epochs = [row["epoch"] for row in csv.DictReader(history.open())]
    assert epochs == ["0", "1"]
    assert (run / "model.keras").exists() and not (run / "backup").exists()


@pytest.mark.slow
def test_bad_input_gives_a_clear_error_and_exit_code(tmp_path):
    source = tmp_path / "train.de"
    target = tmp_path / "train.en"
    source.write_text("Ein Hund.\nZwei Katzen.\n", encoding="utf-8")
    target.write_text("A dog.\n", encoding="utf-8")
    result = cli("train", "--dataset", "files", "--train-source", source, "--train-target", target,
                 "--out", tmp_path / "run", check=False)
    assert result.returncode == 2
    assert "train.de has 2 lines" in result.stderr and "train.en has 1" in result.stderr
    assert "Traceback" not in result.stderr

    missing = cli("evaluate", tmp_path / "nowhere", check=False)
    assert missing.returncode == 2 and "not a run directory" in missing.stderr

    no_files = cli("train", "--dataset", "files", "--out", tmp_path / "run2", check=False)
    assert no_files.returncode == 2 and "--train-tsv" in no_files.stderr


def test_help_lists_the_commands():
    result = cli("--help")
    for command in ("train", "evaluate", "translate", "export", "plot-attention", "train-classifier"):
        assert command in result.stdout
