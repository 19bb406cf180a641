"""Decoding on a cache: multi-head attention one position at a time.

Generating one token at a time, a decoder's new query must attend to the
keys and values of every earlier position. Recomputing them each step is
quadratic work; instead each attention layer keeps them in a cache tensor of
shape

    (2, batch, num_heads, max_length, head_dim)     [0] keys, [1] values

(keys and values on the leading axis, so that taking either one is a view,
not a copy). `CachedMultiHeadAttention` is `MultiHeadAttention` with two
more ways to be called:

* *a self-attention step*: `cache` and `cache_index` (how many positions
  are filled). The layer projects only the new positions, writes their keys
  and values at `cache_index` (`write_cache`), and attends over the filled
  part. The cache starts as zeros (`empty_cache`); it may start with room for
  a few positions and grow as decoding goes on (`inference.steps` doubles the
  Transformer's), so that a step copies and attends over about as many
  positions as it has written.
* *cross-attention on a fixed context*: `cache` alone, the projected encoder
  output (`compute_cache`), computed once per source sentence and never
  written. A `(keys, values)` pair serves as well (`inference.steps` keeps it
  so, the rows of both on axis 0).

Either returns `(outputs, cache)`. Attention maps come from a full pass
(`MultiHeadAttention.call`), not from decoding steps.
"""

import contextlib
import contextvars

import keras
from keras import ops

from keras_transformer.layers.attention import MultiHeadAttention


def write_cache(cache, keys_values, cache_index):
    """Write new keys/values `(batch, new, 2, heads, head_dim)` at `cache_index`.

    The new positions come in the layout their projection produces (one
    matmul with [W^K W^V], see `_project_new_keys_values`): no transpose into
    the cache's `(2, batch, heads, length, head_dim)` is needed, because a
    scatter takes every slot's place from its index. XLA (JAX's jit, or
    TensorFlow's `jit_compile`) writes a scatter into the cache in place, and
    compiles it with the positions as data, not shapes. The slots go as a
    list of `(part, row, head, position)` indices, one per update row,
    listed in the new values' own order: the form every backend's scatter
    reads alike. TensorFlow without XLA writes differently:
    `_write_cache_in_place`, and so does a graph traced for LiteRT
    (`cache_writes_for_litert`).
    """
    if keras.backend.backend() == "tensorflow" and _WRITES_FOR_LITERT.get():
        return _write_cache_as_dynamic_update_slice(cache, keys_values, cache_index)
    if keras.backend.backend() == "tensorflow" and not _compiling_with_xla():
        return _write_cache_in_place(cache, keys_values, cache_index)
    rows, new_length, parts, heads = (ops.shape(keys_values)[axis] for axis in range(4))
    # An "ij" grid walks the update rows in their own order: row, position, part, head.
    row_of, position_of, part_of, head_of = ops.meshgrid(
        ops.arange(rows), ops.arange(new_length) + cache_index, ops.arange(parts), ops.arange(heads), indexing="ij"
    )
    slots = ops.reshape(ops.stack([part_of, row_of, head_of, position_of], axis=-1), (-1, 4))
    return ops.scatter_update(cache, slots, ops.reshape(keys_values, (-1, ops.shape(keys_values)[4])))


def keys_and_values(cache):
    """A cache's `(keys, values)`: its two halves on the leading axis (or the pair itself, for a fixed context).

    Unstacked rather than indexed: TensorFlow and PyTorch return either as a
    view, but LiteRT copies an indexed half element by element where the
    batch is known only at run time (about 60 ms a step at batch 32 on
    OPUS-MT-base's six layers), and an unstacked one block by block.
    """
    if isinstance(cache, (tuple, list)):
        return cache
    return ops.unstack(cache, 2, axis=0)


def _write_cache_in_place(cache, keys_values, cache_index):
    """`write_cache` for TensorFlow without XLA: one slice update, in place where nothing else holds the cache.

    TensorFlow's scatter (`TensorScatterUpdate`) copies its whole input
    before writing, even where nothing else reads it: every layer's cache,
    at every decoding step. Its strided-slice update writes into its input
    whenever it holds the only reference, as a decoding step's cache inside
    a `tf.function` does (eagerly the caller still holds it, and it is
    copied as before). The new positions are transposed into the cache's
    order first: a copy of their own size, not of the cache's. XLA
    compiles that op only for slice bounds known when compiling, and
    `cache_index` is data, so under XLA the scatter stays.
    """
    import tensorflow as tf

    parts, rows, heads, length, head_dim = tf.unstack(tf.shape(cache))
    new_length = tf.shape(keys_values)[1]
    cache_index = tf.cast(cache_index, head_dim.dtype)
    # Seen as one line of length * head_dim values per (part, row, head), the
    # new positions are one block of columns: a two-axis slice, the cheapest
    # for TensorFlow's slice kernel to address.
    lines = parts * rows * heads
    new_columns = tf.reshape(tf.transpose(keys_values, (2, 0, 3, 1, 4)), tf.stack([lines, new_length * head_dim]))
    written = tf.raw_ops.TensorStridedSliceUpdate(
        input=tf.reshape(cache, tf.stack([lines, length * head_dim])),
        begin=tf.stack([0, cache_index * head_dim]),
        end=tf.stack([lines, (cache_index + new_length) * head_dim]),
        strides=[1, 1],
        value=new_columns,
    )
    return tf.reshape(written, tf.shape(cache))


# Set while a graph is traced for LiteRT (`cache_writes_for_litert`).
_WRITES_FOR_LITERT = contextvars.ContextVar("cache_writes_for_litert", default=False)


@contextlib.contextmanager
def cache_writes_for_litert():
    """Within it, TensorFlow traces cache writes as one `DynamicUpdateSlice` (`export.litert`).

    LiteRT has neither TensorFlow's strided-slice update nor its scatter
    update among its builtin ops; its `DYNAMIC_UPDATE_SLICE` writes a block at
    a position known only at run time, into the cache's own buffer. The op
    comes from XLA's op set, so TensorFlow itself cannot run it outside XLA:
    only a graph that is converted, never run, is traced this way.
    """
    token = _WRITES_FOR_LITERT.set(True)
    try:
        yield
    finally:
        _WRITES_FOR_LITERT.reset(token)


def _write_cache_as_dynamic_update_slice(cache, keys_values, cache_index):
    """`write_cache` as the one op LiteRT writes a block with (see `cache_writes_for_litert`)."""
    import tensorflow as tf
    from tensorflow.compiler.tf2xla.python import xla

    new_positions = tf.transpose(keys_values, (2, 0, 3, 1, 4))  # into the cache's (2, batch, heads, new, head_dim)
    origin = tf.zeros([], tf.int32)
    corner = tf.stack([origin, origin, origin, tf.cast(cache_index, tf.int32), origin])
    return xla.dynamic_update_slice(cache, tf.cast(new_positions, cache.dtype), corner)


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
        cache: a cache tensor, `(2, batch, heads, length, head_dim)`, or a
            `(keys, values)` pair for a fixed context.
        cache_index: with `cache`, the number of cached positions: `query`
            holds the positions that follow (self-attention; `value` and
            `key` are not given). Without it the cache is a fixed context.

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

    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        cache=None,
        cache_index=None,
    ):
        if cache is None:
            return super().call(
                query, value, key, query_mask, value_mask, key_mask, attention_mask, use_causal_mask,
                return_attention_scores, training,
            )
        if return_attention_scores:
            raise ValueError("attention scores come from a full pass, not from a decoding cache")
        queries = self._project_step_queries(query)
        if cache_index is None:
            # Cross-attention on a precomputed context: nothing more to project.
            keys, values = keys_and_values(cache)
            key_padding = key_mask if key_mask is not None else value_mask
            mask, gaussian = self._mask(
                query, ops.shape(queries)[2], ops.shape(keys)[2], query_mask, key_padding, attention_mask,
                use_causal_mask,
            )
        else:
            if value is not None or key is not None:
                raise ValueError("a decoding step attends to its own cache: pass no value or key with cache_index")
            if self.predictive:
                # p_t scales with the key count, which a growing self-attention cache does not have yet.
                raise ValueError(
                    "predictive local attention is for a fixed context (cross-attention), not a decoding cache"
                )
            cache = write_cache(cache, self._project_new_keys_values(query), cache_index)
            keys, values = keys_and_values(cache)
            # Unfilled slots follow the last query: a causal mask hides them already.
            valid_key_length = None if use_causal_mask else cache_index + ops.shape(query)[1]
            # The cache's own slots stand for the keys; decoding produces no padding.
            mask, gaussian = self._mask(
                query, ops.shape(queries)[2], ops.shape(keys)[2], query_mask, None, attention_mask, use_causal_mask,
                offset=cache_index, valid_key_length=valid_key_length,
            )
        attended, _ = self._attend(queries, keys, values, mask, gaussian, False, training)
        return self._combine_heads(attended), cache

    def _project_step_queries(self, query):
        """Q W^Q / sqrt(d_k) for a step's few queries, which are cheaper to scale than W^Q."""
        bias = self._weight(self.query_bias) if self.use_bias else None
        queries = self._project(query, self._weight(self.query_kernel), bias)
        return queries * ops.cast(self._query_scale(), self.compute_dtype)

    def _project_new_keys_values(self, inputs):
        """A decoding step's K and V from one matmul with [W^K W^V]: `(batch, new, 2, heads, head_dim)`.

        Left in the matmul's own layout, which the cache's scatter reads as
        it is (`write_cache`): taking K and V apart here would copy them,
        and slicing the kernel would copy it.
        """
        width = 2 * self.num_heads * self.head_dim
        projected = ops.matmul(inputs, ops.reshape(self._weight(self.key_value_kernel), (-1, width)))
        if self.use_bias:
            projected = ops.add(projected, ops.reshape(self._weight(self.key_value_bias), (width,)))
        return ops.reshape(projected, (-1, ops.shape(inputs)[1], 2, self.num_heads, self.head_dim))

    def compute_cache(self, value, key=None):
        """Project a fixed context once: the cross-attention cache."""
        value = ops.cast(value, self.compute_dtype)
        key = None if key is None else ops.cast(key, self.compute_dtype)
        return ops.stack(self._project_keys_values(value, key), axis=0)

    def empty_cache(self, batch_size, max_length, dtype=None):
        """A zero self-attention cache for `max_length` positions."""
        return ops.zeros(
            (2, batch_size, self.num_heads, max_length, self.head_dim),
            dtype=dtype or self.compute_dtype,
        )
