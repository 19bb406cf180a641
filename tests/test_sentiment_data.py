"""Labelled corpora for the classifier: SST-2, IMDB, CSV; errors that name file and line."""

import gzip
import re

import pytest

from keras_transformer import data

SST2 = data.dataset_directory("sst2")
IMDB = data.dataset_directory("imdb")


@pytest.mark.skipif(not (SST2 / "train.tsv").exists(), reason="../shared/data/sst2 is not present")
def test_sst2_has_its_published_sizes_and_both_labels():
    corpus = data.load_sst2()
    assert len(corpus["train"]) == 67349 and len(corpus["val"]) == 872
    assert {label for _, label in corpus["val"]} == {0, 1}
    # GLUE's TSV keeps quotes literally: a sentence with a quote is read whole.
    assert all(text and "\t" not in text for text, _ in corpus["train"][:2000])


@pytest.mark.skipif(not (IMDB / "train.csv.gz").exists(), reason="../shared/data/imdb is not present")
def test_imdb_holds_back_a_balanced_validation_part_without_html():
    corpus = data.load_imdb(val_fraction=0.1)
    assert len(corpus["train"]) == 22500 and len(corpus["val"]) == 2500
    assert sum(label for _, label in corpus["val"]) == 1250
    assert all("<br" not in text for text, _ in corpus["val"])
    assert data.load_imdb(val_fraction=0.1)["val"][:5] == corpus["val"][:5]  # deterministic


def test_sentence_pieces_keep_whole_sentences_within_the_word_limit():
    text = "A fine film. I laughed a lot! Was it long? " + " ".join(["word"] * 12) + ". The end."
    pieces = data.sentence_pieces(text, max_words=8)
    assert pieces == ["A fine film. I laughed a lot!", "Was it long?", " ".join(["word"] * 8), "The end."]
    # Nothing but the over-long sentence's tail is dropped; no piece is empty or too long.
    assert all(0 < len(piece.split()) <= 8 for piece in pieces)
    assert data.sentence_pieces("One sentence without an end", 40) == ["One sentence without an end"]


@pytest.mark.skipif(not (IMDB / "train.csv.gz").exists(), reason="../shared/data/imdb is not present")
def test_imdb_sentences_hold_back_whole_reviews():
    reviews = data.load_imdb(val_fraction=0.1)
    pieces = data.load_imdb_sentences(val_fraction=0.1)
    assert 150_000 < len(pieces["train"]) < 200_000
    # Long held-back pieces occur in held-back reviews, with their labels, and in no training review.
    text_of = {split: {label: "\n".join(" ".join(review.split()) for review, review_label in reviews[split]
                                        if review_label == label) for label in (0, 1)} for split in ("train", "val")}
    long_pieces = [(piece, label) for piece, label in pieces["val"] if len(piece.split()) >= 25][:100]
    assert len(long_pieces) == 100 and {label for _, label in long_pieces} == {0, 1}
    for piece, label in long_pieces:
        assert piece in text_of["val"][label]
        assert piece not in text_of["train"][0] and piece not in text_of["train"][1]
    assert all(len(piece.split()) <= 40 for piece, _ in pieces["val"])


def test_a_csv_of_text_and_label(tmp_path):
    path = tmp_path / "reviews.csv.gz"
    rows = "text,label\n" + "".join(f'"Great, film {i}!",1\nBad film {i}<br />really,0\n' for i in range(10))
    path.write_bytes(gzip.compress(rows.encode()))
    corpus = data.load_labelled_csv(path, val_fraction=0.2)
    assert len(corpus["train"]) == 16 and len(corpus["val"]) == 4
    assert sorted(label for _, label in corpus["val"]) == [0, 0, 1, 1]
    texts = {text for text, _ in corpus["train"] + corpus["val"]}
    assert "Great, film 0!" in texts and "Bad film 0 really" in texts


@pytest.mark.parametrize(
    "content, message",
    [
        ("words,label\nfine,1\n", "no column(s) ['text']"),
        ("text,label\nfine,positive\n", "line 2: label 'positive' is not an integer"),
        ("text,label\nfine,1\n,0\n", "line 3: empty text"),
        ("text,label\n", "no examples"),
    ],
)
def test_bad_csv_is_refused_with_file_and_line(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(data.CorpusError, match=re.escape(message)):
        data.read_labelled(path)


def test_missing_file_and_bad_fraction(tmp_path):
    with pytest.raises(FileNotFoundError, match="corpus file not found"):
        data.load_labelled_csv(tmp_path / "nowhere.csv")
    with pytest.raises(ValueError, match="between 0 and 1"):
        data.hold_out([("a", 0)], 1.5)
