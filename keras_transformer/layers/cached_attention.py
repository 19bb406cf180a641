"""Decoding on a cache: multi-head attention one position at a time.

Generating one token at a time, a decoder's new query must attend to the
keys and values of every earlier position. Recomputing them each step is
quadratic work; instead each attention layer keeps them in a cache, a pair of
tensors

    (keys, values)      each (batch, num_heads, max_length, head_dim)

(two tensors, not one stacked: attention reads each as it is, where a
runtime may copy a half of a stacked one to read it). `CachedMultiHeadAttention` is
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

Either way the layer returns `(outputs, cache)`. Attention maps come from a full pass
(`MultiHeadAttention.call`), not from decoding steps.

How a step keeps its cache is a `KeyValueCache` (the `cache_policy` of a
call): by default the pair above, written by `write_as_scatter`, the form
every backend compiles. A runtime with a faster way to write, or with a
cache of another shape, hands its own policy down with the step (the
searches' `inference.decoding.Decoding` says which): the layer itself knows
one cache.
"""

import keras
from keras import ops

from keras_transformer.layers.attention import MultiHeadAttention, combine_heads, project_heads
from keras_transformer.layers.local_attention import PredictiveLocalAttention
from keras_transformer.layers.position_wise import matrix_product


def write_as_scatter(cached, new, cache_index):
    """One cache tensor `(batch, heads, length, head_dim)` with `new` `(batch, heads, new, head_dim)` scattered in.

    The slots go as a list of `(row, head, position)` indices, one per
    update row, listed in the new values' own order: the form every
    backend's scatter reads alike, and XLA (JAX's jit, TensorFlow's
    `jit_compile`) writes in place, with the positions as data, not shapes.
    """
    rows, heads, new_length = (ops.shape(new)[axis] for axis in range(3))
    # An "ij" grid walks the update rows in their own order: row, head, position.
    row_of, head_of, position_of = ops.meshgrid(
        ops.arange(rows), ops.arange(heads), ops.arange(new_length) + cache_index, indexing="ij"
    )
    slots = ops.reshape(ops.stack([row_of, head_of, position_of], axis=-1), (-1, 3))
    return ops.scatter_update(cached, slots, ops.reshape(new, (-1, ops.shape(new)[3])))


def write_cache(cache, new_keys_values, cache_index, write=write_as_scatter):
    """Write a step's `(keys, values)`, each `(batch, heads, new, head_dim)`, into `cache` at `cache_index`.

    `write(cached, new, cache_index)`: how one tensor is written
    (`write_as_scatter`, or a runtime's own: `KeyValueCache`).
    """
    return tuple(write(cached, new, cache_index) for cached, new in zip(cache, new_keys_values))


class KeyValueCache:
    """How a self-attention step keeps its keys and values: the `(keys, values)` pair, written at the step's index.

    The `cache_policy` a decoding step hands to `CachedMultiHeadAttention`
    (through `decode_step`). This one is the module docstring's pair,
    written by `write` (default `write_as_scatter`); a runtime that keeps
    its cache otherwise subclasses it and overrides `step`.

    Args:
        write: `(cached, new, cache_index) -> cached`, one tensor's write.
    """

    def __init__(self, write=write_as_scatter):
        self.write = write

    def step(self, layer, query, queries, cache, cache_index, attend):
        """`(outputs, cache)` of `layer`'s step on the new positions `query` (projected: `queries`).

        `attend(keys, values)` is the layer's attention of `queries` over
        the cached positions, heads combined; `layer` projects the new
        positions' keys and values (`project_step_keys_values`).
        """
        cache = write_cache(cache, layer.project_step_keys_values(query), cache_index, self.write)
        return attend(*cache), cache


@keras.saving.register_keras_serializable(package="keras_transformer")
class CachedMultiHeadAttention(MultiHeadAttention):
    """`MultiHeadAttention` that also decodes on a key/value cache (see the module docstring).

    Args:
        As for `MultiHeadAttention`.

    Call arguments:
        As for `MultiHeadAttention`, plus:
        cache: a `(keys, values)` pair, each `(batch, heads, length,
            head_dim)`: a self-attention cache (`empty_cache`) or a fixed
            context (`compute_cache`).
        cache_index: with `cache`, the number of cached positions: `query`
            holds the positions that follow (self-attention; `value` and
            `key` are not given). Without it the cache is a fixed context.
        cache_policy: with `cache_index`, how the step keeps its cache (a
            `KeyValueCache`; default: the pair, scattered).

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
             cache_policy=None):
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
            return self._attend_and_combine(queries, keys, values, mask, weight_scale, training), cache
        if value is not None or key is not None:
            raise ValueError("a decoding step attends to its own cache: pass no value or key with cache_index")
        if not self.decodes_on_its_own_cache:
            raise ValueError("predictive local attention is for a fixed context (cross-attention), not a decoding cache")

        def attend(keys, values):
            # Unfilled slots follow the last query: a causal mask hides them already.
            valid_key_length = None if use_causal_mask else cache_index + ops.shape(query)[1]
            # The cache's own slots stand for the keys; decoding produces no padding.
            mask, weight_scale = self._mask(
                query, ops.shape(queries)[2], ops.shape(keys)[2], query_mask, None, attention_mask, use_causal_mask,
                offset=cache_index, valid_key_length=valid_key_length,
            )
            return self._attend_and_combine(queries, keys, values, mask, weight_scale, training)

        return (cache_policy or KeyValueCache()).step(self, query, queries, cache, cache_index, attend)

    def _attend_and_combine(self, queries, keys, values, mask, weight_scale, training):
        """Attention of `queries` over `keys` and `values`, the heads combined: `(batch, query_length, d_model)`."""
        attended, _ = self._attend(queries, keys, values, mask, weight_scale, False, training)
        return combine_heads(attended, self.output_kernel, self.output_bias if self.use_bias else None)

    def _project_step_queries(self, query):
        """Q W^Q / sqrt(d_k) for a step's few queries, which are cheaper to scale than W^Q."""
        bias = self._weight(self.query_bias) if self.use_bias else None
        queries = project_heads(query, self._weight(self.query_kernel), bias, self.num_heads, self.head_dim)
        return queries * ops.cast(self.query_scale, self.compute_dtype)

    def project_step_keys_values(self, inputs):
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
