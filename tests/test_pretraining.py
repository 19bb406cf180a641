"""Masked-language-model pre-training: BERT's masking, `pretrain`, and a classifier started from it."""

import json
import shutil

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import text
from keras_transformer.data import mask_tokens

FIRST_WORD, MASK_ID, VOCAB = 6, 5, 500
# The classifier trainings here are read for their weights and vocabulary: no attention or [CLS] samples
# each epoch (test_classifier_run.py proves those).
NO_SAMPLES = ["--attention-samples", "0", "--projector-samples", "0"]


def test_masking_hides_a_share_of_real_words_and_labels_only_them():
    rng = np.random.default_rng(0)
    token_ids = rng.integers(FIRST_WORD, VOCAB, size=(400, 50)).astype("int32")
    token_ids[:, 0] = 4  # [CLS]
    token_ids[:, 40:] = 0  # padding
    inputs, labels = (value.numpy() for value in mask_tokens(token_ids, [3, 7], MASK_ID, VOCAB, FIRST_WORD))
    chosen = labels != 0
    # Never [CLS] or padding; about 15% of the real words.
    assert not chosen[:, 0].any() and not chosen[:, 40:].any()
    assert 0.14 < chosen[:, 1:40].mean() < 0.16
    np.testing.assert_array_equal(labels[chosen], token_ids[chosen])
    np.testing.assert_array_equal(inputs[~chosen], token_ids[~chosen])
    # Of the chosen: 80% [MASK], 10% a random word, 10% left as they were.
    masked = (inputs[chosen] == MASK_ID).mean()
    kept = (inputs[chosen] == token_ids[chosen]).mean()
    assert 0.77 < masked < 0.83 and 0.08 < kept < 0.12
    assert np.all((inputs >= FIRST_WORD) | np.isin(inputs, [0, 4, MASK_ID]))
    # The same seed, the same masks; another seed, others.
    again, _ = mask_tokens(token_ids, [3, 7], MASK_ID, VOCAB, FIRST_WORD)
    other, _ = mask_tokens(token_ids, [3, 8], MASK_ID, VOCAB, FIRST_WORD)
    np.testing.assert_array_equal(again.numpy(), inputs)
    assert (other.numpy() != inputs).any()


def test_the_hidden_positions_list_every_hidden_token_once_and_nothing_else():
    labels = np.random.default_rng(2).integers(0, 2, size=(30, 20)) * np.arange(1, 21)
    labels[3] = 0  # a row with nothing hidden
    positions, hidden_labels = (value.numpy() for value in kt.data.hidden_positions(labels))
    assert positions.shape == hidden_labels.shape == (30, (labels != 0).sum(axis=1).max())
    # Put back where they came from, the labels are the full rows again.
    rebuilt = np.zeros_like(labels)
    np.put_along_axis(rebuilt, positions, hidden_labels, axis=1)
    np.testing.assert_array_equal(rebuilt, labels)
    # Each hidden position once, in order, before the filler (label 0).
    for row in range(30):
        count = (labels[row] != 0).sum()
        np.testing.assert_array_equal(positions[row, :count], np.flatnonzero(labels[row]))
        assert (hidden_labels[row, count:] == 0).all()


def test_the_masked_language_model_ties_its_output_to_the_embedding(tmp_path):
    model = kt.models.MaskedLanguageModel(vocab_size=40, num_layers=1, d_model=16, num_heads=2, d_ff=32, max_length=12)
    token_ids = np.random.default_rng(1).integers(1, 40, size=(3, 10)).astype("int32")
    logits = model(token_ids)
    assert tuple(logits.shape) == (3, 10, 40) and logits.dtype == "float32"
    # One matrix for reading and predicting: no separate output kernel.
    assert sum(int(np.prod(weight.shape)) == 40 * 16 for weight in model.weights) == 1
    # Scoring only the hidden positions (what training does) gives those positions' logits.
    positions = np.array([[2, 5], [0, 9], [7, 7]], "int32")
    at_positions = keras.ops.convert_to_numpy(model((token_ids, positions)))
    np.testing.assert_allclose(
        at_positions, np.take_along_axis(keras.ops.convert_to_numpy(logits), positions[..., None], axis=1), atol=1e-5
    )
    model.save(tmp_path / "mlm.keras")
    reloaded = keras.saving.load_model(tmp_path / "mlm.keras")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(reloaded(token_ids)), keras.ops.convert_to_numpy(logits))


def test_pretraining_batches_mask_anew_each_epoch_and_the_same_after_a_restart():
    tokenizer = text.WordPieceTokenizer.learn(
        ["the film was good", "the plot was dull", "a great film"] * 20, vocab_size=60,
        reserved_tokens=text.PRETRAINING_TOKENS,
    )
    texts = ["the film was good and the plot was great"] * 8

    def epoch_inputs(epoch_number):
        dataset, epoch = kt.data.make_pretraining_batches(texts, tokenizer, 16, 4, shuffle=True, seed=0)
        epoch.assign(epoch_number)
        batches = list(dataset)
        return np.concatenate([token_ids.numpy() for (token_ids, _), _ in batches])

    first, second = epoch_inputs(0), epoch_inputs(1)
    assert (first != second).any()
    np.testing.assert_array_equal(epoch_inputs(1), second)
    with pytest.raises(ValueError, match=r"starts with \['\[PAD\]'"):
        kt.data.make_pretraining_batches(texts, text.WordPieceTokenizer.learn(texts, vocab_size=60), 16, 4)


@pytest.mark.slow
def test_pretrain_then_a_classifier_starts_from_its_encoder(tmp_path, capsys):
    from keras_transformer import cli
    from keras_transformer.runs import classification, pretraining
    from test_classifier_run import write_reviews

    write_reviews(tmp_path / "train.csv", 600, seed=0)
    write_reviews(tmp_path / "val.csv", 60, seed=1)
    corpus = ["--dataset", f"csv:{tmp_path / 'train.csv'}", "--val-csv", str(tmp_path / "val.csv")]
    # Unlabelled text in which every word follows from the others: five fixed sentences, and the reviews' words.
    sentences = ["the quick brown fox jumps over", "a lazy dog sleeps all day", "my old cat eats fresh fish",
                 "our new car drives very fast", "his red ball rolls down hill"]
    rng = np.random.default_rng(0)
    lines = [sentences[index] for index in rng.integers(0, 5, size=800)]
    lines += (tmp_path / "train.csv").read_text(encoding="utf-8").splitlines()[1:100]
    (tmp_path / "texts.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    tiny = ["--vocab-size", "120", "--num-layers", "1", "--d-model", "32", "--num-heads", "2", "--d-ff", "64",
            "--max-length", "16", "--batch-size", "32", "--warmup-steps", "30", "--dropout", "0"]
    pretrained = tmp_path / "pretrained"
    assert cli.main(["pretrain", "--text", str(tmp_path / "texts.txt"), *tiny, "--epochs", "6",
                     "--out", str(pretrained)]) == 0
    metrics = json.loads((pretrained / "metrics.json").read_text())
    # A hidden word of the fixed sentences follows from its neighbours; chance is about 1/40. The few
    # words hidden in 17 validation texts make the figure coarse and the CPU's kernels move it: 0.36 in
    # float32 with oneDNN's AVX2 kernels, 0.5 with its AVX-512 ones, on the same data.
    assert metrics["val"]["masked_accuracy"] > 0.25, metrics
    vocab = (pretrained / "vocab" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[:6] == list(text.PRETRAINING_TOKENS)

    # A vanishing learning rate: the classifier's encoder stays what pre-training left.
    classifier_run = tmp_path / "classifier"
    assert cli.main(["train-classifier", *corpus, "--max-length", "16", "--batch-size", "32", "--epochs", "1",
                     "--learning-rate-scale", "1e-9", "--init-from", str(pretrained), *NO_SAMPLES,
                     "--out", str(classifier_run)]) == 0
    assert (classifier_run / "vocab" / "vocab.txt").read_text(encoding="utf-8").splitlines() == vocab
    classifier = classification.Classifier(str(classifier_run))
    assert classifier.model.d_model == 32 and classifier.model.num_layers == 1
    for ours, theirs in zip(classifier.model.encoder.get_weights(), pretraining.pretrained_encoder_weights(str(pretrained))):
        np.testing.assert_allclose(ours, theirs, atol=1e-6)
    capsys.readouterr()

    # A pre-training stopped midway (no model.keras yet) lends its best epoch's encoder.
    midway = tmp_path / "midway"
    shutil.copytree(pretrained, midway)
    (midway / "model.keras").unlink()
    midway_config = {"training": {"init_from": str(midway), "max_length": 16}}
    assert pretraining.classifier_config(midway_config)["model"]["d_model"] == 32
    for ours, theirs in zip(pretraining.pretrained_encoder_weights(str(midway)),
                            pretraining.pretrained_encoder_weights(str(pretrained))):
        np.testing.assert_array_equal(ours, theirs)

    # Sizes that do not fit, or a run that is no pre-training, are refused in one line.
    assert cli.main(["train-classifier", *corpus, "--d-model", "64", "--init-from", str(pretrained),
                     "--out", str(tmp_path / "other")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "d_model=32" in error[0] and "64" in error[0]
    translation_run = tmp_path / "translation"
    translation_run.mkdir()
    (translation_run / "config.json").write_text(json.dumps({"task": "translation"}))
    assert cli.main(["train-classifier", *corpus, "--init-from", str(translation_run), "--out", str(tmp_path / "x")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "needs a pre-training run" in error[0] and "translation run" in error[0]


@pytest.mark.slow
def test_a_classifier_starts_from_another_classifiers_encoder(tmp_path, capsys):
    """Intermediate-task training: a classifier trained on one labelled set lends its encoder to the next."""
    from keras_transformer import cli
    from keras_transformer.runs import classification, pretraining
    from test_classifier_run import write_reviews

    for name, count, seed in (("first.csv", 300, 0), ("second.csv", 200, 2), ("val.csv", 60, 1)):
        write_reviews(tmp_path / name, count, seed=seed)
    tiny = ["--vocab-size", "120", "--num-layers", "1", "--d-model", "32", "--num-heads", "2", "--d-ff", "64",
            "--batch-size", "32", "--warmup-steps", "30", "--epochs", "1", *NO_SAMPLES]
    first = tmp_path / "first"
    assert cli.main(["train-classifier", "--dataset", f"csv:{tmp_path / 'first.csv'}", "--val-csv",
                     str(tmp_path / "val.csv"), *tiny, "--max-length", "24", "--pooling", "attention",
                     "--out", str(first)]) == 0
    # The second run keeps its own pooling and dropout; sizes, vocabulary and encoder weights are the first's.
    second = tmp_path / "second"
    assert cli.main(["train-classifier", "--dataset", f"csv:{tmp_path / 'second.csv'}", "--val-csv",
                     str(tmp_path / "val.csv"), "--max-length", "16", "--batch-size", "32", "--epochs", "1",
                     "--learning-rate-scale", "1e-9", "--dropout", "0.3", "--init-from", str(first), *NO_SAMPLES,
                     "--out", str(second)]) == 0
    assert (second / "vocab" / "vocab.txt").read_bytes() == (first / "vocab" / "vocab.txt").read_bytes()
    classifier = classification.Classifier(str(second))
    assert classifier.model.d_model == 32 and classifier.model.pooling == "cls"
    # Its position table is the first run's (24), though it reads 16 tokens.
    assert classifier.model.max_length == 24
    for ours, theirs in zip(classifier.model.encoder.get_weights(), pretraining.pretrained_encoder_weights(str(first))):
        np.testing.assert_allclose(ours, theirs, atol=1e-6)
    # A third generation keeps the first's position table; a longer max_length than it is refused.
    third_config = {"training": {"init_from": str(second), "max_length": 16}}
    assert pretraining.classifier_config(third_config)["model"]["max_length"] == 24
    capsys.readouterr()
    assert cli.main(["train-classifier", "--dataset", f"csv:{tmp_path / 'second.csv'}", "--max-length", "32",
                     "--init-from", str(second), "--out", str(tmp_path / "third")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "max_length 32" in error[0]
