"""Parallel corpora of any size, read from disk by tf.data: never whole in memory.

The paper trained on WMT 2014: 4.5 million English-German pairs. A corpus that
size arrives as text files, often gzipped and split into shards:

    ParallelText.from_files(source="train.*.en.gz", target="train.*.de.gz")
    ParallelText.from_files(tsv="pairs-*.tsv")

Source file i is aligned with target file i (the globs are sorted), line by
line. `line_batches()` reads them as a `tf.data.Dataset` of batches of
`(line numbers, sources, targets, problems)`, where a problem says what is
wrong with a line that cannot be a training pair (an empty side, bytes that
are not UTF-8, a TSV line without exactly one tab): such lines are skipped and
counted, never fatal. Files whose line counts differ are not aligned at all,
and refused (`check_aligned`). Everything here works on whole batches of
lines: per-line tf.data steps would cost minutes at millions of lines.

A `Split` is one split of a corpus (with lines lent to validation when there
are no validation files); `sample(...)` picks a seeded sample of its pairs for
learning a vocabulary, in one streaming pass.
"""

import dataclasses
import glob
import gzip
import functools
import hashlib
import os
import zlib

import tensorflow as tf

from keras_transformer.data.corpora import CorpusError

# What can be wrong with a line; `PROBLEMS[code]` reads in a report.
OK, EMPTY_SIDE, NOT_UTF8, NOT_TWO_FIELDS = 0, 1, 2, 3
PROBLEMS = {EMPTY_SIDE: "with an empty side", NOT_UTF8: "not UTF-8", NOT_TWO_FIELDS: "not source<TAB>target"}
BATCH_LINES = 4096  # lines read and checked at a time


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
    try:
        with opener(path, "rb") as file:
            for block in iter(lambda: file.read(1 << 22), b""):
                lines += block.count(b"\n")
                last = block[-1:]
    except (OSError, EOFError, zlib.error) as error:  # a damaged or cut .gz
        raise CorpusError(f"{path} cannot be read to the end: {error}") from None
    return lines + (last != b"\n")


@dataclasses.dataclass(frozen=True)
class ParallelText:
    """A parallel corpus on disk: aligned source and target files, or TSV files.

    Build it with `from_files`; `line_batches()` reads it.
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

    @functools.cached_property
    def _line_count(self):
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

    def check_aligned(self):
        """The number of lines (pairs, good or not); CorpusError when aligned files differ in length.

        The files are read once (counted in Python, a few seconds a gigabyte); later calls remember.
        """
        return self._line_count

    def line_batches(self):
        """Batches of `(line numbers, sources, targets, problems)` in file order; a problem is OK or a `PROBLEMS` code."""
        if self.tsv_files:
            return _numbered(_lines(self.tsv_files).batch(BATCH_LINES).map(_split_tsv, num_parallel_calls=tf.data.AUTOTUNE))
        # File i of the source with file i of the target, one file pair after another.
        pairs = None
        for source, target in zip(self.source_files, self.target_files):
            both = tf.data.Dataset.zip(_lines([source]), _lines([target]))
            pairs = both if pairs is None else pairs.concatenate(both)
        return _numbered(pairs.batch(BATCH_LINES).map(_check_pairs, num_parallel_calls=tf.data.AUTOTUNE))


@dataclasses.dataclass(frozen=True)
class PairsInMemory:
    """A small corpus already in memory (the demo's), read like a `ParallelText`."""

    pairs: tuple  # of (source, target)

    def identity(self):
        digest = hashlib.sha256("\n".join(f"{source}\t{target}" for source, target in self.pairs).encode())
        return {"pairs": len(self.pairs), "sha256": digest.hexdigest()}

    def check_aligned(self):
        return len(self.pairs)

    def line_batches(self):
        sources = tf.constant([source for source, _ in self.pairs], tf.string)
        targets = tf.constant([target for _, target in self.pairs], tf.string)
        return _numbered(tf.data.Dataset.from_tensor_slices((sources, targets)).batch(BATCH_LINES).map(_check_pairs))


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
        limit: only the split's first `limit` lines (good or not).
    """

    corpus: object
    held_back: str = None
    limit: int = None

    def identity(self):
        return {"corpus": self.corpus.identity(), "held_back": self.held_back, "limit": self.limit}

    def line_batches(self):
        """Batches of `(line numbers, sources, targets, problems)` of the split's lines (see `ParallelText`)."""
        batches = self.corpus.line_batches()
        if not (self.held_back or self.limit):
            return batches
        wanted = self.held_back == "val"

        def select(numbers, *columns):
            keep = tf.ones_like(numbers, tf.bool)
            position = numbers  # the line's place in this split
            if self.held_back:
                lent = (numbers % HOLD_BACK_EVERY == 0) & (numbers < HOLD_BACK_FROM)
                keep &= lent == wanted
                lent_so_far = tf.minimum(numbers // HOLD_BACK_EVERY + 1, HOLD_BACK_FROM // HOLD_BACK_EVERY)
                position = numbers // HOLD_BACK_EVERY if wanted else numbers - lent_so_far
            if self.limit:
                keep &= position < self.limit
            return tuple(tf.boolean_mask(column, keep) for column in (numbers, *columns))

        if self.limit:
            # Lines past the last one the limit can reach are not read.
            if self.held_back == "val":
                last_line = HOLD_BACK_EVERY * self.limit
            else:
                last_line = self.limit + (HOLD_BACK_FROM // HOLD_BACK_EVERY if self.held_back else 0)
            batches = batches.take(last_line // BATCH_LINES + 1)
        return batches.map(select)

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
        return pairs_list(good_pairs(self.line_batches()), limit)


def pairs_list(pair_batches, limit=None):
    """`[(source, target), ...]` of batches of `(sources, targets)` strings, at most `limit` of them."""
    pairs = []
    for sources, targets in pair_batches.as_numpy_iterator():
        pairs += [(source.decode("utf-8"), target.decode("utf-8")) for source, target in zip(sources, targets)]
        if limit is not None and len(pairs) >= limit:
            return pairs[:limit]
    return pairs


def _numbered(batches):
    """Batches with their lines' numbers in front (every batch but the last is full)."""
    return batches.enumerate().map(
        lambda index, batch: (index * BATCH_LINES + tf.range(tf.size(batch[0]), dtype=tf.int64), *batch)
    )


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


def good_pairs(line_batches):
    """Batches of `(sources, targets)`: the lines without a problem."""

    def keep_good(numbers, sources, targets, problems):
        good = problems == OK
        return tf.boolean_mask(sources, good), tf.boolean_mask(targets, good)

    return line_batches.map(keep_good)


def sample(line_batches, num_lines, sample_size, seed):
    """Batches of `(sources, targets)`: at most `sample_size` good pairs of `num_lines`, chosen by `seed`, in one pass.

    Each line is kept with probability `sample_size / num_lines`, decided by
    a hash of the seed and its line number: the same seed picks the same
    lines, wherever they are read. Nothing but the sample is held.
    """
    if sample_size >= num_lines:
        return good_pairs(line_batches)
    buckets = 1 << 30
    keep_below = int(buckets * sample_size / num_lines)

    def choose(numbers, sources, targets, problems):
        keys = tf.strings.join([tf.strings.as_string(seed), tf.strings.as_string(numbers)], ":")
        chosen = tf.strings.to_hash_bucket_fast(keys, buckets) < keep_below
        return tuple(tf.boolean_mask(column, chosen) for column in (numbers, sources, targets, problems))

    def at_most(kept_so_far, batch):
        sources, targets = batch
        room = tf.maximum(tf.cast(sample_size, tf.int64) - kept_so_far, 0)
        taken = tf.minimum(room, tf.size(sources, out_type=tf.int64))
        return kept_so_far + taken, (sources[:taken], targets[:taken])

    return good_pairs(line_batches.map(choose)).scan(tf.constant(0, tf.int64), at_most)
