"""Tokenise a corpus once, into shards of token ids that every later epoch, resume and worker reads.

Tokenising 4.5 million pairs takes minutes; doing it at every start, and
holding the result in memory, does not scale. The first start writes the ids
to disk; every later one checks them and reads them as they are:

    tokens/train/
      shard-00000-of-00016.tfrecord   a record per pair: int32 [source length, source ids..., target ids...]
      lengths-00000-of-00016.npy      (pairs, 2) int32: each pair's source and target length
      manifest.json                   written last: what was tokenised, the counts, every file's checksum

The shards hold the corpus in a random order, as if it had been shuffled
before: each pair goes to a shard chosen at random, and each shard is then
written out in a random order (one shard in memory at a time). A corpus is
often files of one domain after another; without this, every epoch would
still run through them in turn, however the shards are read. The choices
come from a fixed seed, so tokenising twice writes the same shards. A worker
of a cluster reads its own shards (`TokenShards.dataset(shards=...)`). The
lengths give an epoch's exact number of batches without reading the ids.

A shard set is used only if its manifest describes the same corpus and
vocabularies (`identity`) and every file has the size and SHA-256 the
manifest lists; otherwise the reason is logged in one line and the corpus is
tokenised again. The files are written into `<directory>.partial` and renamed
when complete, so an interrupted tokenisation is never taken for a finished one.
"""

import dataclasses
import json
import logging
import os
import shutil
import time

import numpy as np
import tensorflow as tf

from keras_transformer.data import streaming
from keras_transformer.saving import file_sha256

logger = logging.getLogger("keras_transformer")

NUM_SHARDS = 16
MANIFEST = "manifest.json"
_FORMAT = 2  # the record layout and order above; a manifest of another format is redone
_SHUFFLE_SEED = 20170612  # the paper's arXiv date: any fixed number, so that shards repeat


def _shard_names(index, num_shards):
    suffix = f"{index:05d}-of-{num_shards:05d}"
    return f"shard-{suffix}.tfrecord", f"lengths-{suffix}.npy"


@dataclasses.dataclass
class TokenShards:
    """A checked shard set: its directory and its manifest."""

    directory: str
    manifest: dict

    @property
    def num_shards(self):
        return len(self.manifest["shards"])

    @property
    def num_pairs(self):
        return sum(shard["pairs"] for shard in self.manifest["shards"])

    @property
    def skipped(self):
        """`{problem description: count}` of the lines that were not pairs."""
        return self.manifest["skipped"]

    def _chosen(self, shards):
        return range(self.num_shards) if shards is None else shards

    def files(self, shards=None):
        return [os.path.join(self.directory, self.manifest["shards"][index]["records"]) for index in self._chosen(shards)]

    def lengths(self, shards=None):
        """`(pairs, 2)` int32: the source and target lengths of the chosen shards' pairs, in shard order."""
        arrays = [
            np.load(os.path.join(self.directory, self.manifest["shards"][index]["lengths"]))
            for index in self._chosen(shards)
        ]
        return np.concatenate(arrays) if arrays else np.zeros((0, 2), np.int32)

    def dataset(self, shards=None, file_order=None):
        """`(source_ids, target_ids)` of the chosen shards, read from disk, shard after shard.

        `file_order` (a dataset of file names) replaces the order of the
        files, e.g. shuffled each epoch; four files are read at a time.
        """
        files = self.files(shards)
        names = file_order if file_order is not None else tf.data.Dataset.from_tensor_slices(tf.constant(files, tf.string))
        records = names.interleave(
            lambda name: tf.data.TFRecordDataset(name, buffer_size=1 << 20),
            cycle_length=min(4, max(1, len(files))),
            block_length=64,
        )
        return records.map(_parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _parse(record):
    ids = tf.io.decode_raw(record, tf.int32, little_endian=True)
    source_length = ids[0]
    return ids[1 : 1 + source_length], ids[1 + source_length :]


def open_token_shards(directory, identity):
    """`(TokenShards, None)` when `directory` holds a complete, intact shard set of `identity`; else `(None, why)`."""
    manifest_path = os.path.join(directory, MANIFEST)
    if not os.path.exists(manifest_path):
        if os.path.exists(directory + ".partial"):
            return None, f"{directory}: an interrupted tokenisation left a partial shard set"
        return None, None  # never tokenised: nothing to report
    try:
        with open(manifest_path, encoding="utf-8") as file:
            manifest = json.load(file)
    except (OSError, ValueError) as error:
        return None, f"{manifest_path} cannot be read ({error})"
    if manifest.get("format") != _FORMAT or manifest.get("identity") != json.loads(json.dumps(identity)):
        return None, f"{directory} was tokenised from another corpus or vocabulary"
    for shard in manifest["shards"]:
        for kind in ("records", "lengths"):
            path = os.path.join(directory, shard[kind])
            if not os.path.exists(path):
                return None, f"{path} is missing"
            if os.path.getsize(path) != shard[f"{kind}_bytes"] or file_sha256(path) != shard[f"{kind}_sha256"]:
                return None, f"{path} is damaged (its size or checksum is not the manifest's)"
    return TokenShards(directory, manifest), None


def tokenize_once(directory, line_batches, source_tokenizer, target_tokenizer, identity, num_shards=NUM_SHARDS):
    """The shards of a split's lines in `directory`: opened when intact, else written (again).

    Args:
        directory: where the shards live (inside a run directory).
        line_batches: batches of `(line numbers, sources, targets, problems)`,
            as `streaming.Split.line_batches()` gives: lines with a problem
            are skipped and counted.
        source_tokenizer, target_tokenizer: `WordPieceTokenizer`s.
        identity: anything JSON can hold that says what is tokenised (the
            corpus files, the vocabularies): shards of another identity are redone.
        num_shards: how many shards to write.

    Returns:
        `TokenShards`.
    """
    shards, why_not = open_token_shards(directory, identity)
    if shards is not None:
        return shards
    if why_not:
        logger.warning("%s; tokenising again", why_not)
    started = time.time()
    staging = directory + ".partial"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    names = [_shard_names(index, num_shards) for index in range(num_shards)]
    random = np.random.default_rng(_SHUFFLE_SEED)
    # First every pair goes to a shard chosen at random, in corpus order ...
    unshuffled = [os.path.join(staging, f"unshuffled-{records}") for records, _ in names]
    writers = [tf.io.TFRecordWriter(path) for path in unshuffled]
    lengths = [[] for _ in range(num_shards)]
    problem_counts = np.zeros(len(streaming.PROBLEMS) + 1, np.int64)
    written = 0
    try:
        for flat_ids, row_starts, pair_lengths, problems in _tokenized(line_batches, source_tokenizer, target_tokenizer):
            problem_counts += problems
            buffer = flat_ids.astype("<i4").tobytes()
            offsets = row_starts * 4
            shard_of_row = random.integers(num_shards, size=len(pair_lengths))
            for row, shard in enumerate(shard_of_row):
                writers[shard].write(buffer[offsets[row] : offsets[row + 1]])
            for shard in range(num_shards):
                lengths[shard].append(pair_lengths[shard_of_row == shard])
            written += len(pair_lengths)
    finally:
        for writer in writers:
            writer.close()
    # ... then each shard is read back and written out in a random order.
    manifest_shards = []
    for (records, lengths_name), shard_lengths, unshuffled_path in zip(names, lengths, unshuffled):
        shard_records = [record for batch in tf.data.TFRecordDataset(unshuffled_path).batch(1 << 16).as_numpy_iterator()
                         for record in batch]
        order = random.permutation(len(shard_records))
        with tf.io.TFRecordWriter(os.path.join(staging, records)) as writer:
            for index in order:
                writer.write(shard_records[index])
        os.remove(unshuffled_path)
        shard_lengths = np.concatenate(shard_lengths) if shard_lengths else np.zeros((0, 2), np.int32)
        np.save(os.path.join(staging, lengths_name), shard_lengths[order].astype(np.int32).reshape(-1, 2))
        entry = {"records": records, "lengths": lengths_name, "pairs": len(shard_records)}
        for kind in ("records", "lengths"):
            path = os.path.join(staging, entry[kind])
            entry.update({f"{kind}_bytes": os.path.getsize(path), f"{kind}_sha256": file_sha256(path)})
        manifest_shards.append(entry)
    skipped = {description: int(problem_counts[code]) for code, description in streaming.PROBLEMS.items()}
    manifest = {"format": _FORMAT, "identity": identity, "shards": manifest_shards, "skipped": skipped}
    with open(os.path.join(staging, MANIFEST), "w", encoding="utf-8") as file:
        json.dump(manifest, file, indent=1)
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(staging, directory)
    logger.info("tokenised %d pairs into %d shards (%s) in %.0fs", written, num_shards, directory, time.time() - started)
    return TokenShards(directory, json.loads(json.dumps(manifest)))


def _tokenized(line_batches, source_tokenizer, target_tokenizer):
    """Batches of `(flat ids, row starts, (rows, 2) lengths, problem counts)`, tokenised in parallel."""

    def tokenize(numbers, sources, targets, problems):
        good = problems == streaming.OK
        source_ids = source_tokenizer.tokenize(tf.boolean_mask(sources, good))
        target_ids = target_tokenizer.tokenize(tf.boolean_mask(targets, good))
        source_lengths = source_ids.row_lengths()
        rows = tf.concat([tf.RaggedTensor.from_tensor(tf.cast(source_lengths, tf.int32)[:, None]), source_ids, target_ids], axis=1)
        pair_lengths = tf.cast(tf.stack([source_lengths, target_ids.row_lengths()], axis=1), tf.int32)
        counts = tf.math.bincount(problems, minlength=len(streaming.PROBLEMS) + 1, dtype=tf.int64)
        return rows.flat_values, rows.row_splits, pair_lengths, counts

    batches = line_batches.map(tokenize, num_parallel_calls=tf.data.AUTOTUNE).prefetch(4)
    for flat_ids, row_starts, pair_lengths, counts in batches.as_numpy_iterator():
        yield flat_ids, row_starts, pair_lengths, counts[: len(streaming.PROBLEMS) + 1]
