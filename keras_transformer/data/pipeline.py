"""Sentence pairs -> batches for `model.fit` (paper Section 5.1), with tf.data.

    pairs -> tokenize (in the pipeline) -> cache -> shuffle
      (or: token shards, tokenized once on disk -> read in a shuffled order -> shuffle)
          -> drop or truncate long pairs -> batch by length under a token budget -> prefetch

Each element is `((source_ids, target_input_ids), target_label_ids)`:
teacher forcing feeds the decoder the target shifted right ([START] w1 w2 ...)
and asks it to predict the target shifted left (w1 w2 ... [END]).

"Sentence pairs were batched together by approximate sequence length. Each
training batch contained a set of sentence pairs containing approximately
25000 source tokens and 25000 target tokens": `tokens_per_batch` does that.
Pairs of similar length share a batch, so little compute goes to padding.

A classifier's labelled texts take a simpler road: `make_classification_batches`.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from keras_transformer.data.token_shards import TokenShards

LONG_PAIR_POLICIES = ("drop", "truncate")
# Pairs shuffled at a time: the whole of a small corpus, a window of a large one.
SHUFFLE_BUFFER = 100_000


@dataclasses.dataclass
class TranslationBatches:
    """A batched dataset and what happened on the way."""

    dataset: tf.data.Dataset
    num_pairs: int  # pairs kept
    num_dropped: int  # pairs longer than max_length that were dropped
    num_truncated: int  # pairs longer than max_length that were cut
    # The epoch whose order the next pass over `dataset` takes (see
    # `shuffle_each_epoch`); None when the pairs are not shuffled.
    epoch: tf.Variable = None
    num_batches: int = None  # batches in one pass (the dataset's cardinality)


@dataclasses.dataclass(frozen=True)
class Batching:
    """How pairs are grouped into batches; settings that cannot make batches are refused in one line.

    Args:
        max_length: longest sequence in tokens, [START]/[END] included.
        tokens_per_batch: token budget per batch (rows x padded length, the
            longer of source and target); pairs are grouped by length.
        batch_size: a fixed number of pairs per batch instead (give one of the two).
        long_pairs: "drop" pairs longer than max_length, or "truncate" them.
        batch_multiple: trim every batch to a multiple of this many rows (the
            number of replicas), so each replica gets an equal share; Keras'
            `fit` under MirroredStrategy fails on a first batch that splits
            unevenly. At most batch_multiple - 1 pairs a batch are left out.
        shuffle_buffer: pairs shuffled at a time (when shuffled); token
            shards are also read in an order shuffled each epoch.

    Example:
    >>> Batching(max_length=100, tokens_per_batch=25_000)  # the paper's ~25k tokens a batch
    """

    max_length: int
    tokens_per_batch: int = None
    batch_size: int = None
    long_pairs: str = "drop"
    batch_multiple: int = 1
    shuffle_buffer: int = SHUFFLE_BUFFER

    def __post_init__(self):
        _check_batching(self.max_length, self.tokens_per_batch, self.batch_size, self.long_pairs)


@dataclasses.dataclass(frozen=True)
class WorkerShare:
    """One worker's part of a cluster's epoch (multi-worker training).

    shards: the token shards this worker reads.
    pad_to_batches: end each epoch with empty batches up to this many (a
        worker whose shards make fewer batches than another's).
    epoch: the variable that sets each epoch's order (`each_epoch`), made
        outside the strategy so that every worker's order follows it.
    """

    shards: range
    pad_to_batches: int
    epoch: tf.Variable = None


# tf.data's autotuner runs an optimising thread beside every iterator, and
# freeing an iterator waits for that thread. Keras frees the last epoch's
# iterator as the next epoch starts; training the Multi30k recipe on a
# 2-core CPU, that wait took 23-28 s in 5 of 10 runs. The work after the
# cache (shuffle, slice, pad) needs no tuning: without the autotuner the
# parallel map keeps tf.data's starting parallelism and the prefetch buffer
# still grows when the consumer finds it empty.
_PIPELINE_OPTIONS = tf.data.Options()
_PIPELINE_OPTIONS.autotune.enabled = False
# Under MultiWorkerMirroredStrategy, tf.data would give each worker some of
# the files a dataset reads (validation's token shards): their batches would
# differ in number. Every worker reads the same batches and takes its part
# of each; a worker's own training shards go through
# `strategy.distribute_datasets_from_function` instead (runs/translation.py).
_PIPELINE_OPTIONS.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA


def _length_buckets(max_length):
    """Bucket upper bounds: fine for short sentences, coarser for long ones."""
    bounds, bound = [], 8
    while bound < max_length:
        bounds.append(bound)
        bound = bound + 4 if bound < 32 else int(bound * 1.25)
    return bounds


def make_translation_batches(pairs, source_tokenizer, target_tokenizer, batching, shuffle=True, seed=None,
                             worker=None):
    """Batches for training or evaluation from `(source, target)` string pairs, or from token shards.

    Args:
        pairs: a list of (source text, target text), tokenized here and kept
            in memory; or `TokenShards` (`data.token_shards`), the corpus
            tokenized once on disk by these tokenizers, read as it is needed.
        source_tokenizer, target_tokenizer: the `text` tokenizers.
        batching: a `Batching` (max_length, the token budget or batch size, ...).
        shuffle: shuffle pairs each epoch (training).
        seed: shuffling seed: with one, epoch e's order depends on `seed`
            and `e` alone (see `each_epoch`).
        worker: with `TokenShards`, a `WorkerShare`: this worker's shards,
            the batches every worker's epoch has, the shared epoch variable.

    Returns:
        `TranslationBatches`.

    Example:
    >>> batches = make_translation_batches(pairs, source, target, Batching(100, tokens_per_batch=25_000), seed=0)
    """
    max_length, long_pairs = batching.max_length, batching.long_pairs
    pad_to_batches = worker.pad_to_batches if worker else None
    tokenized, lengths, epoch = _tokenized_pairs(pairs, source_tokenizer, target_tokenizer, batching, shuffle, seed,
                                                 worker)
    # What max_length costs (for the caller to report), and how many batches
    # an epoch has (for Keras' progress bar), from the lengths alone.
    counts = pair_counts(lengths, max_length, long_pairs)
    dataset = _within_max_length(tokenized, max_length, long_pairs, source_tokenizer.end_id, target_tokenizer.end_id)
    lengths = _kept_lengths(lengths, max_length, long_pairs)
    if counts["num_pairs"] == 0 and pad_to_batches is None:
        raise ValueError(f"every pair is longer than max_length={max_length} tokens")

    def teacher_forcing(source, target):
        return (source, target[:-1]), target[1:]

    dataset = dataset.map(teacher_forcing, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = _batched(dataset, batching)
    num_batches = _count_kept_batches(lengths, batching)
    if pad_to_batches is not None and pad_to_batches > num_batches:
        # Batches of no pairs: this worker takes part in steps that the
        # others still have data for (the loss divides by the global count
        # of tokens, so an empty share changes nothing).
        empty = tf.zeros([0, 1], tf.int32)
        dataset = dataset.concatenate(
            tf.data.Dataset.from_tensors(((empty, empty), empty)).repeat(pad_to_batches - num_batches)
        )
        num_batches = pad_to_batches
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(num_batches))
    dataset = dataset.prefetch(tf.data.AUTOTUNE).with_options(_PIPELINE_OPTIONS)
    return TranslationBatches(dataset=dataset, epoch=epoch, num_batches=num_batches, **counts)


def _check_batching(max_length, tokens_per_batch, batch_size, long_pairs):
    """Refuse settings that cannot make batches, in one line each."""
    if (tokens_per_batch is None) == (batch_size is None):
        raise ValueError("give exactly one of tokens_per_batch and batch_size")
    if long_pairs not in LONG_PAIR_POLICIES:
        raise ValueError(f"long_pairs must be one of {LONG_PAIR_POLICIES}, got {long_pairs!r}")
    if tokens_per_batch is not None and tokens_per_batch < max_length:
        raise ValueError(
            f"tokens_per_batch={tokens_per_batch} cannot hold one pair of max_length={max_length}"
        )
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if max_length < 3:
        raise ValueError(f"max_length must leave room for [START], a token and [END]; got {max_length}")


def _tokenized_pairs(pairs, source_tokenizer, target_tokenizer, batching, shuffle, seed, worker):
    """`(dataset of (source ids, target ids), their lengths, the epoch variable or None)`, shuffled when asked."""
    shuffle_buffer, epoch = batching.shuffle_buffer, worker.epoch if worker else None
    if isinstance(pairs, TokenShards):
        shards = worker.shards if worker else None
        lengths = pairs.lengths(shards)
        # A worker may have no pairs of its own; the caller checked that some worker has.
        if not len(lengths) and worker is None:
            raise ValueError("no sentence pairs to batch")
        tokenized, epoch = _shard_pairs(pairs, shards, shuffle, seed, shuffle_buffer, epoch)
        return tokenized, lengths, epoch
    if not pairs:
        raise ValueError("no sentence pairs to batch")
    tokenized, lengths = _tokenized_in_memory(pairs, source_tokenizer, target_tokenizer)
    # The ids are kept after the first pass; every later epoch reads them.
    tokenized = tokenized.cache()
    if not shuffle:
        return tokenized, lengths, None
    tokenized, epoch = shuffle_each_epoch(tokenized, min(len(lengths), shuffle_buffer), seed, epoch)
    return tokenized, lengths, epoch


def _within_max_length(tokenized, max_length, long_pairs, source_end_id, target_end_id):
    """The pairs with neither side over `max_length`: longer ones dropped, or truncated."""

    def too_long(source, target):
        return tf.logical_or(tf.size(source) > max_length, tf.size(target) > max_length)

    if long_pairs == "drop":
        return tokenized.filter(lambda source, target: tf.logical_not(too_long(source, target)))

    def truncate(source, target):
        # Keep [START] and the first tokens, and close with [END] so the
        # model still learns where a sentence stops.
        def cut(ids, end_id):
            return tf.cond(
                tf.size(ids) > max_length,
                lambda: tf.concat([ids[: max_length - 1], [end_id]], axis=0),
                lambda: ids,
            )

        return cut(source, source_end_id), cut(target, target_end_id)

    return tokenized.map(truncate)


def _batched(dataset, batching):
    """Padded batches: `batch_size` pairs, or pairs of like length up to `tokens_per_batch` tokens;
    each trimmed to a multiple of `batch_multiple` rows."""
    batch_size, batch_multiple = batching.batch_size, batching.batch_multiple
    padded_shapes = (([None], [None]), [None])
    if batch_size is not None:
        dataset = dataset.padded_batch(batch_size, padded_shapes=padded_shapes)
    else:
        bounds, rows = _buckets(batching.max_length, batching.tokens_per_batch)
        dataset = dataset.bucket_by_sequence_length(
            element_length_func=lambda inputs, labels: tf.maximum(tf.size(inputs[0]), tf.size(labels)),
            bucket_boundaries=bounds,
            bucket_batch_sizes=rows,
            padded_shapes=padded_shapes,
        )
    if batch_multiple == 1:
        return dataset

    def trim(inputs, labels):
        rows = tf.shape(labels)[0] // batch_multiple * batch_multiple
        return (inputs[0][:rows], inputs[1][:rows]), labels[:rows]

    return dataset.map(trim).filter(lambda inputs, labels: tf.shape(labels)[0] > 0)


def _buckets(max_length, tokens_per_batch):
    """`(bounds, rows)`: bucket i holds pairs shorter than bounds[i] (the last, up to max_length), rows[i] a batch."""
    bounds = _length_buckets(max_length)
    # A bucket's longest pair sets how many rows fit in the budget.
    longest = [bound - 1 for bound in bounds] + [max_length]
    return bounds, [max(1, tokens_per_batch // length) for length in longest]


def pair_counts(lengths, max_length, long_pairs="drop"):
    """`{num_pairs, num_dropped, num_truncated}` for pairs of these `(pairs, 2)` lengths."""
    num_long = int((np.asarray(lengths).reshape(-1, 2) > max_length).any(axis=1).sum())
    if long_pairs == "drop":
        return dict(num_pairs=len(lengths) - num_long, num_dropped=num_long, num_truncated=0)
    return dict(num_pairs=len(lengths), num_dropped=0, num_truncated=num_long)


def count_batches(lengths, batching):
    """The number of batches `make_translation_batches` makes with `batching` of pairs of these `(pairs, 2)` lengths."""
    kept = _kept_lengths(np.asarray(lengths).reshape(-1, 2), batching.max_length, batching.long_pairs)
    return _count_kept_batches(kept, batching)


def _kept_lengths(lengths, max_length, long_pairs):
    """The lengths of the pairs batched: long ones dropped, or cut to max_length."""
    if long_pairs == "drop":
        return lengths[~(lengths > max_length).any(axis=1)]
    return np.minimum(lengths, max_length)


def _count_kept_batches(lengths, batching):
    # Batching by length makes an epoch's number of batches unknown to
    # tf.data, though it does not depend on the order: every bucket fills
    # its batches and hands over what is left at the end of the epoch.
    if batching.batch_size is not None:
        groups = [(len(lengths), batching.batch_size)]  # (pairs, rows a batch)
    else:
        bounds, rows = _buckets(batching.max_length, batching.tokens_per_batch)
        # The same lengths (source, target without [START]) put in the same buckets.
        buckets = np.searchsorted(bounds, np.maximum(lengths[:, 0], lengths[:, 1] - 1), side="right")
        groups = [(count, rows[bucket]) for bucket, count in zip(*np.unique(buckets, return_counts=True))]
    return sum(batches_of(count, size, batching.batch_multiple) for count, size in groups)


def _tokenized_in_memory(pairs, source_tokenizer, target_tokenizer):
    """`(dataset of (source ids, target ids), (pairs, 2) lengths)` for a list of string pairs."""
    sources = tf.constant([source for source, _ in pairs], tf.string)
    targets = tf.constant([target for _, target in pairs], tf.string)

    def tokenize(source, target):
        return source_tokenizer.tokenize(source), target_tokenizer.tokenize(target)

    tokenized = (
        tf.data.Dataset.from_tensor_slices((sources, targets))
        .batch(1024)
        .map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)
        .unbatch()
    )
    sizes = tokenized.map(lambda source, target: tf.stack([tf.size(source), tf.size(target)]))
    return tokenized, np.concatenate(list(sizes.batch(1 << 16).as_numpy_iterator()))


def _shard_pairs(shards, chosen, shuffle, seed, shuffle_buffer, epoch=None):
    """`(dataset of (source ids, target ids), epoch variable)` read from token shards.

    Shuffled, each epoch reads the files in another order and shuffles the
    pairs through a buffer of `shuffle_buffer`: memory stays that buffer,
    however large the corpus.
    """
    if not shuffle:
        return shards.dataset(chosen), None
    files = shards.files(chosen)

    def one_pass(pass_seed):
        file_order = tf.data.Dataset.from_tensor_slices(tf.constant(files, tf.string))
        file_order = file_order.shuffle(max(1, len(files)), seed=pass_seed)
        return shards.dataset(chosen, file_order=file_order).shuffle(shuffle_buffer, seed=pass_seed)

    return each_epoch(one_pass, seed, epoch)


def batches_of(count, rows, batch_multiple=1, drop_remainder=False):
    """How many batches `count` elements make, `rows` a batch.

    A batch trimmed to a multiple of `batch_multiple` rows that has none
    left is dropped, as is a last, smaller one with `drop_remainder`.
    """
    full, remainder = divmod(int(count), rows)
    full_kept = full if rows >= batch_multiple else 0
    return full_kept + (1 if remainder >= max(batch_multiple, 1) and not drop_remainder else 0)


def each_epoch(make_pass, seed=None, epoch=None):
    """A dataset whose every pass is `make_pass(pass_seed)`, with a seed set by `seed` and the pass's epoch number.

    `Dataset.shuffle(seed=s, reshuffle_each_iteration=True)` also gives a
    new order each pass, but the k-th order depends on how many passes this
    very dataset object has made: a run resumed in a new process after epoch
    k starts again from the first order, and trains on other batches than an
    uninterrupted run would. Here each pass reads the epoch number from a
    variable when it starts (and moves it on by one), so epoch e is always
    made with the seed `(seed, e)`; a resumed run sets the variable to the
    epoch it resumes at (`keras_transformer.training.EpochSeeds` does that).

    Args:
        make_pass: `pass_seed (int64 tensor) -> tf.data.Dataset`.
        seed: an integer; None makes every pass with a random seed.
        epoch: an int64 variable to count the epochs in; by default a new one.

    Returns:
        `(dataset, epoch variable)`; the variable is None without a seed.
    """
    if seed is None:
        random_seed = lambda _: make_pass(tf.random.uniform([], maxval=2**62, dtype=tf.int64))  # noqa: E731
        return tf.data.Dataset.from_tensors(0).flat_map(random_seed), None
    if epoch is None:
        epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="shuffle_epoch")

    def one_pass(_):
        this_epoch = epoch.assign_add(1) - 1
        # tf.data takes a seed computed in the graph only while the graph has
        # no global seed (`keras.utils.set_random_seed` sets one); `seed` and
        # the epoch are all the randomness wanted here, so drop it.
        tf.compat.v1.get_default_graph().seed = None
        # Distinct seeds for distinct (seed, epoch) pairs up to a million epochs.
        return make_pass(seed * 1_000_003 + this_epoch)

    return tf.data.Dataset.from_tensors(0).flat_map(one_pass), epoch


def shuffle_each_epoch(dataset, buffer_size, seed=None, epoch=None):
    """`dataset` shuffled anew on every pass, in an order set by `seed` and the pass's epoch number (`each_epoch`).

    Args:
        dataset: the elements to shuffle (cache it first: every pass reads it).
        buffer_size: as for `Dataset.shuffle`.
        seed: an integer; None shuffles differently every run.

    Returns:
        `(shuffled dataset, epoch variable)`; the variable is None without a seed.

    Example:
    >>> shuffled, epoch = shuffle_each_epoch(tf.data.Dataset.range(8).cache(), 8, seed=1)
    >>> epoch.assign(3)  # the next pass is shuffled as epoch 3 always is
    """
    if seed is None:
        return dataset.shuffle(buffer_size, reshuffle_each_iteration=True), None
    return each_epoch(lambda pass_seed: dataset.shuffle(buffer_size, seed=pass_seed), seed, epoch)
