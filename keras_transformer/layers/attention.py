"""Scaled dot-product attention and multi-head attention (Section 3.2).

The paper's two equations:

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                    (1)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

Tensors inside this module keep heads on their own axis, `(batch, heads,
length, key_dim)`, so every head is one slice of a batched matrix product and
"concatenate the heads, then multiply by W^O" is a single einsum.

**The decoding cache.** Generating one token at a time, a decoder's new query
must attend to the keys and values of every earlier position. Recomputing them
each step is quadratic work; instead each attention layer keeps them in a
cache tensor of shape

    (batch, 2, num_heads, max_length, key_dim)     [:, 0] keys, [:, 1] values

* A *self-attention* cache starts as zeros (`MultiHeadAttention.empty_cache`).
  Each step passes `cache` and `cache_index` (how many positions are filled):
  the layer projects only the new positions, writes their keys and values at
  `cache_index`, and attends over the filled part.
* A *cross-attention* cache holds the projected encoder output
  (`MultiHeadAttention.compute_cache`), computed once per source sentence;
  it is passed as `cache` with no `cache_index` and is never written.
"""

import math

import keras
from keras import ops

from keras_transformer.layers.checks import check_heads_divide, check_positive_int, check_rate
from keras_transformer.layers.masks import merge_attention_masks

# Masked logits are set to this before the softmax. The logits are cast to
# float32 first, so the value is safe under float16/bfloat16 compute dtypes
# (float16 cannot even represent -1e9) and exp() of it is exactly 0.
MASKED_LOGIT = -1e9


def _softmax_dtype(dtype):
    return "float64" if dtype == "float64" else "float32"


def scaled_dot_product_attention(
    queries, keys, values, mask=None, dropout_rate=0.0, training=False, seed=None
):
    """Equation (1): softmax(Q K^T / sqrt(d_k)) V.

    Args:
        queries: `(..., query_length, key_dim)`.
        keys: `(..., key_length, key_dim)`.
        values: `(..., key_length, value_dim)`.
        mask: optional boolean, True = may attend, broadcastable to
            `(..., query_length, key_length)` (for example `(batch, heads,
            q_len, k_len)`). A query whose keys are all masked gets zero
            weights and a zero output, never NaN.
        dropout_rate: dropout on the attention weights (used in training).
        training: whether dropout is applied.
        seed: a `keras.random.SeedGenerator` for the dropout.

    Returns:
        `(outputs, weights)`: outputs `(..., query_length, value_dim)` in the
        dtype of `values`; weights `(..., query_length, key_length)` before
        dropout, each unmasked row summing to 1.

    Example:
    >>> q = k = v = keras.random.normal((2, 4, 8))
    >>> outputs, weights = scaled_dot_product_attention(q, k, v)
    >>> outputs.shape, weights.shape  # ((2, 4, 8), (2, 4, 4))
    """
    key_dim = queries.shape[-1]
    # Scaling the queries (length x key_dim) is cheaper than scaling the
    # logits (length x length) and gives the same result. Without it the dot
    # products grow with key_dim and push the softmax into tiny gradients.
    queries = queries * ops.cast(1.0 / math.sqrt(key_dim), queries.dtype)
    logits = ops.einsum("...qd,...kd->...qk", queries, keys)

    # The softmax runs in float32 even under mixed precision: it sums
    # exponentials, where float16/bfloat16 lose too much precision.
    logits = ops.cast(logits, _softmax_dtype(logits.dtype))
    if mask is not None:
        mask = ops.cast(mask, "bool")
        logits = ops.where(mask, logits, ops.cast(MASKED_LOGIT, logits.dtype))
    weights = ops.softmax(logits, axis=-1)
    if mask is not None:
        # A fully masked row has a uniform softmax over -1e9s; zero it so
        # such a query (a padded one) mixes in nothing at all.
        weights = ops.where(mask, weights, ops.zeros_like(weights))
    weights = ops.cast(weights, values.dtype)

    attended = weights
    if training and dropout_rate > 0:
        attended = keras.random.dropout(weights, dropout_rate, seed=seed)
    outputs = ops.einsum("...qk,...kd->...qd", attended, values)
    return outputs, weights


def _write_cache(cache, keys, values, cache_index):
    """Write new keys/values `(batch, heads, new, key_dim)` at `cache_index`.

    Built from gather + select rather than a dynamic-update-slice so that the
    graph uses only core ops, which every TensorFlow Serving build runs.
    """
    max_length = cache.shape[3] if cache.shape[3] is not None else ops.shape(cache)[3]
    new_length = ops.shape(keys)[2]
    positions = ops.arange(max_length)
    in_window = ops.logical_and(
        positions >= cache_index, positions < cache_index + new_length
    )
    source_index = ops.clip(positions - cache_index, 0, new_length - 1)
    updates = ops.take(ops.stack([keys, values], axis=1), source_index, axis=3)
    return ops.where(in_window[None, None, None, :, None], updates, cache)


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention (Section 3.2.2), with masks and a decoding cache.

    h heads each attend in a `key_dim`-sized projection of the inputs
    (d_k = d_v = d_model / h by default), and W^O maps the concatenated heads
    back to the query's feature size. When the query is also the key and
    value (self-attention) the three projections run as one fused matmul.

    Args:
        num_heads: number of heads h.
        key_dim: size of each head's query/key/value projection. Defaults to
            d_model // num_heads, which requires num_heads to divide d_model.
        dropout: dropout rate on the attention weights.
        use_bias: whether the projections have biases.
        sliding_window: if set to w, local attention: each query sees keys
            within w positions (with the causal mask, the previous w).
        kernel_initializer, bias_initializer: initializers of the projections.

    Call arguments:
        query: `(batch, query_length, d_model)`.
        value: `(batch, key_length, d_value)`; omitted for self-attention.
        key: `(batch, key_length, d_value)`; defaults to `value`.
        query_mask, value_mask, key_mask: `(batch, length)` padding masks;
            filled in from the inputs' Keras masks when not given.
        attention_mask: extra boolean mask, `(batch, q_len, k_len)` or rank 4.
        use_causal_mask: hide keys after each query (decoder self-attention).
        return_attention_scores: also return the weights `(batch, heads,
            query_length, key_length)`.
        training: whether attention dropout is active.
        cache: a cache tensor (see the module docstring).
        cache_index: with `cache`, the number of cached positions; the query
            holds the positions that follow. Without it the cache is static
            (cross-attention) and `value`/`key` are not used.

    Returns:
        `outputs (batch, query_length, d_model)`, followed by the attention
        weights when `return_attention_scores`, followed by the updated cache
        when `cache` is given.

    Example:
    >>> attention = MultiHeadAttention(num_heads=8)
    >>> x = keras.random.normal((2, 10, 512))
    >>> attention(x, x, use_causal_mask=True).shape  # (2, 10, 512)
    """

    def __init__(
        self,
        num_heads,
        key_dim=None,
        dropout=0.0,
        use_bias=True,
        sliding_window=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int(num_heads=num_heads)
        if key_dim is not None:
            check_positive_int(key_dim=key_dim)
        if sliding_window is not None:
            check_positive_int(sliding_window=sliding_window)
        check_rate(dropout=dropout)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.dropout = dropout
        self.use_bias = use_bias
        self.sliding_window = sliding_window
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True
        self.seed_generator = keras.random.SeedGenerator()

    def build(self, query_shape, value_shape=None, key_shape=None):
        query_dim = query_shape[-1]
        value_dim = query_dim if value_shape is None else value_shape[-1]
        if key_shape is not None and key_shape[-1] != value_dim:
            raise ValueError(
                f"key and value must have the same feature size; got key {key_shape[-1]} "
                f"and value {value_dim}"
            )
        if self.key_dim is None:
            check_heads_divide(query_dim, self.num_heads)
            self.head_dim = query_dim // self.num_heads
        else:
            self.head_dim = self.key_dim
        self.output_dim = query_dim

        def weight(name, shape, initializer):
            return self.add_weight(name=name, shape=shape, initializer=initializer)

        heads, head_dim = self.num_heads, self.head_dim
        # W^Q; W^K and W^V side by side, so K and V come from one matmul.
        self.query_kernel = weight("query_kernel", (query_dim, heads, head_dim), self.kernel_initializer)
        self.key_value_kernel = weight(
            "key_value_kernel", (value_dim, 2, heads, head_dim), self.kernel_initializer
        )
        self.output_kernel = weight("output_kernel", (heads, head_dim, query_dim), self.kernel_initializer)
        if self.use_bias:
            self.query_bias = weight("query_bias", (heads, head_dim), self.bias_initializer)
            self.key_value_bias = weight("key_value_bias", (2, heads, head_dim), self.bias_initializer)
            self.output_bias = weight("output_bias", (query_dim,), self.bias_initializer)

    # -- projections -------------------------------------------------------

    def _weight(self, variable):
        # Inside `call` Keras already reads weights in the compute dtype; the
        # cache helpers run outside it and must produce that dtype too.
        return ops.cast(variable, self.compute_dtype)

    def _project_queries(self, query):
        queries = ops.einsum("btd,dhk->bhtk", query, self._weight(self.query_kernel))
        if self.use_bias:
            queries = queries + self._weight(self.query_bias)[None, :, None, :]
        return queries

    def _project_keys_values(self, value, key=None):
        """`(batch, 2, heads, length, head_dim)`: keys at [:, 0], values at [:, 1]."""
        kernel = self._weight(self.key_value_kernel)
        if key is None or key is value:
            keys_values = ops.einsum("btd,dshk->bshtk", value, kernel)
        else:
            keys = ops.einsum("btd,dhk->bhtk", key, kernel[:, 0])
            values = ops.einsum("btd,dhk->bhtk", value, kernel[:, 1])
            keys_values = ops.stack([keys, values], axis=1)
        if self.use_bias:
            keys_values = keys_values + self._weight(self.key_value_bias)[None, :, :, None, :]
        return keys_values

    def _project_self_attention(self, inputs):
        """Q, K and V of self-attention from one matmul with [W^Q W^K W^V]."""
        kernel = ops.concatenate([self.query_kernel[:, None], self.key_value_kernel], axis=1)
        projected = ops.einsum("btd,dshk->sbhtk", inputs, kernel)
        if self.use_bias:
            bias = ops.concatenate([self.query_bias[None], self.key_value_bias], axis=0)
            projected = projected + bias[:, None, :, None, :]
        return projected[0], projected[1], projected[2]

    def compute_cache(self, value, key=None):
        """Project a fixed context once: the cross-attention cache."""
        value = ops.cast(value, self.compute_dtype)
        key = None if key is None else ops.cast(key, self.compute_dtype)
        return self._project_keys_values(value, key)

    def empty_cache(self, batch_size, max_length, dtype=None):
        """A zero self-attention cache for `max_length` positions."""
        return ops.zeros(
            (batch_size, 2, self.num_heads, max_length, self.head_dim),
            dtype=dtype or self.compute_dtype,
        )

    # -- the call ----------------------------------------------------------

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
        queries = None
        if cache is not None and cache_index is None:
            # Cross-attention on a precomputed context: nothing to project.
            keys, values = cache[:, 0], cache[:, 1]
        elif value is None or (value is query and key is None):
            queries, keys, values = self._project_self_attention(query)
        else:
            keys_values = self._project_keys_values(value, key)
            keys, values = keys_values[:, 0], keys_values[:, 1]
        if queries is None:
            queries = self._project_queries(query)

        offset, valid_key_length = 0, None
        if cache is not None and cache_index is not None:
            cache = _write_cache(cache, keys, values, cache_index)
            keys, values = cache[:, 0], cache[:, 1]
            offset = cache_index
            valid_key_length = cache_index + ops.shape(query)[1]
            # The cache's own slots stand for the keys; the new tokens' masks
            # do not line up with them. Decoding produces no padding.
            value_mask = key_mask = None

        padding = key_mask if key_mask is not None else value_mask
        mask = merge_attention_masks(
            ops.shape(queries)[2],
            ops.shape(keys)[2],
            query_mask=query_mask,
            key_mask=padding,
            attention_mask=attention_mask,
            causal=use_causal_mask,
            sliding_window=self.sliding_window,
            offset=offset,
            valid_key_length=valid_key_length,
        )
        attended, weights = scaled_dot_product_attention(
            queries,
            keys,
            values,
            mask=mask,
            dropout_rate=self.dropout,
            training=training,
            seed=self.seed_generator,
        )
        # Concat(head_1, ..., head_h) W^O as one contraction over heads.
        outputs = ops.einsum("bhtk,hkd->btd", attended, self.output_kernel)
        if self.use_bias:
            outputs = outputs + self.output_bias

        results = (outputs,)
        if return_attention_scores:
            results += (weights,)
        if cache is not None:
            results += (cache,)
        return results[0] if len(results) == 1 else results

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return query_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "sliding_window": self.sliding_window,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
