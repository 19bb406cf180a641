"""Scaled dot-product attention and multi-head attention (Section 3.2).

The paper's two equations:

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                    (1)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

Tensors inside this module keep heads on their own axis, `(batch, heads,
length, key_dim)`, so every head is one slice of a batched matrix product and
"concatenate the heads, then multiply by W^O" is a single einsum.

**Local attention** (Luong et al. 2015, "Effective Approaches to
Attention-based Neural Machine Translation", Section 3.2) lets each query see
only a window of 2D+1 keys around an aligned position p_t:

* monotonic (`window_alignment="monotonic"`): p_t = t, the query's own
  position; a sliding window.
* predictive (`"predictive"`): each query predicts where it is aligned,

      p_t = S * sigmoid(v_p^T tanh(W_p h_t))        (S: the real keys' count)

  attends to the keys s within [p_t - D, p_t + D], and its weights are
  multiplied by a Gaussian centred there,

      a_t(s) = softmax(scores)_s * exp(-(s - p_t)^2 / (2 sigma^2)),  sigma = D / 2,

  which is what trains W_p and v_p: the window's edges have no gradient, the
  Gaussian does. Here every head predicts its own p_t (one column of v_p
  each). It depends on the query alone, so a decoding step computes it as a
  full pass does.

**The decoding cache.** Generating one token at a time, a decoder's new query
must attend to the keys and values of every earlier position. Recomputing them
each step is quadratic work; instead each attention layer keeps them in a
cache tensor of shape

    (2, batch, num_heads, max_length, key_dim)     [0] keys, [1] values

(keys and values on the leading axis, so that taking either one is a view,
not a copy).

* A *self-attention* cache starts as zeros (`MultiHeadAttention.empty_cache`).
  Each step passes `cache` and `cache_index` (how many positions are filled):
  the layer projects only the new positions, writes their keys and values at
  `cache_index`, and attends over the filled part.
  A cache may start with room for a few positions and grow as decoding
  goes on (`inference.steps` doubles the Transformer's): a step then copies
  and attends over about as many positions as it has written.
* A *cross-attention* cache holds the projected encoder output
  (`MultiHeadAttention.compute_cache`), computed once per source sentence;
  it is passed as `cache` with no `cache_index` and is never written. A
  `(keys, values)` pair serves as well (`inference.steps` keeps it so, the
  rows of both on axis 0).

**Two ways to compute equation (1).** `scaled_dot_product_attention` spells
it out, and returns the weights as well: TensorBoard's Attention tab, the
attention explorer and `translate_with_attention` read them. When no one
asks for the weights, `fused_dot_product_attention` hands the same equation
to the backend's own kernel (`keras.ops.dot_product_attention`: cuDNN or
flash attention on a GPU under JAX and PyTorch), which need not write the
(query_length x key_length) weights to memory at all. Under TensorFlow that
kernel is the same einsums as ours, so there the explicit path stays
(BENCHMARKS.md, "Fused attention").
"""

import math

import keras
from keras import ops

from keras_transformer.layers.checks import check_heads_divide, check_positive_int, check_rate
from keras_transformer.layers.config import Hyperparameters
from keras_transformer.layers.masks import merge_attention_masks

# Masked logits are set to this before the softmax. The logits are cast to
# float32 first, so the value is safe under float16/bfloat16 compute dtypes
# (float16 cannot even represent -1e9) and exp() of it is exactly 0.
MASKED_LOGIT = -1e9

MONOTONIC, PREDICTIVE = "monotonic", "predictive"
WINDOW_ALIGNMENTS = (MONOTONIC, PREDICTIVE)

# The backends whose `keras.ops.dot_product_attention` is a fused kernel.
FUSED_ATTENTION_BACKENDS = ("jax", "torch")


def _softmax_dtype(dtype):
    return "float64" if dtype == "float64" else "float32"


def scaled_dot_product_attention(
    queries, keys, values, mask=None, dropout_rate=0.0, training=False, seed=None, scale=None, weight_scale=None
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
        scale: the factor on Q K^T, 1 / sqrt(key_dim) by default.
            `MultiHeadAttention` folds it into W^Q and passes 1.
        weight_scale: optional factors broadcastable to the weights,
            multiplying them after the softmax (predictive local attention's
            Gaussian).

    Returns:
        `(outputs, weights)`: outputs `(..., query_length, value_dim)` in the
        dtype of `values`; weights `(..., query_length, key_length)` before
        dropout, each unmasked row summing to 1.

    Example:
    >>> q = k = v = keras.random.normal((2, 4, 8))
    >>> outputs, weights = scaled_dot_product_attention(q, k, v)
    >>> outputs.shape, weights.shape  # ((2, 4, 8), (2, 4, 4))
    """
    queries, keys, values = (ops.convert_to_tensor(tensor) for tensor in (queries, keys, values))
    if scale is None:
        # Without it the dot products grow with key_dim and push the softmax
        # into tiny gradients.
        scale = 1.0 / math.sqrt(queries.shape[-1])
    if scale != 1.0:
        # Scaling the queries (length x key_dim) is cheaper than scaling the
        # logits (length x length) and gives the same result.
        queries = queries * ops.cast(scale, queries.dtype)
    logits = ops.einsum("...qd,...kd->...qk", queries, keys)

    # The softmax runs in float32 even under mixed precision: it sums
    # exponentials, where float16/bfloat16 lose too much precision.
    logits = ops.cast(logits, _softmax_dtype(logits.dtype))
    if mask is not None:
        mask = ops.cast(mask, "bool")
        # Adding 0 or -1e9 (built at the mask's size, without the heads axis)
        # rather than selecting: the addition needs no backward pass.
        logits = logits + ops.cast(ops.where(mask, 0.0, MASKED_LOGIT), logits.dtype)
    weights = ops.softmax(logits, axis=-1)
    if mask is not None:
        # A row with every key masked has a uniform softmax over -1e9s; zero
        # it so such a query (a padded one) mixes in nothing at all.
        has_keys = ops.any(mask, axis=-1, keepdims=True)
        weights = weights * ops.cast(has_keys, weights.dtype)
    if weight_scale is not None:
        weights = weights * ops.cast(weight_scale, weights.dtype)
    weights = ops.cast(weights, values.dtype)

    attended = weights
    if training and dropout_rate > 0:
        attended = keras.random.dropout(weights, dropout_rate, seed=seed)
    outputs = ops.einsum("...qk,...kd->...qd", attended, values)
    return outputs, weights


def fused_dot_product_attention(queries, keys, values, mask=None):
    """Equation (1) by the backend's fused kernel: the outputs, not the weights.

    The same result as `scaled_dot_product_attention(..., scale=1.0)` (the
    queries come scaled) without dropout, in the layout the kernel works in.

    Args:
        queries: `(batch, heads, query_length, key_dim)`, already scaled.
        keys: `(batch, heads, key_length, key_dim)`.
        values: `(batch, heads, key_length, value_dim)`.
        mask: optional boolean, True = may attend, broadcastable to
            `(batch, heads, query_length, key_length)`.

    Returns:
        `(batch, query_length, heads, value_dim)`: heads after the positions,
        where the kernel leaves them and where W^O wants them. A query with
        every key masked gets zeros, as on the explicit path.

    Example:
    >>> q = k = v = keras.random.normal((2, 8, 4, 16))
    >>> fused_dot_product_attention(q, k, v).shape  # (2, 4, 8, 16)
    """
    has_keys = None
    if mask is not None:
        mask = ops.cast(mask, "bool")
        has_keys = ops.any(mask, axis=-1, keepdims=True)
        # A query with no key to see would get a uniform softmax from one
        # kernel and NaN from another. Let it see every key, then zero its
        # output: finite in both passes, and no gradient flows through it.
        mask = ops.logical_or(mask, ops.logical_not(has_keys))
    heads_last = (0, 2, 1, 3)  # (batch, heads, length, dim) <-> (batch, length, heads, dim)
    outputs = ops.dot_product_attention(
        ops.transpose(queries, heads_last),
        ops.transpose(keys, heads_last),
        ops.transpose(values, heads_last),
        mask=mask,
        scale=1.0,
    )
    if has_keys is not None:
        outputs = ops.where(ops.transpose(has_keys, heads_last), outputs, ops.zeros_like(outputs))
    return outputs


def _write_cache(cache, keys_values, cache_index):
    """Write new keys/values `(batch, new, 2, heads, key_dim)` at `cache_index`.

    The new positions come in the layout their projection produces (one
    matmul with [W^K W^V], see `_project_new_keys_values`): no transpose into
    the cache's `(2, batch, heads, length, key_dim)` is needed, because a
    scatter takes every slot's place from its index. XLA (JAX's jit, or
    TensorFlow's `jit_compile`) writes a scatter into the cache in place, and
    compiles it with the positions as data, not shapes. The slots go as a
    list of `(part, row, head, position)` indices, one per update row,
    listed in the new values' own order: the form every backend's scatter
    reads alike. TensorFlow without XLA writes differently:
    `_write_cache_in_place`.
    """
    if keras.backend.backend() == "tensorflow" and not _compiling_with_xla():
        return _write_cache_in_place(cache, keys_values, cache_index)
    rows, new_length, parts, heads = (ops.shape(keys_values)[axis] for axis in range(4))
    # An "ij" grid walks the update rows in their own order: row, position, part, head.
    row_of, position_of, part_of, head_of = ops.meshgrid(
        ops.arange(rows), ops.arange(new_length) + cache_index, ops.arange(parts), ops.arange(heads), indexing="ij"
    )
    slots = ops.reshape(ops.stack([part_of, row_of, head_of, position_of], axis=-1), (-1, 4))
    return ops.scatter_update(cache, slots, ops.reshape(keys_values, (-1, ops.shape(keys_values)[4])))


def _write_cache_in_place(cache, keys_values, cache_index):
    """`_write_cache` for TensorFlow without XLA: one slice update, in place where nothing else holds the cache.

    TensorFlow's scatter (`TensorScatterUpdate`) copies its whole input
    before writing, even where nothing else reads it: every layer's cache,
    at every decoding step. Its strided-slice update writes into its input
    whenever it holds the only reference, as a decoding step's cache inside
    a `tf.function` does (eagerly the caller still holds it, and it is
    copied as before). The new positions are transposed into the cache's
    order first: a copy of their own size, not of the cache's
    (BENCHMARKS.md, "The same on this machine, change by change"). XLA
    compiles that op only for slice bounds known when compiling, and
    `cache_index` is data, so under XLA the scatter stays.
    """
    import tensorflow as tf

    parts, rows, heads, length, key_dim = tf.unstack(tf.shape(cache))
    new_length = tf.shape(keys_values)[1]
    cache_index = tf.cast(cache_index, key_dim.dtype)
    # Seen as one line of length * key_dim values per (part, row, head), the
    # new positions are one block of columns: a two-axis slice, the cheapest
    # for TensorFlow's slice kernel to address.
    lines = parts * rows * heads
    new_columns = tf.reshape(tf.transpose(keys_values, (2, 0, 3, 1, 4)), tf.stack([lines, new_length * key_dim]))
    written = tf.raw_ops.TensorStridedSliceUpdate(
        input=tf.reshape(cache, tf.stack([lines, length * key_dim])),
        begin=tf.stack([0, cache_index * key_dim]),
        end=tf.stack([lines, (cache_index + new_length) * key_dim]),
        strides=[1, 1],
        value=new_columns,
    )
    return tf.reshape(written, tf.shape(cache))


def _compiling_with_xla():
    """Whether TensorFlow is tracing for XLA (`jit_compile=True`), here or in a function around this one.

    TensorFlow's auto-clustering (`TF_XLA_FLAGS=--tf_xla_auto_jit`) is not
    seen here; it would compile the slice update anew for each step.
    """
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util  # the check tf.function itself uses

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(Hyperparameters, keras.layers.Layer):
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
        sliding_window: if set to D, local attention: each query sees keys
            within D positions of its aligned position (with the causal mask
            and monotonic alignment, the previous D).
        window_alignment: where the window is centred: "monotonic" (the
            query's own position) or "predictive" (a position each query
            predicts, with Gaussian weights; see the module docstring).
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

    Attributes:
        fused_attention: whether a call that returns no weights computes
            them with the backend's fused kernel (`fused_dot_product_attention`).
            None, the default, means yes on JAX and PyTorch, no on TensorFlow.
            Attention dropout and predictive windows always take the explicit
            path, which they need.

    Example:
    >>> attention = MultiHeadAttention(num_heads=8)
    >>> x = keras.random.normal((2, 10, 512))
    >>> attention(x, x, use_causal_mask=True).shape  # (2, 10, 512)
    """

    fused_attention = None

    hyperparameters = (
        "num_heads",
        "key_dim",
        "dropout",
        "use_bias",
        "sliding_window",
        "window_alignment",
        "kernel_initializer",
        "bias_initializer",
    )

    def __init__(
        self,
        num_heads,
        key_dim=None,
        dropout=0.0,
        use_bias=True,
        sliding_window=None,
        window_alignment="monotonic",
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
        if window_alignment not in WINDOW_ALIGNMENTS:
            raise ValueError(f"window_alignment must be one of {WINDOW_ALIGNMENTS}, got {window_alignment!r}")
        if window_alignment == PREDICTIVE and sliding_window is None:
            raise ValueError("window_alignment='predictive' needs sliding_window, the window's half-width D")
        check_rate(dropout=dropout)
        self.store_hyperparameters(locals())
        # Names such as "glorot_uniform" become initializer objects (saved as their config).
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
        if self.window_alignment == PREDICTIVE:
            # W_p and v_p of p_t = S sigmoid(v_p^T tanh(W_p h_t)); one v_p column per head.
            self.alignment_kernel = weight("alignment_kernel", (query_dim, query_dim), self.kernel_initializer)
            self.alignment_vector = weight("alignment_vector", (query_dim, heads), self.kernel_initializer)

    # -- projections -------------------------------------------------------

    def _weight(self, variable):
        # Inside `call` Keras already reads weights in the compute dtype; the
        # cache helpers run outside it and must produce that dtype too.
        return ops.cast(variable, self.compute_dtype)

    # Each projection is one plain 2-D matrix product over all positions,
    # (batch * length, d_model) x (d_model, parts * heads * head_dim), the
    # shape CPU and GPU matmul kernels run fastest; a single transpose then
    # puts heads on their own axis. The kernels keep their per-head shapes
    # (and checkpoints their layout); they are only viewed as 2-D here.

    def _project(self, inputs, kernel, bias, parts=1):
        """`inputs` (batch, length, d) -> `(batch, heads, length, head_dim)`;
        with `parts` > 1, that many such tensors stacked on a new leading axis."""
        width = parts * self.num_heads * self.head_dim
        projected = ops.matmul(inputs, ops.reshape(kernel, (-1, width)))
        if self.use_bias:
            # `ops.add` of a bias vector is TensorFlow's BiasAdd, which oneDNN
            # fuses into the matmul and whose gradient is one BiasAddGrad (a
            # plain `+` broadcasts, and its gradient is a general reduction).
            projected = ops.add(projected, ops.reshape(bias, (width,)))
        # A static length (1 for a decoding step) spares the graph its shape arithmetic.
        static_length = inputs.shape[1]
        length = static_length if static_length is not None else ops.shape(inputs)[1]
        heads, head_dim = self.num_heads, self.head_dim
        if parts == 1 and static_length == 1:
            # One position: putting heads before it moves no data, a reshape is enough.
            return ops.reshape(projected, (-1, heads, 1, head_dim))
        if parts == 1:
            return ops.transpose(ops.reshape(projected, (-1, length, heads, head_dim)), (0, 2, 1, 3))
        projected = ops.reshape(projected, (-1, length, parts, heads, head_dim))
        return ops.transpose(projected, (2, 0, 3, 1, 4))

    def _split(self, projected, parts):
        # Unstacking (not slicing) keeps the backward pass to one stack.
        return tuple(ops.unstack(projected, num=parts, axis=0))

    # Equation (1)'s 1/sqrt(d_k) is folded into W^Q (and its bias): scaling
    # a d_model x d_model matrix is cheaper than scaling every query, except
    # in a decoding step, whose one query per sentence is the smaller.

    def _query_scale(self):
        return 1.0 / math.sqrt(self.head_dim)

    def _project_queries(self, query, scale_outputs=False):
        """Q W^Q / sqrt(d_k); `scale_outputs` scales the few queries of a decoding step instead of W^Q."""
        scale = ops.cast(self._query_scale(), self.compute_dtype)
        kernel = self._weight(self.query_kernel)
        bias = self._weight(self.query_bias) if self.use_bias else None
        if scale_outputs:
            return self._project(query, kernel, bias) * scale
        return self._project(query, kernel * scale, None if bias is None else bias * scale)

    def _project_keys_values(self, value, key=None):
        """`(keys, values)`, each `(batch, heads, length, head_dim)`."""
        kernel = self._weight(self.key_value_kernel)
        bias = self._weight(self.key_value_bias) if self.use_bias else None
        if key is None or key is value:
            return self._split(self._project(value, kernel, bias, parts=2), parts=2)
        keys = self._project(key, kernel[:, 0], None if bias is None else bias[0])
        values = self._project(value, kernel[:, 1], None if bias is None else bias[1])
        return keys, values

    def _project_new_keys_values(self, inputs):
        """A decoding step's K and V from one matmul with [W^K W^V]: `(batch, new, 2, heads, head_dim)`.

        Left in the matmul's own layout, which the cache's scatter reads as
        it is (`_write_cache`): taking K and V apart here would copy them,
        and slicing the kernel would copy it.
        """
        width = 2 * self.num_heads * self.head_dim
        projected = ops.matmul(inputs, ops.reshape(self._weight(self.key_value_kernel), (-1, width)))
        if self.use_bias:
            projected = ops.add(projected, ops.reshape(self._weight(self.key_value_bias), (width,)))
        return ops.reshape(projected, (-1, ops.shape(inputs)[1], 2, self.num_heads, self.head_dim))

    def _project_self_attention(self, inputs):
        """Q, K and V of self-attention from one matmul with [W^Q W^K W^V]."""
        scale = ops.cast(self._query_scale(), self.compute_dtype)
        kernel = ops.concatenate([self.query_kernel[:, None] * scale, self.key_value_kernel], axis=1)
        bias = None
        if self.use_bias:
            bias = ops.concatenate([self.query_bias[None] * scale, self.key_value_bias], axis=0)
        return self._split(self._project(inputs, kernel, bias, parts=3), parts=3)

    def _combine_heads(self, attended, heads_first=True):
        """Concat(head_1, ..., head_h) W^O: `(batch, heads, length, head_dim)` -> `(batch, length, d_model)`.

        With `heads_first=False`, `attended` is `(batch, length, heads, head_dim)` already.
        """
        width = self.num_heads * self.head_dim
        length_axis = 2 if heads_first else 1
        static_length = attended.shape[length_axis]
        length = static_length if static_length is not None else ops.shape(attended)[length_axis]
        if heads_first and static_length != 1:  # one position: the transpose would move no data
            attended = ops.transpose(attended, (0, 2, 1, 3))
        concatenated = ops.reshape(attended, (-1, length, width))
        outputs = ops.matmul(concatenated, ops.reshape(self.output_kernel, (-1, self.output_dim)))
        if self.use_bias:
            outputs = ops.add(outputs, self.output_bias)
        return outputs

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

    # -- predictive local attention ------------------------------------------

    def aligned_positions(self, query, key_mask, key_length):
        """p_t = S sigmoid(v_p^T tanh(W_p h_t)): `(batch, heads, query_length)` float32 positions in [0, S].

        S is each sentence's number of real keys (from `key_mask`), or
        `key_length` when nothing is padded.
        """
        hidden = ops.tanh(ops.matmul(query, self._weight(self.alignment_kernel)))
        fraction = ops.sigmoid(ops.cast(ops.matmul(hidden, self._weight(self.alignment_vector)), "float32"))
        if key_mask is None:
            source_length = ops.cast(key_length, "float32")
        else:
            source_length = ops.sum(ops.cast(key_mask, "float32"), axis=-1)[:, None, None]
        return ops.transpose(source_length * fraction, (0, 2, 1))

    def _predictive_window(self, query, key_mask, key_length):
        """The window `(batch, heads, q, k)` around each query's p_t, and the Gaussian on its weights."""
        positions = self.aligned_positions(query, key_mask, key_length)[..., None]
        distance = ops.cast(ops.arange(key_length), "float32")[None, None, None, :] - positions
        window = ops.abs(distance) <= self.sliding_window
        sigma = self.sliding_window / 2.0
        return window, ops.exp(-ops.square(distance) / (2.0 * sigma * sigma))

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
        queries, new_keys_values = None, None
        if cache is not None and cache_index is None:
            # Cross-attention on a precomputed context: nothing to project.
            keys, values = cache[0], cache[1]
        elif cache is not None and (value is None or value is query) and key is None:
            # A decoding step: a token or a few. Q comes from its own matmul
            # (no per-step concatenation of [W^Q W^K W^V]); K and V from one.
            new_keys_values = self._project_new_keys_values(query)
        elif value is None or (value is query and key is None):
            queries, keys, values = self._project_self_attention(query)
        else:
            keys, values = self._project_keys_values(value, key)
        if queries is None:
            queries = self._project_queries(query, scale_outputs=cache is not None)

        offset, valid_key_length = 0, None
        if cache is not None and cache_index is not None and self.window_alignment == PREDICTIVE:
            # p_t scales with the key count, which a growing self-attention cache does not have yet.
            raise ValueError("predictive local attention is for a fixed context (cross-attention), not a decoding cache")
        if cache is not None and cache_index is not None:
            if new_keys_values is None:  # (batch, heads, new, key_dim) each -> (batch, new, 2, heads, key_dim)
                new_keys_values = ops.transpose(ops.stack([keys, values], axis=0), (1, 3, 0, 2, 4))
            cache = _write_cache(cache, new_keys_values, cache_index)
            keys, values = cache[0], cache[1]
            offset = cache_index
            if not use_causal_mask:
                # Unfilled slots follow the last query: a causal mask hides them already.
                valid_key_length = cache_index + ops.shape(query)[1]
            # The cache's own slots stand for the keys; the new tokens' masks
            # do not line up with them. Decoding produces no padding.
            value_mask = key_mask = None

        padding = key_mask if key_mask is not None else value_mask
        predictive = self.window_alignment == PREDICTIVE
        mask = merge_attention_masks(
            ops.shape(queries)[2],
            ops.shape(keys)[2],
            query_mask=query_mask,
            key_mask=padding,
            attention_mask=attention_mask,
            causal=use_causal_mask,
            # A predicted window is not one around the query's own position.
            sliding_window=None if predictive else self.sliding_window,
            offset=offset,
            valid_key_length=valid_key_length,
        )
        gaussian = None
        if predictive:
            window, gaussian = self._predictive_window(query, padding, ops.shape(keys)[2])
            mask = window if mask is None else ops.logical_and(mask, window)
        if self._use_fused_attention(return_attention_scores, training, predictive):
            attended = fused_dot_product_attention(queries, keys, values, mask=mask)
            outputs, weights = self._combine_heads(attended, heads_first=False), None
        else:
            attended, weights = scaled_dot_product_attention(
                queries,
                keys,
                values,
                mask=mask,
                dropout_rate=self.dropout,
                training=training,
                seed=self.seed_generator,
                scale=1.0,
                weight_scale=gaussian,
            )
            outputs = self._combine_heads(attended)

        results = (outputs,)
        if return_attention_scores:
            results += (weights,)
        if cache is not None:
            results += (cache,)
        return results[0] if len(results) == 1 else results

    def _use_fused_attention(self, return_attention_scores, training, predictive):
        fused = self.fused_attention
        if fused is None:
            fused = keras.backend.backend() in FUSED_ATTENTION_BACKENDS
        # The kernel returns no weights, drops none out and scales none by a Gaussian.
        attention_dropout = bool(training) and self.dropout > 0
        return fused and not (return_attention_scores or attention_dropout or predictive)

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return query_shape
