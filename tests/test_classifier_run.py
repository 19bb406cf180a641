"""A sentiment run end to end: CSV in, [CLS] tokenizer, fit, accuracy, projector logs; classify, evaluate, export."""

import csv
import json
import random

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import data, text
from keras_transformer.runs import classification, options

POSITIVE = ["great", "wonderful", "moving", "funny", "superb"]
NEGATIVE = ["awful", "boring", "dull", "clumsy", "terrible"]
FILLER = ["the", "film", "plot", "actors", "was", "really", "quite", "and", "story", "music"]


def write_reviews(path, count, seed):
    rng = random.Random(seed)
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(["text", "label"])
        for _ in range(count):
            label = rng.randint(0, 1)
            words = rng.choices(FILLER, k=6) + [rng.choice(POSITIVE if label else NEGATIVE)]
            rng.shuffle(words)
            writer.writerow([" ".join(words).capitalize() + ".", label])


@pytest.mark.slow
def test_a_classifier_learns_sentiment_words_and_logs_its_embeddings(tmp_path, capsys):
    write_reviews(tmp_path / "train.csv", 1200, seed=0)
    write_reviews(tmp_path / "val.csv", 100, seed=1)
    config = {
        "data": {"dataset": "csv", "csv": str(tmp_path / "train.csv"), "val_csv": str(tmp_path / "val.csv")},
        "tokenizer": {"vocab_size": 80},
        "model": {"num_layers": 1, "d_model": 32, "num_heads": 2, "d_ff": 64, "dropout": 0.0},
        "training": {"epochs": 3, "batch_size": 32, "max_length": 16, "warmup_steps": 20, "projector_samples": 60},
    }
    config["data"]["labels"] = ["negative", "positive"]
    run = tmp_path / "run"
    metrics = classification.train(config, str(run), verbose=0)
    assert metrics["val"]["examples"] == 100 and metrics["val"]["accuracy"] > 0.9, metrics
    assert json.loads((run / "metrics.json").read_text()) == metrics
    vocab = (run / "vocab" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[START]", "[END]", "[CLS]"]
    for name in ("model.keras", "checkpoints/best.weights.h5", "logs/embeddings/projector_config.pbtxt",
                 "logs/embeddings/metadata.tsv", "history.csv"):
        assert (run / name).exists(), name
    # Under fit, the Attention tab's logger wrote each epoch's [CLS] row (the tab itself: test_attention_explorer.py).
    logged = {(value.tag, event.step) for path in (run / "logs" / "samples").glob("events.out.tfevents.*")
              for event in tf.compat.v1.train.summary_iterator(str(path)) for value in event.summary.value}
    assert {("attention/sample_0/cls/layer_0", epoch) for epoch in (1, 2, 3)} <= logged, sorted(logged)[:5]
    check_the_classifier_commands(run, tmp_path, capsys)


def check_the_classifier_commands(run, tmp_path, capsys):
    """classify, evaluate (its validation set and a CSV) and export on a trained classifier run, through the CLI."""
    from keras_transformer import cli

    texts = ["The film was really great.", "An awful, boring plot.", ""]
    assert cli.main(["classify", str(run), *texts]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines[:2]] == ["positive", "negative"]
    assert all(0.5 <= float(line.split("\t")[1]) <= 1.0 for line in lines[:2])
    assert len(lines) == 3 and lines[2] == ""  # a blank text has nothing to classify: a blank line answers it

    assert cli.main(["evaluate", str(run)]) == 0
    report = capsys.readouterr().out
    assert "accuracy" in report and "confusion matrix" in report and "positive" in report
    scores = json.loads((run / "metrics.json").read_text())["val"]
    assert sum(map(sum, scores["confusion"])) == 100 and scores["classes"]["positive"]["f1"] > 0.9

    write_reviews(tmp_path / "test.csv", 50, seed=3)
    assert cli.main(["evaluate", str(run), "--csv", str(tmp_path / "test.csv")]) == 0
    assert "on 50 examples" in capsys.readouterr().out
    bad = tmp_path / "bad.csv"
    bad.write_text("text,label\nA great film.,1\nA dull film.,7\n", encoding="utf-8")
    assert cli.main(["evaluate", str(run), "--csv", str(bad)]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and f"{bad}, line 3" in error[0] and "label 7" in error[0]

    assert cli.main(["translate", str(run), "a sentence"]) == 2
    assert "translate works on translation runs" in capsys.readouterr().err

    assert cli.main(["export", str(run), str(tmp_path / "exports")]) == 0
    # What it wrote and its signature; no "try it" line: no command reads a classifier's SavedModel.
    assert capsys.readouterr().out.splitlines() == [
        f"exported SavedModel: {tmp_path / 'exports' / '1'}",
        "signature: serving_default (text -> label, label_id, probabilities, embedding)"]
    served = tf.saved_model.load(str(tmp_path / "exports" / "1")).signatures["serving_default"](text=tf.constant(texts))
    classifier = classification.Classifier(str(run))
    # The signature answers every text, a blank one with what the model reads of [CLS] alone; the
    # command line and `classify` answer a blank text with nothing (docs/translation.md).
    assert [label.decode() for label in served["label"].numpy()[:2]] == [label for label, _ in classifier.classify(texts[:2])]
    np.testing.assert_allclose(served["probabilities"].numpy(), classifier.probabilities(texts), atol=1e-5)


def test_texts_are_framed_by_cls_and_cut_to_max_length(tmp_path):
    tokenizer = text.WordPieceTokenizer.learn(
        ["a great film", "an awful film"] * 5, vocab_size=40, reserved_tokens=text.CLASSIFIER_TOKENS
    )
    ids = tokenizer.tokenize_with_cls(["a great film a great film a great film", "film"], max_length=5).numpy()
    cls_id = tokenizer.vocab.index("[CLS]")
    assert ids.shape == (2, 5) and (ids[:, 0] == cls_id).all()
    assert (ids[1, 2:] == 0).all() and (ids[0] != 0).all()
    with pytest.raises(ValueError, match="csv:PATH"):
        classification.load_examples({**options.DEFAULTS["classification"]["data"], "dataset": "csv"})


@pytest.mark.skipif(not (data.dataset_directory("sst2") / "train.tsv").exists(), reason="../shared/data/sst2 is not present")
def test_another_corpus_joins_the_training_set_only(tmp_path):
    write_reviews(tmp_path / "reviews.csv", 100, seed=3)
    corpus = {**options.DEFAULTS["classification"]["data"], "dataset": "csv", "csv": str(tmp_path / "reviews.csv")}
    alone = classification.load_examples(corpus)
    joined = classification.load_examples({**corpus, "also_train_on": "sst2"})
    sst2 = data.load_sst2()
    assert joined["val"] == alone["val"]  # validation stays this corpus's own
    assert joined["train"] == alone["train"] + sst2["train"]


def test_a_wrong_corpus_to_also_train_on_is_refused_before_the_run_starts():
    config = {"data": {"dataset": "sst2"}}
    for wrong in ("csv", "multi30k", "sst2", "imdb, imdbx"):
        with pytest.raises(ValueError, match=f"also_train_on must name imdb, imdb-sentences, got '{wrong.split(', ')[-1]}'"):
            classification.with_dataset_path({"data": {**config["data"], "also_train_on": wrong}})
    assert classification.with_dataset_path({"data": {"dataset": "sst2", "also_train_on": " imdb , imdb-sentences"}})


@pytest.mark.slow
def test_the_train_classifier_command(classifier_exports, tmp_path):
    from helpers import cli_here as cli

    directory, printed = classifier_exports  # trained by the command on 400 reviews
    trained = printed["train_stdout"]
    assert "validation accuracy" in trained and f"run directory: {directory / 'run'}" in trained
    metrics = json.loads((directory / "run" / "metrics.json").read_text())
    assert metrics["val"]["examples"] == 40  # 10% held back, balanced
    refused = cli("train-classifier", "--dataset", "csv", "--out", tmp_path / "other", check=False)
    assert refused.returncode == 2 and "csv:PATH" in refused.stderr
