"""Large corpora: streamed from (gzipped, sharded) files, a vocabulary from a sample, tokenized once into shards."""

import gzip
import json
import logging
import os

import pytest
import tensorflow as tf

from helpers import TINY_MODEL, cli_here
from keras_transformer import data
from keras_transformer.data import streaming, token_shards
from keras_transformer.text import WordPieceTokenizer

SOURCES = [f"the {animal} sees {count} {thing}" for animal in ("cat", "dog", "cow") for count in ("one", "two")
           for thing in ("tree", "house", "bird", "car")]
TARGETS = [sentence.replace("the", "die").replace("sees", "sieht") for sentence in SOURCES]


def write(path, lines, raw=False):
    content = b"".join(line if raw else (line + "\n").encode("utf-8") for line in lines)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as file:
        file.write(content)
    return path


@pytest.fixture
def sharded_corpus(tmp_path):
    """The pairs in two gzipped shards per side, the second shard holding three bad lines."""
    half = len(SOURCES) // 2
    write(tmp_path / "train.0.en.gz", SOURCES[:half])
    write(tmp_path / "train.0.de.gz", TARGETS[:half])
    bad_sources = [(s + "\n").encode() for s in SOURCES[half:]] + [b"   \n", b"broken \xff bytes\n", b"fine\n"]
    bad_targets = [(t + "\n").encode() for t in TARGETS[half:]] + [b"leer\n", b"kaputt\n", b"\n"]
    write(tmp_path / "train.1.en.gz", bad_sources, raw=True)
    write(tmp_path / "train.1.de.gz", bad_targets, raw=True)
    return data.ParallelText.from_files(source=tmp_path / "train.*.en.gz", target=tmp_path / "train.*.de.gz")


def read_pairs(corpus):
    """`(source, target, problem)` of every line, and checks the line numbers run 0, 1, 2, ..."""
    lines, numbers = [], []
    for batch_numbers, sources, targets, problems in corpus.line_batches().as_numpy_iterator():
        numbers += list(batch_numbers)
        lines += [(s.decode(errors="replace"), t.decode(errors="replace"), int(p)) for s, t, p in zip(sources, targets, problems)]
    assert numbers == list(range(len(lines)))
    return lines


def test_shards_are_read_in_order_and_bad_lines_are_flagged_not_fatal(sharded_corpus):
    pairs = read_pairs(sharded_corpus)
    assert [(s, t) for s, t, p in pairs if p == streaming.OK] == list(zip(SOURCES, TARGETS))
    problems = [p for _, _, p in pairs[len(SOURCES):]]
    assert problems == [streaming.EMPTY_SIDE, streaming.NOT_UTF8, streaming.EMPTY_SIDE]
    assert sharded_corpus.check_aligned() == len(SOURCES) + 3


def test_tsv_lines_without_one_tab_are_flagged(tmp_path):
    write(tmp_path / "pairs.tsv", ["a cat\teine Katze", "no tab here", "one\ttwo\tthree", "ein\u00a0\tfine \ufffd"])
    corpus = data.ParallelText.from_files(tsv=tmp_path / "pairs.tsv")
    assert [p for _, _, p in read_pairs(corpus)] == [
        streaming.OK, streaming.NOT_TWO_FIELDS, streaming.NOT_TWO_FIELDS, streaming.OK
    ]


def test_misaligned_or_missing_files_are_refused_in_one_line(tmp_path):
    write(tmp_path / "a.en", ["one", "two", "three"])
    write(tmp_path / "a.de", ["eins", "zwei"])
    corpus = data.ParallelText.from_files(source=tmp_path / "a.en", target=tmp_path / "a.de")
    with pytest.raises(data.CorpusError, match=r"a.en has 3 lines, .*a.de has 2"):
        corpus.check_aligned()
    with pytest.raises(FileNotFoundError, match="corpus file not found: .*nothing-\\*"):
        data.ParallelText.from_files(source=tmp_path / "nothing-*", target=tmp_path / "a.de")
    write(tmp_path / "b.en", ["x"])
    with pytest.raises(data.CorpusError, match="names 2 file\\(s\\) and .* names 1"):
        data.ParallelText.from_files(source=tmp_path / "*.en", target=tmp_path / "a.de")


def test_lines_lent_to_validation_and_limits_count_the_splits_own_lines():
    corpus = data.PairsInMemory(tuple((f"s{number}", f"t{number}") for number in range(120)))

    def numbers(split):
        lines = [int(number) for batch in split.line_batches().as_numpy_iterator() for number in batch[0]]
        assert len(lines) == split.count()
        return lines

    assert numbers(data.Split(corpus, held_back="val")) == [0, 50, 100]
    assert numbers(data.Split(corpus, held_back="val", limit=2)) == [0, 50]
    assert numbers(data.Split(corpus, held_back="train", limit=50)) == [*range(1, 50), 51]
    assert len(numbers(data.Split(corpus, held_back="train"))) == 117
    assert numbers(data.Split(corpus, limit=3)) == [0, 1, 2]


def test_the_vocabulary_sample_is_seeded_bounded_and_skips_bad_lines(sharded_corpus):
    lines = sharded_corpus.check_aligned()

    def sample(size, seed):
        return streaming.pairs_list(streaming.sample(sharded_corpus.line_batches(), lines, size, seed))

    first, again, other = sample(10, seed=1), sample(10, seed=1), sample(10, seed=2)
    assert first == again and first != other
    assert 0 < len(first) <= 10
    assert set(first) <= set(zip(SOURCES, TARGETS))
    assert len(sample(1000, seed=1)) == len(SOURCES)  # a sample larger than the corpus: every good pair


def test_learning_from_a_dataset_equals_learning_from_the_list():
    texts = SOURCES * 3
    from_list = WordPieceTokenizer.learn(texts, vocab_size=60)
    from_dataset = WordPieceTokenizer.learn(tf.data.Dataset.from_tensor_slices(texts), vocab_size=60)
    assert from_list.vocab == from_dataset.vocab and len(from_list.vocab) <= 60


@pytest.fixture(scope="module")  # read only
def tokenizers():
    return WordPieceTokenizer.learn(SOURCES, vocab_size=60), WordPieceTokenizer.learn(TARGETS, vocab_size=60)


def test_tokenized_once_the_shards_hold_every_good_pair_and_are_reused(sharded_corpus, tokenizers, tmp_path, caplog):
    source_tokenizer, target_tokenizer = tokenizers
    directory = str(tmp_path / "tokens" / "train")
    identity = {"corpus": sharded_corpus.identity()}
    shards = data.tokenize_once(directory, sharded_corpus.line_batches(), *tokenizers, identity, num_shards=4)
    assert shards.num_pairs == len(SOURCES)
    assert shards.skipped == {"with an empty side": 2, "not UTF-8": 1, "not source<TAB>target": 0}
    read_back = sorted(
        (tuple(source), tuple(target)) for source, target in shards.dataset().as_numpy_iterator()
    )
    expected = sorted(
        (tuple(source), tuple(target))
        for source, target in zip(source_tokenizer.tokenize(SOURCES).to_list(), target_tokenizer.tokenize(TARGETS).to_list())
    )
    assert read_back == expected
    lengths = shards.lengths()
    assert sorted(map(tuple, lengths)) == sorted((len(s), len(t)) for s, t in expected)
    # The shards hold the corpus shuffled, as the same shards every time.
    assert sum(shard["pairs"] for shard in shards.manifest["shards"]) == len(SOURCES)
    in_corpus_order = [(tuple(s), tuple(t)) for s, t in zip(source_tokenizer.tokenize(SOURCES).to_list(),
                                                            target_tokenizer.tokenize(TARGETS).to_list())]
    in_shard_order = [(tuple(s), tuple(t)) for s, t in shards.dataset().as_numpy_iterator()]
    assert in_shard_order != in_corpus_order
    again_elsewhere = data.tokenize_once(str(tmp_path / "again"), sharded_corpus.line_batches(), *tokenizers, identity,
                                         num_shards=4)
    assert [(tuple(s), tuple(t)) for s, t in again_elsewhere.dataset().as_numpy_iterator()] == in_shard_order

    written = os.path.getmtime(os.path.join(directory, token_shards.MANIFEST))
    with caplog.at_level(logging.INFO, logger="keras_transformer"):
        again = data.tokenize_once(directory, sharded_corpus.line_batches(), *tokenizers, identity, num_shards=4)
    assert again.num_pairs == shards.num_pairs and "tokenised" not in caplog.text
    assert os.path.getmtime(os.path.join(directory, token_shards.MANIFEST)) == written


@pytest.mark.parametrize("damage", ["flip a byte", "cut a shard", "partial", "another vocabulary"])
def test_a_damaged_partial_or_stale_shard_set_is_named_and_tokenized_again(
    damage, sharded_corpus, tokenizers, tmp_path, caplog
):
    directory = str(tmp_path / "train")
    identity = {"corpus": sharded_corpus.identity()}
    shards = data.tokenize_once(directory, sharded_corpus.line_batches(), *tokenizers, identity, num_shards=2)
    shard_file = shards.files()[1]
    if damage == "flip a byte":
        with open(shard_file, "r+b") as file:
            file.seek(20)
            byte = file.read(1)
            file.seek(20)
            file.write(bytes([byte[0] ^ 1]))
        expected = "is damaged"
    elif damage == "cut a shard":
        with open(shard_file, "r+b") as file:
            file.truncate(os.path.getsize(shard_file) - 3)
        expected = "is damaged"
    elif damage == "partial":
        os.rename(directory, directory + ".partial")
        os.remove(os.path.join(directory + ".partial", token_shards.MANIFEST))
        expected = "an interrupted tokenisation left a partial shard set"
    else:
        identity = {**identity, "vocabulary": "another"}
        expected = "tokenised from another corpus or vocabulary"
    with caplog.at_level(logging.WARNING, logger="keras_transformer"):
        redone = data.tokenize_once(directory, sharded_corpus.line_batches(), *tokenizers, identity, num_shards=2)
    (warning,) = [record.getMessage() for record in caplog.records]
    assert expected in warning and warning.endswith("tokenising again") and "\n" not in warning
    assert redone.num_pairs == len(SOURCES)
    assert data.open_token_shards(directory, identity)[0] is not None
    assert not os.path.exists(directory + ".partial")


def test_batches_from_shards_count_exactly_and_hold_the_in_memory_batches_pairs(sharded_corpus, tokenizers, tmp_path):
    shards = data.tokenize_once(str(tmp_path / "t"), sharded_corpus.line_batches(), *tokenizers, {}, num_shards=3)
    settings = dict(batching=data.Batching(8, tokens_per_batch=24, shuffle_buffer=5), shuffle=True, seed=4)
    from_shards = data.make_translation_batches(shards, *tokenizers, **settings)
    in_memory = data.make_translation_batches(list(zip(SOURCES, TARGETS)), *tokenizers, **settings)
    assert from_shards.num_pairs == in_memory.num_pairs and from_shards.num_dropped == in_memory.num_dropped

    def epoch_pairs(batches):
        pairs = []
        for (sources, _), labels in batches.dataset:
            pairs += [(tuple(s[s > 0]), tuple(t[t > 0])) for s, t in zip(sources.numpy(), labels.numpy())]
        return pairs

    for epoch in range(2):
        seen = epoch_pairs(from_shards)
        assert len(list(from_shards.dataset)) == from_shards.num_batches
        assert sorted(seen) == sorted(epoch_pairs(in_memory))
        assert len(seen) == from_shards.num_pairs
    # Epoch e's order is set by the seed and e alone: as a resumed run sees it.
    from_shards.epoch.assign(1)
    second_epoch = epoch_pairs(from_shards)
    fresh = data.make_translation_batches(shards, *tokenizers, **settings)
    fresh.epoch.assign(1)
    assert epoch_pairs(fresh) == second_epoch


@pytest.mark.slow
def test_train_on_gzipped_shards_skips_bad_lines_in_one_line_and_a_rerun_reads_the_shards(sharded_corpus, tmp_path):
    run = tmp_path / "run"
    common = ["--dataset", "files", "--train-source", str(tmp_path / "train.*.en.gz"),
              "--train-target", str(tmp_path / "train.*.de.gz"), "--out", str(run), "--vocab-size", "60",
              "--max-length", "12", "--batch-size", "4", *TINY_MODEL, "--attention-samples", "0",
              "--bleu-samples", "0", "--vocab-sample", "20", "--no-evaluate"]
    # In this process: its log lines come on the command's stderr as in a new one.
    first = cli_here("train", *common, "--epochs", "1")
    report = [line for line in first.stderr.splitlines() if "lines skipped" in line]
    assert len(report) == 1 and "2 with an empty side, 1 not UTF-8" in report[0], first.stderr[-2000:]
    assert "tokenised" in first.stderr
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["vocabulary_sample"]["pairs"] <= 20 and metrics["vocabulary_sample"]["of_lines"] == 26
    # One line in 50 of the first 50,000 validates (no validation files given): line 0 of these 27.
    assert metrics["training"]["train_pairs"] == len(SOURCES) - 1
    manifest = (run / "tokens" / "train" / "manifest.json").stat().st_mtime
    second = cli_here("train", *common, "--epochs", "2")
    assert "tokenised" not in second.stderr and "vocabulary sample" not in second.stderr
    assert (run / "tokens" / "train" / "manifest.json").stat().st_mtime == manifest
    assert json.loads((run / "metrics.json").read_text())["training"]["epochs_done"] == 2
