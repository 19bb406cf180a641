"""LiteRT's self-attention cache: in two parts, the chunks of steps before (settled) and the current one (recent).

What LiteRT's searches (`decoding.LiteRTDecoding`) hand to every decoding
step in place of the layers' `(keys, values)` pair (`TwoPartCache`), how
they make it (`two_part_cache`), settle it between chunks (`settle_chunk`)
and reorder it within one (`reorder_chunk`). Why, and how a step reads
it: below (and docs/on-device-internals.md).
"""

import tensorflow as tf
from keras import ops

from keras_transformer.layers.attention import MASKED_LOGIT, combine_heads, heads_last
from keras_transformer.layers.cached_attention import KeyValueCache

# LiteRT's loop (`WHILE`) copies every value it carries from one step to the
# next, except one that the step returns as it got it. A self-attention cache
# written at every step is copied whole at every step, and once more by the
# write (`DYNAMIC_UPDATE_SLICE` writes in place only into a tensor nothing
# else reads). Kept in two parts, it is copied much less: the positions of
# the chunks of steps before (settled) go through a chunk's steps untouched,
# and only the chunk's own few positions (recent) are written and copied; the
# search writes the recent part into the settled one once a chunk
# (`settle_recent`, `inference.loops.Chunks`). The settled part holds
# the positions of the chunks before and no empty room: it starts empty
# (beam search's, with one masked slot), and the recent part is appended to
# it as it settles. A step then attends over as many positions as have been
# written, not over the longest output allowed.
#
#     (keys, values, recent_keys, recent_values[, settled_bias])
#     keys (sentences, heads, settled, head_dim)    values (sentences, heads, head_dim, settled)
#     recent_keys (rows, heads, chunk, head_dim)     recent_values (rows, heads, head_dim, chunk)
#
# The values keep their positions last, where the attention's weighted sum
# runs. Greedy search has one row a sentence. Beam search has several
# (`rows_per_source`), reorders them at every step, and reads the settled
# part without reordering it, by sentence: each settled chunk holds every
# row's positions of that chunk side by side (`beams x chunk` slots), and
# `settled_bias` `(sentences, 1, beams, settled)` says, 0 or `MASKED_LOGIT`,
# which slots hold the history of the row now in each beam's place. A step
# multiplies a sentence's beams' queries with all of its settled keys, and
# the weights with all of its values, in one matrix product per sentence and
# head (XNNPACK runs it on every core), the other beams' slots masked:
# `rows_per_source` times the products, and no gather of each row's history,
# a copy of the whole part on one core at every step
# (`benchmarks/litert_settled_attention.py`, retired at 85b63ac). Within a chunk beam search
# reorders the recent part's rows and the bias's beams
# (`reorder_chunk`); the settle appends the recent part and
# never reorders.

# The settled part's first slot, for beam search: a settled part with no
# slot at all is an empty matrix product, which XNNPACK refuses. It is
# masked, and stays so.
PLACEHOLDER_SLOTS = 1


def settle_recent(cache, rows_per_source=1):
    """A layer's two-part cache with its recent part (a whole chunk of positions) appended to the settled one.

    With several rows a sentence the chunk goes in by sentence; the bias,
    the same for every layer, is left as it is (`settle_bias`).
    """
    keys, values, recent_keys, recent_values, *settled_bias = cache
    appended_keys, appended_values = recent_keys, recent_values
    if rows_per_source > 1:  # a sentence's beams' chunks side by side, beam-major: (sentences, heads, beams x chunk, …)
        beams = rows_per_source
        _, heads, chunk, head_dim = tf.unstack(tf.shape(recent_keys))
        appended_keys = tf.reshape(tf.transpose(tf.reshape(recent_keys, [-1, beams, heads, chunk, head_dim]),
                                                [0, 2, 1, 3, 4]), [-1, heads, beams * chunk, head_dim])
        appended_values = tf.reshape(tf.transpose(tf.reshape(recent_values, [-1, beams, heads, head_dim, chunk]),
                                                  [0, 2, 3, 1, 4]), [-1, heads, head_dim, beams * chunk])
    return (tf.concat([keys, appended_keys], axis=2), tf.concat([values, appended_values], axis=3),
            recent_keys, recent_values, *settled_bias)


def settle_bias(settled_bias, rows_per_source, chunk):
    """The settled part's bias with a chunk's `rows_per_source x chunk` slots appended: each beam sees its own."""
    beams = rows_per_source
    own_slots = tf.repeat(tf.eye(beams), chunk, axis=1)  # (beams, beams x chunk)
    new_bias = tf.where(own_slots > 0, 0.0, MASKED_LOGIT)
    sentences = tf.shape(settled_bias)[0]
    new_bias = tf.broadcast_to(new_bias[None, None], tf.stack([sentences, 1, beams, beams * chunk]))
    return tf.concat([settled_bias, new_bias], axis=3)


def write_along(cached, new, index, axis):
    """`new` written into `cached` at `index` on `axis`, as the one op LiteRT writes a block with.

    Keras' `slice_update`, which on TensorFlow is XLA's dynamic slice update:
    the converter turns it into LiteRT's `DYNAMIC_UPDATE_SLICE` (it writes in
    place into a tensor nothing else reads). TensorFlow runs it only under
    XLA: the file's graph is converted, never run by TensorFlow.
    """
    corner = [tf.zeros([], tf.int32)] * 4
    corner[axis] = tf.cast(index, tf.int32)
    return ops.slice_update(cached, tf.stack(corner), tf.cast(new, cached.dtype))


class _PartByRow:
    """A step's read of a part of a two-part cache row by row: each row's query against its own row's positions.

    The recent part's, and the settled part's with one row a sentence.
    Statistics of the softmax come and go as `(rows, heads, 1, 1)`.
    """

    def __init__(self, logits, values):
        self.logits, self.values = logits, values  # (rows, heads, 1, positions), (rows, heads, head_dim, positions)

    def largest(self):
        return ops.max(self.logits, axis=-1, keepdims=True)

    def exponentials(self, largest):
        return ops.exp(self.logits - largest)

    def total(self, exponentials):
        return ops.sum(exponentials, axis=-1, keepdims=True)

    def attended(self, exponentials, total):  # (rows, heads, head_dim)
        return ops.sum(self.values * ops.cast(exponentials / total, self.values.dtype), axis=-1)


class _SettledBySentence:
    """A step's read of a settled part laid out by sentence (`settle_recent`): matrix products per sentence and head.

    The logits are `(sentences, heads, beams, settled)`; statistics of the
    softmax come and go as `_PartByRow`'s, `(rows, heads, 1, 1)`. Every
    reshape has one size unknown until the graph runs, so that LiteRT sizes
    it when it prepares the loop.
    """

    def __init__(self, queries, keys, values, bias, beams):
        self.beams, self.heads, self.head_dim = beams, queries.shape[1], queries.shape[3]
        self.values = values  # (sentences, heads, head_dim, settled)
        products = tf.matmul(self._by_sentence(queries, self.head_dim), keys, transpose_b=True)
        self.logits = ops.cast(products, "float32") + bias

    def _by_sentence(self, per_row, size=1):  # (rows, heads, 1, size) -> (sentences, heads, beams, size)
        return tf.transpose(tf.reshape(per_row, [-1, self.beams, self.heads, size]), [0, 2, 1, 3])

    def _by_row(self, per_sentence, size=1):  # (sentences, heads, beams, size) -> (rows, heads, 1, size)
        return tf.reshape(tf.transpose(per_sentence, [0, 2, 1, 3]), [-1, self.heads, 1, size])

    def largest(self):
        return self._by_row(ops.max(self.logits, axis=-1, keepdims=True))

    def exponentials(self, largest):
        return ops.exp(self.logits - self._by_sentence(largest))

    def total(self, exponentials):
        return self._by_row(ops.sum(exponentials, axis=-1, keepdims=True))

    def attended(self, exponentials, total):  # (rows, heads, head_dim)
        weights = ops.cast(exponentials / self._by_sentence(total), self.values.dtype)
        return ops.squeeze(self._by_row(tf.matmul(weights, self.values, transpose_b=True), self.head_dim), 2)


class TwoPartCache(KeyValueCache):
    """The `KeyValueCache` of LiteRT's searches: a cache in two parts (above), `rows_per_source` rows a sentence.

    Handed to every decoding step by `decoding.LiteRTDecoding`; the layer
    calls `step` with its new positions and the cache as `two_part_cache`
    made it.
    """

    def __init__(self, rows_per_source=1):
        super().__init__(write=None)
        self.rows_per_source = rows_per_source

    def step(self, layer, query, queries, cache, cache_index, attend):
        """A decoding step of `layer` on a cache in two parts (see `settle_recent`): `(outputs, cache)`.

        The new position's keys and values go into the recent part, at
        `cache_index % chunk`; the query attends to both parts as to one
        sequence: one softmax over the settled positions (every one before
        the chunk) and the recent ones up to this step, each part's values
        weighted by its share of it.
        """
        if ops.shape(query)[1] != 1 or layer.sliding_window is not None:
            raise ValueError("a cache in two parts decodes one position at a time, without a sliding window")
        rows_per_source = self.rows_per_source
        if len(cache) != (5 if rows_per_source > 1 else 4):
            raise ValueError(f"a cache in two parts for {rows_per_source} row(s) a sentence has "
                             f"{5 if rows_per_source > 1 else 4} parts (two_part_cache), got {len(cache)}")
        keys, values, recent_keys, recent_values, *settled_bias = cache
        chunk = ops.shape(recent_keys)[2]
        position = cache_index % chunk
        new_keys, new_values = layer.project_step_keys_values(query)
        recent_keys = write_along(recent_keys, new_keys, position, axis=2)
        recent_values = write_along(recent_values, ops.swapaxes(new_values, 2, 3), position, axis=3)

        # Products of one query as multiply-and-sum: as a matrix product, XNNPACK would pack (copy)
        # the cache as a matrix at every step, which costs more than the product.
        def scores(part_keys):  # (rows, heads, 1, positions)
            return ops.cast(ops.expand_dims(ops.sum(part_keys * queries, axis=-1), 2), "float32")

        # Of the recent part, the positions up to this step are visible.
        recent = _PartByRow(scores(recent_keys) + ops.where(ops.arange(chunk) <= position, 0.0, MASKED_LOGIT),
                            recent_values)
        if settled_bias:  # several rows a sentence: the settled part is read by sentence (`settle_recent`)
            settled = _SettledBySentence(queries, keys, values, settled_bias[0], rows_per_source)
        else:
            settled = _PartByRow(scores(keys), values)
        largest = ops.maximum(settled.largest(), recent.largest())
        settled_exponentials, recent_exponentials = settled.exponentials(largest), recent.exponentials(largest)
        total = settled.total(settled_exponentials) + recent.total(recent_exponentials)
        attended = settled.attended(settled_exponentials, total) + recent.attended(recent_exponentials, total)
        outputs = combine_heads(heads_last(ops.expand_dims(attended, 2)), layer.output_kernel,
                                layer.output_bias if layer.use_bias else None)
        return outputs, (keys, values, recent_keys, recent_values, *settled_bias)


def two_part_cache(cache, chunk_steps, rows_per_source=1):
    """Empty self-attention caches in two parts (`settle_recent`), `rows_per_source` rows a sentence.

    `cache`: the model's caches, a layer's `(keys, values)`, one row a
    sentence (they give the sizes and dtype). The settled part starts
    empty (`settle_recent` appends a chunk at a time; with several rows a
    sentence it is laid out by sentence and starts with its masked
    placeholder slot), the recent part has room for `chunk_steps`
    positions of every row; values with their positions last.
    """
    def zeros(like, shape):
        return tf.zeros(tf.stack(shape), like.dtype)

    layers = []
    for keys, values in cache:
        sentences, heads, _, head_dim = tf.unstack(tf.shape(keys))
        rows = sentences * rows_per_source
        recent = (zeros(keys, [rows, heads, chunk_steps, head_dim]),
                  zeros(values, [rows, heads, head_dim, chunk_steps]))
        if rows_per_source == 1:
            layers.append((zeros(keys, [rows, heads, 0, head_dim]), zeros(values, [rows, heads, head_dim, 0]), *recent))
            continue
        bias = tf.fill(tf.stack([sentences, 1, rows_per_source, PLACEHOLDER_SLOTS]), MASKED_LOGIT)
        layers.append((zeros(keys, [sentences, heads, PLACEHOLDER_SLOTS, head_dim]),
                       zeros(values, [sentences, heads, head_dim, PLACEHOLDER_SLOTS]), *recent, bias))
    return layers


def settle_chunk(cache, rows=None, rows_per_source=1):
    """Every layer's two-part cache settled after a chunk of steps.

    `rows`: the rows to keep, in this order (the others leave: a search's
    finished sentences, whose rows leave together); default: all.
    `rows_per_source`: the rows each sentence has (`two_part_cache`).
    """
    by_sentence = len(cache[0]) == 5
    if rows is not None:
        if not by_sentence:  # one row a sentence: every part is cut by rows
            cache = [tuple(tf.gather(part, rows) for part in layer) for layer in cache]
        else:  # the settled part and its bias by sentence, the recent part by rows
            kept_sentences = tf.reshape(rows, [-1, rows_per_source])[:, 0] // rows_per_source
            cache = [(tf.gather(keys, kept_sentences), tf.gather(values, kept_sentences), tf.gather(recent_keys, rows),
                      tf.gather(recent_values, rows), bias)
                     for keys, values, recent_keys, recent_values, bias in cache]
    settled = [settle_recent(layer, rows_per_source) for layer in cache]
    if not by_sentence:
        return settled
    # The bias is every layer's: settled once, from the first layer's.
    bias = cache[0][4] if rows is None else tf.gather(cache[0][4], kept_sentences)
    bias = settle_bias(bias, rows_per_source, chunk=tf.shape(cache[0][2])[2])
    return [layer[:4] + (bias,) for layer in settled]


def reorder_chunk(cache, parents, rows_per_source=1):
    """Beam search's reorder of two-part caches within a chunk: row `i` continues row `parents[i]`.

    The recent part's rows are gathered; the settled part stays as it is, so
    that LiteRT's loop hands it from step to step without copying it: its
    bias (the last part of a layer's cache, `settle_recent`), the same
    for every layer, is
    reordered instead, each beam's row of it now the parent's.
    """
    if len(cache[0]) == 4:  # one row a sentence: the settled part is reordered too
        return [tuple(tf.gather(part, parents) for part in layer) for layer in cache]
    # Each row's parent's place among its sentence's rows (a beam search's parents are its sentence's).
    parent_beams = tf.reshape(parents % rows_per_source, [-1, rows_per_source])
    bias = tf.gather(cache[0][4], parent_beams, axis=2, batch_dims=1)
    return [(keys, values, tf.gather(recent_keys, parents), tf.gather(recent_values, parents), bias)
            for keys, values, recent_keys, recent_values, _ in cache]
