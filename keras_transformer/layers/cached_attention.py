"""Decoding on a cache: multi-head attention one position at a time.

Generating one token at a time, a decoder's new query must attend to the
keys and values of every earlier position. Recomputing them each step is
quadratic work; instead each attention layer keeps them in a cache, a pair of
tensors

    (keys, values)      each (batch, num_heads, max_length, head_dim)

(two tensors, not one stacked: attention reads each as it is, where taking a
half of a stacked one copies it in LiteRT). `CachedMultiHeadAttention` is
`MultiHeadAttention` with two more ways to be called:

* *a self-attention step*: `cache` and `cache_index` (how many positions
  are filled). The layer projects only the new positions, writes their keys
  and values at `cache_index` (`write_cache`), and attends over the filled
  part. The cache starts as zeros (`empty_cache`); it may start with room for
  a few positions and grow as decoding goes on (`inference.steps` doubles the
  Transformer's), so that a step copies and attends over about as many
  positions as it has written.
* *cross-attention on a fixed context*: `cache` alone, the projected encoder
  output (`compute_cache`), computed once per source sentence and never
  written.

A self-attention cache may also come in two parts, for LiteRT (`settle_recent`).
Either way the layer returns `(outputs, cache)`. Attention maps come from a full pass
(`MultiHeadAttention.call`), not from decoding steps.
"""

import keras
from keras import ops

from keras_transformer.layers.attention import MASKED_LOGIT, MultiHeadAttention, combine_heads, heads_last, project_heads
from keras_transformer.layers.local_attention import PredictiveLocalAttention
from keras_transformer.layers.position_wise import matrix_product
from keras_transformer.litert_tracing import traced_for_litert


def write_cache(cache, new_keys_values, cache_index):
    """Write a step's `(keys, values)`, each `(batch, heads, new, head_dim)`, into `cache` at `cache_index`.

    XLA (JAX's jit, or TensorFlow's `jit_compile`) writes a scatter into the
    cache in place, and compiles it with the positions as data, not shapes
    (`_write_as_scatter`). TensorFlow without XLA writes differently
    (`_write_in_place`), and a graph traced for LiteRT differently again:
    with LiteRT's `DYNAMIC_UPDATE_SLICE` (`_write_along`, `litert_tracing`).
    """
    if keras.backend.backend() == "tensorflow" and traced_for_litert():
        write = lambda cached, new, cache_index: _write_along(cached, new, cache_index, axis=2)  # noqa: E731
    elif keras.backend.backend() == "tensorflow" and not _compiling_with_xla():
        write = _write_in_place
    else:
        write = _write_as_scatter
    return tuple(write(cached, new, cache_index) for cached, new in zip(cache, new_keys_values))


def _write_as_scatter(cached, new, cache_index):
    """One cache tensor `(batch, heads, length, head_dim)` with `new` `(batch, heads, new, head_dim)` scattered in.

    The slots go as a list of `(row, head, position)` indices, one per
    update row, listed in the new values' own order: the form every
    backend's scatter reads alike.
    """
    rows, heads, new_length = (ops.shape(new)[axis] for axis in range(3))
    # An "ij" grid walks the update rows in their own order: row, head, position.
    row_of, head_of, position_of = ops.meshgrid(
        ops.arange(rows), ops.arange(heads), ops.arange(new_length) + cache_index, indexing="ij"
    )
    slots = ops.reshape(ops.stack([row_of, head_of, position_of], axis=-1), (-1, 3))
    return ops.scatter_update(cached, slots, ops.reshape(new, (-1, ops.shape(new)[3])))


def _write_in_place(cached, new, cache_index):
    """`write_cache` for TensorFlow without XLA: one slice update, in place where nothing else holds the cache.

    TensorFlow's scatter (`TensorScatterUpdate`) copies its whole input
    before writing, even where nothing else reads it: every layer's cache,
    at every decoding step. Its strided-slice update writes into its input
    whenever it holds the only reference, as a decoding step's cache inside
    a `tf.function` does (eagerly the caller still holds it, and it is
    copied as before). XLA compiles that op only for slice bounds known
    when compiling, and `cache_index` is data, so under XLA the scatter
    stays.
    """
    import tensorflow as tf

    rows, heads, length, head_dim = tf.unstack(tf.shape(cached))
    new_length = tf.shape(new)[2]
    cache_index = tf.cast(cache_index, head_dim.dtype)
    # Seen as one line of length * head_dim values per (row, head), the
    # new positions are one block of columns: a two-axis slice, the cheapest
    # for TensorFlow's slice kernel to address.
    lines = rows * heads
    new_columns = tf.reshape(new, tf.stack([lines, new_length * head_dim]))
    written = tf.raw_ops.TensorStridedSliceUpdate(
        input=tf.reshape(cached, tf.stack([lines, length * head_dim])),
        begin=tf.stack([0, cache_index * head_dim]),
        end=tf.stack([lines, (cache_index + new_length) * head_dim]),
        strides=[1, 1],
        value=new_columns,
    )
    return tf.reshape(written, tf.shape(cached))


# -- a cache in two parts, for LiteRT ---------------------------------------------------
#
# LiteRT's loop (`WHILE`) copies every value it carries from one step to the
# next, except one that the step returns as it got it. A self-attention cache
# written at every step is copied whole at every step, and once more by the
# write (`DYNAMIC_UPDATE_SLICE` writes in place only into a tensor nothing
# else reads). Kept in two parts, it is copied much less: the positions of
# the chunks of steps before (settled) go through a chunk's steps untouched,
# and only the chunk's own few positions (recent) are written and copied; the
# search writes the recent part into the settled one once a chunk
# (`settle_recent`, `inference.search.Chunks`). The settled part holds
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
# (`benchmarks/litert_settled_attention.py`). Within a chunk beam search
# reorders the recent part's rows and the bias's beams
# (`inference.steps.reorder_chunk`); the settle appends the recent part and
# never reorders. Only a graph traced for LiteRT (`litert_tracing`) uses it.

# The settled part's first slot, for beam search: a settled part with no
# slot at all is an empty matrix product, which XNNPACK refuses. It is
# masked, and stays so.
PLACEHOLDER_SLOTS = 1


def settle_recent(cache, rows_per_source=1):
    """A layer's two-part cache with its recent part (a whole chunk of positions) appended to the settled one.

    With several rows a sentence the chunk goes in by sentence; the bias,
    the same for every layer, is left as it is (`settle_bias`).
    """
    import tensorflow as tf

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
    import tensorflow as tf

    beams = rows_per_source
    own_slots = tf.repeat(tf.eye(beams), chunk, axis=1)  # (beams, beams x chunk)
    new_bias = tf.where(own_slots > 0, 0.0, MASKED_LOGIT)
    sentences = tf.shape(settled_bias)[0]
    new_bias = tf.broadcast_to(new_bias[None, None], tf.stack([sentences, 1, beams, beams * chunk]))
    return tf.concat([settled_bias, new_bias], axis=3)


def _write_along(cached, new, index, axis):
    """`new` written into `cached` at `index` on `axis`, as the one op LiteRT writes a block with (`litert_tracing`)."""
    import tensorflow as tf
    from tensorflow.compiler.tf2xla.python import xla

    corner = [tf.zeros([], tf.int32)] * 4
    corner[axis] = tf.cast(index, tf.int32)
    return xla.dynamic_update_slice(cached, tf.cast(new, cached.dtype), tf.stack(corner))


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
        import tensorflow as tf

        self.beams, self.heads, self.head_dim = beams, queries.shape[1], queries.shape[3]
        self.values = values  # (sentences, heads, head_dim, settled)
        products = tf.matmul(self._by_sentence(queries, self.head_dim), keys, transpose_b=True)
        self.logits = ops.cast(products, "float32") + bias

    def _by_sentence(self, per_row, size=1):  # (rows, heads, 1, size) -> (sentences, heads, beams, size)
        import tensorflow as tf

        return tf.transpose(tf.reshape(per_row, [-1, self.beams, self.heads, size]), [0, 2, 1, 3])

    def _by_row(self, per_sentence, size=1):  # (sentences, heads, beams, size) -> (rows, heads, 1, size)
        import tensorflow as tf

        return tf.reshape(tf.transpose(per_sentence, [0, 2, 1, 3]), [-1, self.heads, 1, size])

    def largest(self):
        return self._by_row(ops.max(self.logits, axis=-1, keepdims=True))

    def exponentials(self, largest):
        return ops.exp(self.logits - self._by_sentence(largest))

    def total(self, exponentials):
        return self._by_row(ops.sum(exponentials, axis=-1, keepdims=True))

    def attended(self, exponentials, total):  # (rows, heads, head_dim)
        import tensorflow as tf

        weights = ops.cast(exponentials / self._by_sentence(total), self.values.dtype)
        return ops.squeeze(self._by_row(tf.matmul(weights, self.values, transpose_b=True), self.head_dim), 2)


def _compiling_with_xla():
    """Whether TensorFlow is tracing for XLA (`jit_compile=True`), here or in a function around this one.

    TensorFlow's auto-clustering (`TF_XLA_FLAGS=--tf_xla_auto_jit`) is not
    seen here; it would compile the slice update anew for each step.
    """
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util  # the check tf.function itself uses

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


@keras.saving.register_keras_serializable(package="keras_transformer")
class CachedMultiHeadAttention(MultiHeadAttention):
    """`MultiHeadAttention` that also decodes on a key/value cache (see the module docstring).

    Args:
        As for `MultiHeadAttention`.

    Call arguments:
        As for `MultiHeadAttention`, plus:
        cache: a `(keys, values)` pair, each `(batch, heads, length,
            head_dim)`: a self-attention cache (`empty_cache`) or a fixed
            context (`compute_cache`); or, traced for LiteRT, a
            self-attention cache in two parts (`settle_recent`).
        cache_index: with `cache`, the number of cached positions: `query`
            holds the positions that follow (self-attention; `value` and
            `key` are not given). Without it the cache is a fixed context.
        rows_per_source: with a cache in two parts, the rows of `query` per
            sentence (a beam search's), consecutive.

    Returns:
        Without `cache`, what `MultiHeadAttention` returns; with it,
        `(outputs (batch, query_length, d_model), cache)`.

    Example:
    >>> attention = CachedMultiHeadAttention(num_heads=4)
    >>> attention.build((2, 1, 64))
    >>> cache = attention.empty_cache(batch_size=2, max_length=10)
    >>> token = keras.random.normal((2, 1, 64))
    >>> outputs, cache = attention(token, use_causal_mask=True, cache=cache, cache_index=0)
    """

    # Whether a step may attend to its own cache, written as it goes (self-attention).
    decodes_on_its_own_cache = True

    def call(self, query, value=None, key=None, query_mask=None, value_mask=None, key_mask=None, attention_mask=None,
             use_causal_mask=False, return_attention_scores=False, training=None, cache=None, cache_index=None,
             rows_per_source=1):
        if cache is None:
            return super().call(query, value, key, query_mask, value_mask, key_mask, attention_mask, use_causal_mask,
                                return_attention_scores, training)
        if return_attention_scores:
            raise ValueError("attention scores come from a full pass, not from a decoding cache")
        queries = self._project_step_queries(query)
        if cache_index is None:
            # Cross-attention on a precomputed context: nothing more to project.
            keys, values = cache
            key_padding = key_mask if key_mask is not None else value_mask
            mask, weight_scale = self._mask(
                query, ops.shape(queries)[2], ops.shape(keys)[2], query_mask, key_padding, attention_mask,
                use_causal_mask,
            )
        else:
            if value is not None or key is not None:
                raise ValueError("a decoding step attends to its own cache: pass no value or key with cache_index")
            if not self.decodes_on_its_own_cache:
                raise ValueError(
                    "predictive local attention is for a fixed context (cross-attention), not a decoding cache"
                )
            if len(cache) in (4, 5):  # a cache in two parts (`settle_recent`)
                return self._step_on_settled_and_recent(queries, query, cache, cache_index, rows_per_source)
            cache = write_cache(cache, self._project_new_keys_values(query), cache_index)
            keys, values = cache
            # Unfilled slots follow the last query: a causal mask hides them already.
            valid_key_length = None if use_causal_mask else cache_index + ops.shape(query)[1]
            # The cache's own slots stand for the keys; decoding produces no padding.
            mask, weight_scale = self._mask(
                query, ops.shape(queries)[2], ops.shape(keys)[2], query_mask, None, attention_mask, use_causal_mask,
                offset=cache_index, valid_key_length=valid_key_length,
            )
        attended, _ = self._attend(queries, keys, values, mask, weight_scale, False, training)
        return combine_heads(attended, self.output_kernel, self.output_bias if self.use_bias else None), cache

    def _step_on_settled_and_recent(self, queries, query, cache, cache_index, rows_per_source):
        """A decoding step on a cache in two parts (see `settle_recent`): `(outputs, cache)`.

        The new position's keys and values go into the recent part, at
        `cache_index % chunk`; the query attends to both parts as to one
        sequence: one softmax over the settled positions (every one before
        the chunk) and the recent ones up to this step, each part's values
        weighted by its share of it.
        """
        if not traced_for_litert():
            raise ValueError("a cache in two parts is for a graph traced for LiteRT (litert_tracing)")
        if ops.shape(query)[1] != 1 or self.sliding_window is not None:
            raise ValueError("a cache in two parts decodes one position at a time, without a sliding window")
        keys, values, recent_keys, recent_values, *settled_bias = cache
        if settled_bias and rows_per_source < 2:
            raise ValueError(f"a cache settled by sentence needs its rows_per_source, got {rows_per_source}")
        chunk = ops.shape(recent_keys)[2]
        position = cache_index % chunk
        new_keys, new_values = self._project_new_keys_values(query)
        recent_keys = _write_along(recent_keys, new_keys, position, axis=2)
        recent_values = _write_along(recent_values, ops.swapaxes(new_values, 2, 3), position, axis=3)

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
        outputs = combine_heads(heads_last(ops.expand_dims(attended, 2)), self.output_kernel,
                                self.output_bias if self.use_bias else None)
        return outputs, (keys, values, recent_keys, recent_values, *settled_bias)

    def _project_step_queries(self, query):
        """Q W^Q / sqrt(d_k) for a step's few queries, which are cheaper to scale than W^Q."""
        bias = self._weight(self.query_bias) if self.use_bias else None
        queries = project_heads(query, self._weight(self.query_kernel), bias, self.num_heads, self.head_dim)
        return queries * ops.cast(self.query_scale, self.compute_dtype)

    def _project_new_keys_values(self, inputs):
        """A decoding step's `(keys, values)`, each `(batch, heads, new, head_dim)`, from one matmul with [W^K W^V].

        One matmul, not two: slicing the kernel would copy it. The product
        is put in the cache's layout and its two halves taken apart after
        it: one transpose of the new positions, not of the cache.
        """
        width = 2 * self.num_heads * self.head_dim
        projected = matrix_product(inputs, ops.reshape(self._weight(self.key_value_kernel), (-1, width)))
        if self.use_bias:
            projected = ops.add(projected, ops.reshape(self._weight(self.key_value_bias), (width,)))
        projected = ops.reshape(projected, (-1, ops.shape(inputs)[1], 2, self.num_heads, self.head_dim))
        return tuple(ops.unstack(ops.transpose(projected, (2, 0, 3, 1, 4)), 2, axis=0))

    def compute_cache(self, value, key=None):
        """Project a fixed context once: the cross-attention cache, `(keys, values)`."""
        value = ops.cast(value, self.compute_dtype)
        key = None if key is None else ops.cast(key, self.compute_dtype)
        return tuple(self._project_keys_values(value, key))

    def empty_cache(self, batch_size, max_length, dtype=None):
        """A zero self-attention cache for `max_length` positions: `(keys, values)`."""
        shape = (batch_size, self.num_heads, max_length, self.head_dim)
        return tuple(ops.zeros(shape, dtype=dtype or self.compute_dtype) for _ in range(2))


@keras.saving.register_keras_serializable(package="keras_transformer")
class CachedPredictiveLocalAttention(CachedMultiHeadAttention, PredictiveLocalAttention):
    """`PredictiveLocalAttention` that also decodes on a fixed context's cache (the decoder's cross-attention).

    Args, call arguments and returns: `PredictiveLocalAttention`'s and `CachedMultiHeadAttention`'s.
    """

    # p_t scales with the key count, which a self-attention cache written as it goes does not have yet.
    decodes_on_its_own_cache = False
