"""`keras-transformer` end to end, as a user runs it: real subprocesses, real run directories."""

import json

import pytest

from helpers import TINY_MODEL, check_run_directory, cli
from keras_transformer import data


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
