"""Scaled dot-product attention and multi-head attention (Section 3.2).

The paper's two equations:

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                    (1)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

`scaled_dot_product_attention` is equation (1), spelled out: it returns the
weights too, which TensorBoard's Attention tab and the attention explorer
show. `fused_dot_product_attention` hands the same equation to the backend's
own kernel (`keras.ops.dot_product_attention`: cuDNN or flash attention on a
GPU under JAX and PyTorch), which need not write the (query_length x
key_length) weights to memory at all; under TensorFlow that kernel is the
same einsums, so there the explicit path stays (BENCHMARKS.md, "Fused
attention").

`MultiHeadAttention` is the second equation: project, mask, attend, combine
the heads. Inside it, tensors keep heads on their own axis, `(batch, heads,
length, head_dim)`, so every head is one slice of a batched matrix product.

Two things build on this layer and live in their own modules:

* `local_attention`: a window of 2D+1 keys around a position each query
  predicts (Luong et al. 2015's local-p, `PredictiveLocalAttention`); the
  plain sliding window around the query's own position is this layer's
  `sliding_window`;
* `cached_attention`: decoding one token at a time on a cache of the earlier
  positions' keys and values (`CachedMultiHeadAttention`, which the decoder
  uses).
"""

import math

import keras
from keras import ops

from keras_transformer.layers.checks import check_heads_divide, check_positive_int, check_rate
from keras_transformer.layers.config import Hyperparameters
from keras_transformer.layers.masks import merge_attention_masks
from keras_transformer.layers.position_wise import matrix_product

# Masked logits are set to this before the softmax. The logits are cast to
# float32 first, so the value is safe under float16/bfloat16 compute dtypes
# (float16 cannot even represent -1e9) and exp() of it is exactly 0.
MASKED_LOGIT = -1e9

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
        # it so such a query (a padded one) mixes in nothing at all. (A float
        # maximum, not `any`: a mobile interpreter's boolean reductions may size a
        # scratch tensor at every run, which would make a decoding loop copy its
        # whole state.)
        has_keys = ops.max(ops.cast(mask, weights.dtype), axis=-1, keepdims=True)
        weights = weights * has_keys
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


# -- the heads' own axis --------------------------------------------------------------
#
# Each projection is one plain 2-D matrix product over all positions,
# (batch * length, d_model) x (d_model, parts * heads * head_dim), the shape
# CPU and GPU matmul kernels run fastest; a single transpose then puts heads
# on their own axis. The kernels keep their per-head shapes (and checkpoints
# their layout); they are only viewed as 2-D here.


def project_heads(inputs, kernel, bias, num_heads, head_dim, parts=1):
    """`inputs` (batch, length, d) times `kernel` (d, [parts,] heads, head_dim) -> `(batch, heads, length, head_dim)`;
    with `parts` > 1 (keys and values from one matmul), a tuple of that many."""
    width = parts * num_heads * head_dim
    projected = matrix_product(inputs, ops.reshape(kernel, (-1, width)))
    if bias is not None:
        # `ops.add` of a bias vector is TensorFlow's BiasAdd, which oneDNN
        # fuses into the matmul and whose gradient is one BiasAddGrad (a
        # plain `+` broadcasts, and its gradient is a general reduction).
        projected = ops.add(projected, ops.reshape(bias, (width,)))
    # A static length (1 for a decoding step) spares the graph its shape arithmetic.
    static_length = inputs.shape[1]
    length = static_length if static_length is not None else ops.shape(inputs)[1]
    if parts == 1 and static_length == 1:
        # One position: putting heads before it moves no data, a reshape is enough.
        return ops.reshape(projected, (-1, num_heads, 1, head_dim))
    if parts == 1:
        return ops.transpose(ops.reshape(projected, (-1, length, num_heads, head_dim)), (0, 2, 1, 3))
    projected = ops.reshape(projected, (-1, length, parts, num_heads, head_dim))
    # Unstacking (not slicing) keeps the backward pass to one stack.
    return tuple(ops.unstack(ops.transpose(projected, (2, 0, 3, 1, 4)), num=parts, axis=0))


def heads_last(attended):
    """`(batch, heads, length, head_dim)` -> `(batch, length, heads, head_dim)`."""
    if attended.shape[2] == 1:  # one position: a reshape, which moves no data
        _, heads, _, head_dim = ops.shape(attended)
        return ops.reshape(attended, (-1, 1, heads, head_dim))
    return ops.transpose(attended, (0, 2, 1, 3))


def combine_heads(attended, kernel, bias):
    """Concat(head_1, ..., head_h) W^O: `(batch, length, heads, head_dim)` -> `(batch, length, d_model)`."""
    heads, head_dim, output_dim = kernel.shape
    static_length = attended.shape[1]
    length = static_length if static_length is not None else ops.shape(attended)[1]
    concatenated = ops.reshape(attended, (-1, length, heads * head_dim))
    outputs = matrix_product(concatenated, ops.reshape(kernel, (-1, output_dim)))
    return outputs if bias is None else ops.add(outputs, bias)


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(Hyperparameters, keras.layers.Layer):
    """Multi-head attention (Section 3.2.2): project, attend on every head, combine.

    h heads each attend in a `head_dim`-sized projection of the inputs (d_k = d_v = d_model / h by
    default), and W^O maps the concatenated heads back to the query's feature size.

    Args:
        num_heads: number of heads h.
        key_dim: each head's query/key/value size (default: d_model // num_heads, which must divide).
        dropout: dropout rate on the attention weights.
        use_bias: whether the projections have biases.
        sliding_window: D: each query sees only the keys within D positions of its own (with the
            causal mask, the previous D); a window around a predicted position is `local_attention`'s.
        kernel_initializer, bias_initializer: initializers of the projections.

    Call arguments:
        query: `(batch, query_length, d_model)`.
        value: `(batch, key_length, d_value)`; omitted for self-attention.
        key: `(batch, key_length, d_value)`; defaults to `value`.
        query_mask, value_mask, key_mask: `(batch, length)` padding masks (default: the inputs' Keras masks).
        attention_mask: extra boolean mask, `(batch, q_len, k_len)` or rank 4.
        use_causal_mask: hide keys after each query (decoder self-attention).
        return_attention_scores: also return the weights `(batch, heads, query_length, key_length)`.
        training: whether attention dropout is active.

    Returns:
        `outputs (batch, query_length, d_model)`, or `(outputs, weights)` when `return_attention_scores`.

    Example:
    >>> attention = MultiHeadAttention(num_heads=8)
    >>> attention(keras.random.normal((2, 10, 512)), use_causal_mask=True).shape  # (2, 10, 512)
    """

    # Calls returning no weights use `fused_dot_product_attention`? None: on JAX and PyTorch, not TensorFlow.
    fused_attention = None
    hyperparameters = ("num_heads", "key_dim", "dropout", "use_bias", "sliding_window", "kernel_initializer",
                       "bias_initializer")

    def __init__(self, num_heads, key_dim=None, dropout=0.0, use_bias=True, sliding_window=None,
                 kernel_initializer="glorot_uniform", bias_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        optional = {"key_dim": key_dim, "sliding_window": sliding_window}
        check_positive_int(num_heads=num_heads, **{name: size for name, size in optional.items() if size is not None})
        check_rate(dropout=dropout)
        self.store_hyperparameters(locals())
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True
        self.seed_generator = keras.random.SeedGenerator()

    @classmethod
    def from_config(cls, config):
        return upgraded(cls, config) if "window_alignment" in config else super().from_config(config)

    def build(self, query_shape, value_shape=None, key_shape=None):
        query_dim = query_shape[-1]
        value_dim = query_dim if value_shape is None else value_shape[-1]
        if key_shape is not None and key_shape[-1] != value_dim:
            raise ValueError(f"key and value must have the same feature size; got key {key_shape[-1]} "
                             f"and value {value_dim}")
        if self.key_dim is None:
            check_heads_divide(query_dim, self.num_heads)
        self.head_dim = self.key_dim or query_dim // self.num_heads
        # Equation (1)'s 1/sqrt(d_k), folded into W^Q and its bias: cheaper than scaling every query.
        self.query_scale = 1.0 / math.sqrt(self.head_dim)
        heads, head_dim, kernel, bias = self.num_heads, self.head_dim, self.kernel_initializer, self.bias_initializer
        weight = self.add_weight
        # W^Q; W^K and W^V side by side, so K and V come from one matmul; W^O.
        self.query_kernel = weight(name="query_kernel", shape=(query_dim, heads, head_dim), initializer=kernel)
        self.key_value_kernel = weight(name="key_value_kernel", shape=(value_dim, 2, heads, head_dim),
                                       initializer=kernel)
        self.output_kernel = weight(name="output_kernel", shape=(heads, head_dim, query_dim), initializer=kernel)
        if self.use_bias:
            self.query_bias = weight(name="query_bias", shape=(heads, head_dim), initializer=bias)
            self.key_value_bias = weight(name="key_value_bias", shape=(2, heads, head_dim), initializer=bias)
            self.output_bias = weight(name="output_bias", shape=(query_dim,), initializer=bias)

    def call(self, query, value=None, key=None, query_mask=None, value_mask=None, key_mask=None, attention_mask=None,
             use_causal_mask=False, return_attention_scores=False, training=None):
        # 1. Project: Q W^Q / sqrt(d_k), K W^K, V W^V, each (batch, heads, length, head_dim).
        if value is None:
            # The fast path of self-attention: Q, K and V from one matmul by [W^Q W^K W^V].
            queries, keys, values = self._project_self_attention(query)
        else:
            queries = self._project_queries(query)
            keys, values = self._project_keys_values(value, key)
        # 2. Mask: which keys each query may see, broadcastable to (batch, heads, query_length, key_length).
        key_padding = key_mask if key_mask is not None else value_mask
        mask, weight_scale = self._mask(query, ops.shape(queries)[2], ops.shape(keys)[2], query_mask, key_padding,
                                        attention_mask, use_causal_mask)
        # 3. Attend: equation (1) per head -> (batch, query_length, heads, head_dim), weights or None.
        attended, weights = self._attend(queries, keys, values, mask, weight_scale, return_attention_scores, training)
        # 4. Combine: Concat(head_1, ..., head_h) W^O -> (batch, query_length, d_model).
        outputs = combine_heads(attended, self.output_kernel, self.output_bias if self.use_bias else None)
        return (outputs, weights) if return_attention_scores else outputs

    def _mask(self, query, query_length, key_length, query_mask, key_padding, attention_mask, causal, **decoding):
        """The boolean mask, and a scale of the weights (None; `local_attention`'s has one). `decoding`: a cached
        step's `offset` and `valid_key_length` (`cached_attention`, `masks.merge_attention_masks`)."""
        return merge_attention_masks(query_length, key_length, query_mask=query_mask, key_mask=key_padding,
                                     attention_mask=attention_mask, causal=causal, sliding_window=self.sliding_window,
                                     **decoding), None

    def _attend(self, queries, keys, values, mask, weight_scale, return_attention_scores, training):
        """Equation (1) on every head: `(attended (batch, query_length, heads, head_dim), weights or None)`."""
        fused = self.fused_attention
        fused = keras.backend.backend() in FUSED_ATTENTION_BACKENDS if fused is None else fused
        # The fused kernel returns no weights, drops none out and scales none.
        explicit = return_attention_scores or (bool(training) and self.dropout > 0) or weight_scale is not None
        if fused and not explicit:
            # The kernel leaves heads after the positions, where W^O wants them.
            return fused_dot_product_attention(queries, keys, values, mask=mask), None
        attended, weights = scaled_dot_product_attention(
            queries, keys, values, mask=mask, dropout_rate=self.dropout, training=training, seed=self.seed_generator,
            scale=1.0,  # folded into the queries' projection
            weight_scale=weight_scale,
        )
        return heads_last(attended), weights

    # -- projections ---------------------------------------------------------------

    def _weight(self, variable):
        # In the compute dtype, as `call` reads weights, for methods called outside it (`compute_cache`).
        return ops.cast(variable, self.compute_dtype)

    def _project_queries(self, query):
        """Q W^Q / sqrt(d_k): `(batch, heads, length, head_dim)`."""
        scale = ops.cast(self.query_scale, self.compute_dtype)
        bias = self._weight(self.query_bias) * scale if self.use_bias else None
        return project_heads(query, self._weight(self.query_kernel) * scale, bias, self.num_heads, self.head_dim)

    def _project_keys_values(self, value, key=None):
        """`(keys, values)`, each `(batch, heads, length, head_dim)`; one matmul when `key` is None."""
        kernel = self._weight(self.key_value_kernel)
        bias = self._weight(self.key_value_bias) if self.use_bias else None
        if key is None:
            return project_heads(value, kernel, bias, self.num_heads, self.head_dim, parts=2)
        return (project_heads(key, kernel[:, 0], None if bias is None else bias[0], self.num_heads, self.head_dim),
                project_heads(value, kernel[:, 1], None if bias is None else bias[1], self.num_heads, self.head_dim))

    def _project_self_attention(self, inputs):
        """Q, K and V of self-attention from one matmul with [W^Q W^K W^V]."""
        scale = ops.cast(self.query_scale, self.compute_dtype)
        kernel = ops.concatenate([self.query_kernel[:, None] * scale, self.key_value_kernel], axis=1)
        bias = ops.concatenate([self.query_bias[None] * scale, self.key_value_bias], axis=0) if self.use_bias else None
        return project_heads(inputs, kernel, bias, self.num_heads, self.head_dim, parts=3)

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return query_shape


def upgraded(cls, config):
    """A layer saved before predictive local attention had a class of its own, from its config.

    Its `window_alignment` said which: "predictive" is `local_attention`'s
    class now, whose weights come in the same order; "monotonic" is this one.
    The classes are found by their registered names: `local_attention`
    imports this module, not the other way round.
    """
    registered = lambda name: keras.saving.get_registered_object(f"keras_transformer>{name}")  # noqa: E731
    config = dict(config)
    if config.pop("window_alignment") == "predictive" and not issubclass(cls, registered("PredictiveLocalAttention")):
        if cls is not MultiHeadAttention:
            raise ValueError(f"a {cls.__name__} saved with window_alignment='predictive' does not load: a "
                             "decoder's attention is rebuilt from its DecoderLayer, so load the whole model")
        return registered("SavedAsMultiHeadAttention").from_config(config)
    return super(MultiHeadAttention, cls).from_config(config)
