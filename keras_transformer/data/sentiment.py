"""Labelled sentences for the encoder-only classifier: SST-2, IMDB, or a CSV.

Every loader returns `{split: [(text, label), ...]}` with integer labels
(1 = positive for the sentiment sets) and fails with an error that names the
file and the line when the input is wrong.

- SST-2 (GLUE layout): `sst2/train.tsv` and `sst2/dev.tsv`, header
  `sentence<TAB>label`; "val" is the dev set.
- IMDB: `imdb/train.csv.gz` with columns `label,rating,id,text`; its test
  half is not used, so "val" is a held-back, class-balanced part of train
  (`val_fraction`, deterministic). `<br />` tags become spaces.
- IMDB sentences (`imdb-sentences`): the same reviews cut into pieces of
  whole sentences (at most 40 words), each labelled with its review's label:
  sentence-length training text for a sentence classifier (SST-2) to start
  from. Reviews are held back whole, so no review is on both sides.
- Any CSV with `text` and `label` columns (a header row naming them), held
  back the same way when no validation file is given.
"""

import csv
import gzip
import io
import os
import random
import re
from pathlib import Path

from keras_transformer.data.corpora import _SHARED_DATA, CorpusError

_HTML_BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)
# A sentence ends at ., ! or ? followed by white space.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def dataset_directory(name, data_dir=None):
    """Where corpus `name` lives: the argument, else $KERAS_TRANSFORMER_DATA/name, else ../shared/data/name."""
    if data_dir:
        return Path(data_dir)
    if os.environ.get("KERAS_TRANSFORMER_DATA"):
        return Path(os.environ["KERAS_TRANSFORMER_DATA"]) / name
    return _SHARED_DATA / name


def _open_text(path):
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    raw = gzip.open(path, "rb").read() if path.suffix == ".gz" else path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise CorpusError(f"{path}, line {line}: bytes that are not UTF-8 ({error.reason})") from None


def read_labelled(path, text_column="text", label_column="label", delimiter=None, num_classes=None):
    """`[(text, label)]` from a CSV/TSV (optionally .gz) whose header names the two columns.

    With `num_classes`, a label outside 0..num_classes-1 is an error too.
    """
    content = _open_text(path)
    if delimiter is None:
        delimiter = "\t" if ".tsv" in Path(path).suffixes else ","
    # Quotes are literal in GLUE's TSV files; CSV fields may be quoted.
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    reader = csv.DictReader(io.StringIO(content), delimiter=delimiter, quoting=quoting)
    missing = {text_column, label_column} - set(reader.fieldnames or [])
    if missing:
        raise CorpusError(f"{path}: the header has no column(s) {sorted(missing)}; it has {reader.fieldnames}")
    examples = []
    for row in reader:
        line = reader.line_num
        text, label = (row[text_column] or "").strip(), (row[label_column] or "").strip()
        if not text:
            raise CorpusError(f"{path}, line {line}: empty text")
        try:
            label = int(label)
        except ValueError:
            raise CorpusError(f"{path}, line {line}: label {label!r} is not an integer") from None
        if label < 0:
            raise CorpusError(f"{path}, line {line}: label {label} is negative")
        if num_classes is not None and label >= num_classes:
            raise CorpusError(f"{path}, line {line}: label {label} is not one of the model's classes 0..{num_classes - 1}")
        examples.append((_HTML_BREAK.sub(" ", text), label))
    if not examples:
        raise CorpusError(f"{path}: no examples")
    return examples


def hold_out(examples, fraction, seed=0):
    """Split off a class-balanced `fraction` of `examples`: `(kept, held_out)`, deterministic."""
    if not 0 < fraction < 1:
        raise ValueError(f"the held-out fraction must be between 0 and 1, got {fraction}")
    by_label = {}
    for example in examples:
        by_label.setdefault(example[1], []).append(example)
    kept, held = [], []
    for label in sorted(by_label):
        group = list(by_label[label])
        random.Random(seed + label).shuffle(group)
        count = max(1, round(len(group) * fraction))
        held.extend(group[:count])
        kept.extend(group[count:])
    random.Random(seed).shuffle(kept)
    random.Random(seed + 1).shuffle(held)
    return kept, held


def load_sst2(data_dir=None):
    """SST-2: 67,349 training sentences, 872 dev ("val")."""
    directory = dataset_directory("sst2", data_dir)
    return {
        "train": read_labelled(directory / "train.tsv", text_column="sentence"),
        "val": read_labelled(directory / "dev.tsv", text_column="sentence"),
    }


def load_imdb(data_dir=None, val_fraction=0.1, seed=0):
    """IMDB: 25,000 reviews, of which `val_fraction` (balanced) are held back as "val"."""
    examples = read_labelled(dataset_directory("imdb", data_dir) / "train.csv.gz")
    train, val = hold_out(examples, val_fraction, seed)
    return {"train": train, "val": val}


def load_imdb_sentences(data_dir=None, val_fraction=0.1, seed=0, max_words=40):
    """IMDB's reviews (held back as `load_imdb` does) cut into labelled pieces of whole sentences.

    165,000 training pieces from 22,500 reviews at `val_fraction` 0.1. A piece gathers
    consecutive sentences while they fit in `max_words` words; a longer
    sentence is cut at `max_words`. Each piece keeps its review's label: noisy
    (a positive review has negative sentences), yet enough to teach a small
    encoder which words carry sentiment.
    """
    reviews = load_imdb(data_dir, val_fraction, seed)
    return {
        split: [(piece, label) for review, label in examples for piece in sentence_pieces(review, max_words)]
        for split, examples in reviews.items()
    }


def sentence_pieces(text, max_words):
    """`text` as consecutive pieces of whole sentences, each at most `max_words` words."""
    pieces, words = [], []
    for sentence in _SENTENCE_END.split(text):
        sentence_words = sentence.split()[:max_words]
        if words and len(words) + len(sentence_words) > max_words:
            pieces.append(" ".join(words))
            words = []
        words.extend(sentence_words)
    if words:
        pieces.append(" ".join(words))
    return pieces


def load_labelled_csv(path, val_path=None, val_fraction=0.1, seed=0):
    """A CSV (or TSV) with `text` and `label` columns; validation from `val_path` or held back."""
    examples = read_labelled(path)
    if val_path:
        return {"train": examples, "val": read_labelled(val_path)}
    train, val = hold_out(examples, val_fraction, seed)
    return {"train": train, "val": val}
