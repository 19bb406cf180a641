"""Corpora and the tf.data pipeline: what reaches model.fit."""

import os

import numpy as np
import pytest

from keras_transformer import data
from keras_transformer.data import CorpusError
from keras_transformer.text import WordPieceTokenizer

SHARED_MULTI30K = data.multi30k_directory()
PLURAL_VERBS = {verb[3] for verb in data.demo.TRANSITIVE + data.demo.INTRANSITIVE}
VERB_FORMS = PLURAL_VERBS | {verb[2] for verb in data.demo.TRANSITIVE + data.demo.INTRANSITIVE}


# -- the built-in corpus ------------------------------------------------------


@pytest.fixture(scope="module")
def corpus():
    return data.demo_corpus()


def test_demo_corpus_sizes_and_disjoint_splits(corpus):
    assert len(corpus["train"]) >= 20000 and len(corpus["val"]) == 1000 and len(corpus["test"]) == 1000
    english = {split: {source for source, _ in pairs} for split, pairs in corpus.items()}
    assert len(english["train"]) == len(corpus["train"])  # distinct
    assert not english["train"] & english["val"] and not english["train"] & english["test"]
    assert not english["val"] & english["test"]


def test_demo_corpus_is_deterministic(corpus):
    assert data.demo_corpus()["val"] == corpus["val"]


def test_demo_grammar_declines_and_reorders(corpus):
    german = {source: target for split in corpus.values() for source, target in split}
    text = " ".join(german.values())
    # Case and gender: masculine accusative takes "den"/"einen" with -en adjectives.
    assert " einen großen " in text or " einen alten " in text
    assert " dem " in text and " im " in text  # dative and its contraction
    # Word order: a fronted time phrase puts the verb before the subject.
    fronted = [g for e, g in german.items() if e.startswith("In the morning ")]
    assert fronted and all(g.startswith("Am Morgen ") and g.split()[2] in VERB_FORMS for g in fronted)
    # "because" sends the verb to the end of its clause.
    because = [g for g in german.values() if ", weil " in g]
    assert because
    for g in because:
        clause = g.split(", weil ")[1].rstrip(".").split()
        assert clause[-1] in VERB_FORMS or clause[-1] == "nicht" or clause[-2] == "nicht", g
    # Agreement: plural subjects take plural verbs.
    plural = [g for e, g in german.items() if e.startswith("The dogs ") and " because " not in e]
    assert plural and all(g.rstrip(".").split()[2] in PLURAL_VERBS for g in plural)
    assert all(not g.startswith("Der Hunde") for g in german.values())


# -- files on disk ------------------------------------------------------------


def write(path, content, mode="w"):
    if mode == "wb":
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def test_parallel_files_and_tsv(tmp_path):
    source = write(tmp_path / "a.de", "Ein Hund.\nZwei Katzen.\n")
    target = write(tmp_path / "a.en", "A dog.\nTwo cats.\n")
    assert data.read_parallel_files(source, target) == [("Ein Hund.", "A dog."), ("Zwei Katzen.", "Two cats.")]
    tsv = write(tmp_path / "pairs.tsv", "Ein Hund.\tA dog.\r\nZwei Katzen.\tTwo cats.\n")
    assert data.read_tsv(tsv) == [("Ein Hund.", "A dog."), ("Zwei Katzen.", "Two cats.")]


def test_unequal_line_counts_name_both_files(tmp_path):
    source = write(tmp_path / "a.de", "Ein Hund.\nZwei Katzen.\n")
    target = write(tmp_path / "a.en", "A dog.\n")
    with pytest.raises(CorpusError, match=r"a\.de has 2 lines, .*a\.en has 1"):
        data.read_parallel_files(source, target)


def test_empty_line_is_named(tmp_path):
    path = write(tmp_path / "a.en", "A dog.\n\nTwo cats.\n")
    with pytest.raises(CorpusError, match=r"a\.en, line 2: empty line"):
        data.read_lines(path)


def test_bytes_that_are_not_utf8_are_named(tmp_path):
    path = write(tmp_path / "a.de", b"Ein Hund.\nZwei K\xe4tzchen.\n", mode="wb")
    with pytest.raises(CorpusError, match=r"a\.de, line 2: bytes that are not UTF-8"):
        data.read_lines(path)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothere.de"):
        data.read_lines(tmp_path / "nothere.de")


def test_tsv_without_a_tab_is_named(tmp_path):
    path = write(tmp_path / "p.tsv", "Ein Hund.\tA dog.\nZwei Katzen, two cats.\n")
    with pytest.raises(CorpusError, match=r"p\.tsv, line 2: expected 'source<TAB>target'"):
        data.read_tsv(path)


@pytest.mark.skipif(not (SHARED_MULTI30K / "val.de").exists(), reason="../shared/data/multi30k is not present")
def test_multi30k_from_the_shared_directory():
    pairs = data.load_multi30k(splits=("val",), download=False)["val"]
    assert len(pairs) == 1014
    german, english = pairs[0]
    assert german.startswith("Eine Gruppe") or any(ch in "äöüß" for ch in " ".join(p[0] for p in pairs[:50]))
    flipped = data.load_multi30k(direction="en-de", splits=("val",), download=False)["val"]
    assert flipped[0] == (english, german)


def test_multi30k_missing_files_are_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="test_2016_flickr.de"):
        data.load_multi30k(tmp_path, splits=("test",), download=False, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match="direction"):
        data.load_multi30k(tmp_path, direction="fr-en")


def test_multi30k_reads_the_environment_variable(tmp_path, monkeypatch):
    (tmp_path / "multi30k").mkdir()
    write(tmp_path / "multi30k" / "val.de", "Ein Hund.\n")
    write(tmp_path / "multi30k" / "val.en", "A dog.\n")
    monkeypatch.setenv("KERAS_TRANSFORMER_DATA", str(tmp_path))
    assert data.load_multi30k(splits=("val",), download=False) == {"val": [("Ein Hund.", "A dog.")]}


# -- batching -----------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizers(corpus):
    train = corpus["train"][:3000]
    return (
        WordPieceTokenizer.learn([s for s, _ in train], vocab_size=400),
        WordPieceTokenizer.learn([t for _, t in train], vocab_size=400),
    )


def test_batches_respect_the_token_budget(corpus, tokenizers):
    batches = data.make_translation_batches(corpus["val"], *tokenizers, data.Batching(40, tokens_per_batch=600), seed=1)
    rows = 0
    for (source, target_input), labels in batches.dataset:
        padded_length = max(source.shape[1], target_input.shape[1])
        assert source.shape[0] * padded_length <= 600
        assert target_input.shape == labels.shape
        rows += source.shape[0]
    assert rows == batches.num_pairs == 1000


def test_teacher_forcing_shifts_the_target(corpus, tokenizers):
    source_tokenizer, target_tokenizer = tokenizers
    batches = data.make_translation_batches(corpus["val"][:4], *tokenizers, data.Batching(40, batch_size=4), shuffle=False)
    (source, target_input), labels = next(iter(batches.dataset))
    expected_target = target_tokenizer.tokenize([t for _, t in corpus["val"][:4]]).to_tensor().numpy()
    np.testing.assert_array_equal(target_input.numpy()[:, 0], target_tokenizer.start_id)
    for row in range(4):
        length = int((expected_target[row] != 0).sum())
        np.testing.assert_array_equal(target_input.numpy()[row, : length - 1], expected_target[row, : length - 1])
        np.testing.assert_array_equal(labels.numpy()[row, : length - 1], expected_target[row, 1:length])
        assert labels.numpy()[row, length - 2] == target_tokenizer.end_id
    assert source.numpy()[0, 0] == source_tokenizer.start_id


def test_long_pairs_are_dropped_or_truncated_and_counted(corpus, tokenizers):
    pairs = corpus["val"][:200]
    dropped = data.make_translation_batches(pairs, *tokenizers, data.Batching(12, batch_size=16))
    assert dropped.num_dropped > 0 and dropped.num_pairs + dropped.num_dropped == 200
    kept = sum(int(s.shape[0]) for (s, _), _ in dropped.dataset)
    assert kept == dropped.num_pairs
    truncated = data.make_translation_batches(pairs, *tokenizers, data.Batching(12, batch_size=16, long_pairs="truncate"))
    assert truncated.num_truncated == dropped.num_dropped and truncated.num_pairs == 200
    end_id = tokenizers[1].end_id
    for (source, target_input), labels in truncated.dataset:
        assert source.shape[1] <= 12 and target_input.shape[1] <= 11
        for row in labels.numpy():
            assert end_id in row  # every target still ends


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(max_length=40), "exactly one of tokens_per_batch and batch_size"),
        (dict(max_length=40, batch_size=8, tokens_per_batch=100), "exactly one"),
        (dict(max_length=40, tokens_per_batch=20), "cannot hold one pair"),
        (dict(max_length=40, batch_size=8, long_pairs="wrap"), "long_pairs must be one of"),
        (dict(max_length=2, batch_size=8), "max_length must leave room"),
    ],
)
def test_bad_batching_arguments(arguments, message):
    with pytest.raises(ValueError, match=message):
        data.Batching(**arguments)


def test_every_pair_too_long_is_an_error(tokenizers):
    with pytest.raises(ValueError, match="every pair is longer"):
        data.make_translation_batches([("a " * 50, "b " * 50)], *tokenizers, data.Batching(5, batch_size=2))


def test_no_pairs_is_an_error(tokenizers):
    with pytest.raises(ValueError, match="no sentence pairs"):
        data.make_translation_batches([], *tokenizers, data.Batching(5, batch_size=2))


def test_shared_data_environment_is_not_required():
    assert os.fspath(data.multi30k_directory("/some/dir")) == "/some/dir"


def test_batches_split_evenly_between_replicas(corpus, tokenizers):
    batches = data.make_translation_batches(
        corpus["val"][:300], *tokenizers, data.Batching(40, tokens_per_batch=500, batch_multiple=2), seed=3
    )
    sizes = [int(labels.shape[0]) for _, labels in batches.dataset]
    assert all(size % 2 == 0 and size > 0 for size in sizes)
    assert 300 - len(sizes) <= sum(sizes) <= 300


@pytest.mark.parametrize(
    "pairs, arguments",
    [
        (500, dict(tokens_per_batch=300, max_length=12)),  # many buckets, long pairs dropped
        (500, dict(tokens_per_batch=300, max_length=12, long_pairs="truncate", batch_multiple=4)),
        (499, dict(batch_size=7, max_length=40, batch_multiple=3)),  # a last batch of 2 rows: trimmed away
    ],
)
def test_an_epoch_has_as_many_batches_as_keras_is_told(corpus, tokenizers, pairs, arguments):
    # Keras shows the count in its progress bar and stops each epoch there.
    batches = data.make_translation_batches(corpus["val"][:pairs], *tokenizers, data.Batching(**arguments), seed=3)
    assert batches.dataset.cardinality().numpy() == batches.num_batches
    for _ in range(2):  # every epoch's order gives the same count
        assert sum(1 for _ in batches.dataset) == batches.num_batches


def test_classification_batches_know_their_count(tokenizers):
    from keras_transformer import text

    tokenizer = text.WordPieceTokenizer.learn(["a good film", "a bad film"] * 5, vocab_size=30,
                                              reserved_tokens=text.CLASSIFIER_TOKENS)
    examples = [("a good film", 1), ("a bad film", 0)] * 11
    for drop_remainder, expected in ((False, 5), (True, 4)):
        dataset, _ = data.make_classification_batches(examples, tokenizer, 8, 5, shuffle=True, seed=0,
                                                      drop_remainder=drop_remainder)
        assert dataset.cardinality().numpy() == expected and sum(1 for _ in dataset) == expected
