"""Parallel corpora of any size, read from disk by tf.data: never whole in memory.

The paper trained on WMT 2014: 4.5 million English-German pairs. A corpus that
size arrives as text files, often gzipped and split into shards:

    ParallelText.from_files(source="train.*.en.gz", target="train.*.de.gz")
    ParallelText.from_files(tsv="pairs-*.tsv")

Source file i is aligned with target file i (the globs are sorted), line by
line. `pairs()` reads them as a `tf.data.Dataset` of `(source, target,
problem)` strings, where `problem` says what is wrong with a line that cannot
be a training pair (an empty side, bytes that are not UTF-8, a TSV line without
exactly one tab): such lines are skipped and counted, never fatal. Files whose
line counts differ are not aligned at all, and refused (`check_aligned`).

`sample(...)` picks a seeded sample of pairs for learning a vocabulary, in one
streaming pass.
"""

import dataclasses
import glob
import gzip
import hashlib
import os

import tensorflow as tf

from keras_transformer.data.corpora import CorpusError

# What can be wrong with a line; `PROBLEMS[code]` reads in a report.
OK, EMPTY_SIDE, NOT_UTF8, NOT_TWO_FIELDS = 0, 1, 2, 3
PROBLEMS = {EMPTY_SIDE: "with an empty side", NOT_UTF8: "not UTF-8", NOT_TWO_FIELDS: "not source<TAB>target"}


def expand(pattern):
    """The files a glob names, sorted (a plain path names itself); an error when there are none."""
    files = sorted(glob.glob(os.path.expanduser(str(pattern))))
    files = [path for path in files if os.path.isfile(path)]
    if not files:
        raise FileNotFoundError(f"corpus file not found: {pattern}")
    return tuple(files)


def _compression(path):
    return "GZIP" if str(path).endswith(".gz") else ""


def count_lines(path):
    """Lines in a text file (plain or .gz), the last one counted with or without its newline."""
    opener = gzip.open if _compression(path) else open
    lines, last = 0, b"\n"
    with opener(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 22), b""):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


@dataclasses.dataclass(frozen=True)
class ParallelText:
    """A parallel corpus on disk: aligned source and target files, or TSV files.

    Build it with `from_files`; `pairs()` reads it.
    """

    source_files: tuple = ()
    target_files: tuple = ()
    tsv_files: tuple = ()

    @classmethod
    def from_files(cls, source=None, target=None, tsv=None):
        """From globs: `source` and `target` (as many files each), or `tsv`."""
        if tsv:
            return cls(tsv_files=expand(tsv))
        if not (source and target):
            raise ValueError("a parallel corpus needs a TSV file, or source and target files")
        corpus = cls(source_files=expand(source), target_files=expand(target))
        if len(corpus.source_files) != len(corpus.target_files):
            raise CorpusError(
                f"{source} names {len(corpus.source_files)} file(s) and {target} names "
                f"{len(corpus.target_files)}: each source file needs its aligned target file"
            )
        return corpus

    @property
    def files(self):
        return self.source_files + self.target_files + self.tsv_files

    def identity(self):
        """What the corpus is on disk: every file's path, size and modification time."""
        return [[os.path.abspath(path), os.path.getsize(path), os.stat(path).st_mtime_ns] for path in self.files]

    def check_aligned(self):
        """The number of lines (pairs, good or not); CorpusError when aligned files differ in length."""
        if self.tsv_files:
            return sum(count_lines(path) for path in self.tsv_files)
        total = 0
        for source, target in zip(self.source_files, self.target_files):
            source_lines, target_lines = count_lines(source), count_lines(target)
            if source_lines != target_lines:
                raise CorpusError(
                    f"parallel files differ in length: {source} has {source_lines} lines, {target} has {target_lines}"
                )
            total += source_lines
        return total

    def pairs(self):
        """`(source, target, problem)` for every line, in file order; `problem` is OK or a code of `PROBLEMS`."""
        if self.tsv_files:
            lines = _lines(self.tsv_files)
            return lines.batch(4096).map(_split_tsv, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
        # File i of the source with file i of the target, one file pair after another.
        pairs = None
        for source, target in zip(self.source_files, self.target_files):
            both = tf.data.Dataset.zip(_lines([source]), _lines([target]))
            pairs = both if pairs is None else pairs.concatenate(both)
        return pairs.batch(4096).map(_check_pairs, num_parallel_calls=tf.data.AUTOTUNE).unbatch()


@dataclasses.dataclass(frozen=True)
class PairsInMemory:
    """A small corpus already in memory (the demo's), read like a `ParallelText`."""

    pairs_list: tuple

    def identity(self):
        digest = hashlib.sha256("\n".join(f"{source}\t{target}" for source, target in self.pairs_list).encode())
        return {"pairs": len(self.pairs_list), "sha256": digest.hexdigest()}

    def check_aligned(self):
        return len(self.pairs_list)

    def pairs(self):
        sources = tf.constant([source for source, _ in self.pairs_list], tf.string)
        targets = tf.constant([target for _, target in self.pairs_list], tf.string)
        return tf.data.Dataset.from_tensor_slices((sources, targets)).batch(4096).map(_check_pairs).unbatch()


# A corpus without validation files lends one line in 50 of its first 50,000
# (at most 1000 pairs) to validation.
HOLD_BACK_EVERY, HOLD_BACK_FROM = 50, 50_000


@dataclasses.dataclass(frozen=True)
class Split:
    """One split of a corpus as a stream: the corpus, the lines held back for validation, a limit.

    Args:
        corpus: a `ParallelText` or `PairsInMemory`.
        held_back: "val" (only the lines lent to validation) or "train" (all
            others) for a corpus that has no validation files; None: every line.
        limit: read at most this many lines.
    """

    corpus: object
    held_back: str = None
    limit: int = None

    def identity(self):
        return {"corpus": self.corpus.identity(), "held_back": self.held_back, "limit": self.limit}

    def _lent(self, line_number):
        return (line_number % HOLD_BACK_EVERY == 0) & (line_number < HOLD_BACK_FROM)

    def pairs(self):
        """`(source, target, problem)` of the split's lines (see `ParallelText.pairs`)."""
        pairs = self.corpus.pairs()
        if self.held_back:
            wanted = self.held_back == "val"
            pairs = pairs.enumerate().filter(lambda number, _: self._lent(number) == wanted).map(lambda _, pair: pair)
        return pairs.take(self.limit) if self.limit else pairs

    def count(self):
        """Lines in the split, good or not (CorpusError for misaligned files)."""
        lines = self.corpus.check_aligned()
        if self.held_back:
            lent = len(range(0, min(lines, HOLD_BACK_FROM), HOLD_BACK_EVERY))
            lines = lent if self.held_back == "val" else lines - lent
        return min(lines, self.limit) if self.limit else lines

    def good_pairs_list(self, limit=None):
        """The split's good pairs (the first `limit`) as a list: for validation-sized splits."""
        if limit is None:
            self.count()  # refuses misaligned files
        pairs = good_pairs(self.pairs())
        pairs = pairs.take(limit) if limit else pairs
        return [(source.decode("utf-8"), target.decode("utf-8")) for source, target in pairs.as_numpy_iterator()]


def _lines(files):
    datasets = [tf.data.TextLineDataset(path, compression_type=_compression(path), buffer_size=1 << 20) for path in files]
    lines = datasets[0]
    for more in datasets[1:]:
        lines = lines.concatenate(more)
    return lines


def _not_utf8(strings):
    # Broken bytes become U+FFFD on the way through; valid text (a real
    # U+FFFD included) comes out as it went in.
    repaired = tf.strings.unicode_transcode(strings, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)
    return repaired != strings


def _empty(strings):
    return tf.strings.length(tf.strings.strip(strings)) == 0


def _check_pairs(sources, targets):
    problem = tf.where(_not_utf8(sources) | _not_utf8(targets), NOT_UTF8, OK)
    problem = tf.where((problem == OK) & (_empty(sources) | _empty(targets)), EMPTY_SIDE, problem)
    return sources, targets, problem


def _split_tsv(lines):
    fields = tf.strings.split(lines, "\t")
    two = fields.row_lengths() == 2
    padded = fields.to_tensor(default_value="", shape=[None, 2])
    sources, targets, problem = _check_pairs(padded[:, 0], padded[:, 1])
    return sources, targets, tf.where(two | (problem == NOT_UTF8), problem, NOT_TWO_FIELDS)


def good_pairs(pairs):
    """`(source, target)` of the pairs without a problem."""
    return pairs.filter(lambda source, target, problem: problem == OK).map(lambda source, target, _: (source, target))


def sample(pairs, num_lines, sample_size, seed):
    """At most `sample_size` good `(source, target)` pairs of `num_lines`, chosen by `seed`, in one pass.

    Each line is kept with probability `sample_size / num_lines`, decided by
    a hash of the seed and its line number: the same seed picks the same
    lines, wherever they are read. Nothing but the sample is held.
    """
    if sample_size >= num_lines:
        return good_pairs(pairs)
    buckets = 1 << 30
    keep_below = int(buckets * sample_size / num_lines)

    def chosen(line_number, pair):
        key = tf.strings.join([tf.strings.as_string(seed), tf.strings.as_string(line_number)], ":")
        return tf.strings.to_hash_bucket_fast(key, buckets) < keep_below

    chosen_pairs = pairs.enumerate().filter(chosen).map(lambda _, pair: pair)
    return good_pairs(chosen_pairs).take(sample_size)
