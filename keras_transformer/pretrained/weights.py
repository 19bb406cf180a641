"""Copying a BART-family checkpoint's weights into our layers (Marian, M2M100 and NLLB share the names).

PyTorch's `Linear` stores `(out, in)` and computes `x W^T + b`; our layers
store kernels `(in, out)`, split per head where attention needs it:

    q_proj.weight (d, d)   -> query_kernel      (d, heads, head_dim)   = W_q^T, split
    k_proj, v_proj         -> key_value_kernel  (d, 2, heads, head_dim)
    out_proj.weight (d, d) -> output_kernel     (heads, head_dim, d)
    fc1 / fc2              -> feed_forward.hidden / .projection
    *_layer_norm           -> the sub-layer's `norm` (pre- or post-LN alike)

A layer of theirs has self_attn (+ encoder_attn in the decoder) and fc1/fc2,
each with its LayerNorm, exactly our sub-layers. Every assignment checks the
shape, so a wrong mapping fails loudly here, not quietly in a translation.
"""

import numpy as np

from keras_transformer.text.sentencepiece import ID_OFFSET


class WeightReader:
    """The checkpoint's tensors by name, each used at most once; `unused()` names what nothing read."""

    def __init__(self, weights):
        self.weights = weights
        self.used = set()

    def __call__(self, name):
        self._use(name)
        return self.weights[name]

    def shape(self, name):
        self._use(name)
        return self.weights.shape(name) if hasattr(self.weights, "shape") else np.shape(self.weights[name])

    def row_blocks(self, name, rows_at_once):
        """`(first row, rows)` of the tensor `name`, read a block at a time where the file allows it."""
        self._use(name)
        if hasattr(self.weights, "row_blocks"):
            return self.weights.row_blocks(name, rows_at_once)
        tensor = self.weights[name]
        return ((start, tensor[start : start + rows_at_once]) for start in range(0, len(tensor), rows_at_once))

    def _use(self, name):
        if name not in self.weights:
            from keras_transformer.pretrained.checkpoint import CheckpointError

            raise CheckpointError(f"the checkpoint has no weight {name!r}: is it complete?")
        self.used.add(name)

    def has(self, name):
        return name in self.weights

    def unused(self):
        return sorted(set(self.weights.keys()) - self.used)


# Rows of an embedding table copied in one piece (16 MiB at d_model 512).
EMBEDDING_ROWS_AT_ONCE = 8192


def assign(variable, value, name):
    value = np.asarray(value, np.float32)
    if tuple(variable.shape) != value.shape:
        raise ValueError(f"{name}: the checkpoint's shape {value.shape} does not fit {tuple(variable.shape)}")
    variable.assign(value)


def assign_embeddings(variable, read, name):
    """The checkpoint's `(vocab, d)` embeddings `name` into our `(vocab + 1, d)` table: row 0 (our padding) zeros, theirs after.

    Read and written a block of rows at a time, scattering rows into the
    variable: the largest matrix of a checkpoint is never whole in memory
    beside it. (A sliced `assign` would read the variable first, and
    TensorFlow copies a variable that something else reads before writing
    into it.)
    """
    import tensorflow as tf

    shape = read.shape(name)
    if tuple(variable.shape) != (shape[0] + ID_OFFSET, shape[1]):
        raise ValueError(f"{name}: the checkpoint's shape {shape} does not fit {tuple(variable.shape)}")
    table = variable.value  # the backend's variable, which takes a scatter
    table.scatter_update(tf.IndexedSlices(np.zeros((ID_OFFSET, shape[1]), np.float32), tf.range(ID_OFFSET)))
    for start, rows in read.row_blocks(name, EMBEDDING_ROWS_AT_ONCE):
        positions = tf.range(ID_OFFSET + start, ID_OFFSET + start + rows.shape[0])
        table.scatter_update(tf.IndexedSlices(np.asarray(rows, np.float32), positions))


def set_dense(dense, read, prefix):
    assign(dense.kernel, read(f"{prefix}.weight").T, f"{prefix}.weight")
    assign(dense.bias, read(f"{prefix}.bias"), f"{prefix}.bias")


def set_norm(norm, read, prefix):
    assign(norm.gamma, read(f"{prefix}.weight"), f"{prefix}.weight")
    assign(norm.beta, read(f"{prefix}.bias"), f"{prefix}.bias")


def set_attention(attention, read, prefix):
    """q/k/v/out projections of `prefix` (e.g. "model.encoder.layers.0.self_attn") into a `MultiHeadAttention`."""
    heads, head_dim = attention.num_heads, attention.head_dim

    def split_in_heads(name):  # (out, in) -> (in, heads, head_dim)
        return read(f"{prefix}.{name}.weight").T.reshape(-1, heads, head_dim)

    def heads_bias(name):
        return read(f"{prefix}.{name}.bias").reshape(heads, head_dim)

    assign(attention.query_kernel, split_in_heads("q_proj"), f"{prefix}.q_proj")
    assign(attention.query_bias, heads_bias("q_proj"), f"{prefix}.q_proj")
    assign(attention.key_value_kernel, np.stack([split_in_heads("k_proj"), split_in_heads("v_proj")], axis=1),
           f"{prefix}.k_proj/v_proj")
    assign(attention.key_value_bias, np.stack([heads_bias("k_proj"), heads_bias("v_proj")]), f"{prefix}.k_proj/v_proj")
    assign(attention.output_kernel, read(f"{prefix}.out_proj.weight").T.reshape(heads, head_dim, -1),
           f"{prefix}.out_proj")
    assign(attention.output_bias, read(f"{prefix}.out_proj.bias"), f"{prefix}.out_proj.bias")


def set_sublayer_attention(sublayer, read, prefix, norm_name):
    set_attention(sublayer.attention, read, prefix)
    set_norm(sublayer.norm, read, norm_name)


def set_layer(layer, read, prefix, decoder=False):
    """One encoder or decoder layer of theirs (`prefix` = "model.encoder.layers.3") into ours."""
    set_sublayer_attention(layer.self_attention, read, f"{prefix}.self_attn", f"{prefix}.self_attn_layer_norm")
    if decoder:
        set_sublayer_attention(
            layer.cross_attention_block, read, f"{prefix}.encoder_attn", f"{prefix}.encoder_attn_layer_norm"
        )
    set_dense(layer.feed_forward.feed_forward.hidden, read, f"{prefix}.fc1")
    set_dense(layer.feed_forward.feed_forward.projection, read, f"{prefix}.fc2")
    set_norm(layer.feed_forward.norm, read, f"{prefix}.final_layer_norm")


def set_embeddings_and_layers(model, read):
    """The token embeddings (shared or per side) and every encoder and decoder layer."""
    if model.share_embeddings:
        name = "model.shared.weight" if read.has("model.shared.weight") else "model.encoder.embed_tokens.weight"
        assign_embeddings(model.encoder.embedding.embeddings, read, name)
    else:
        for stack, name in ((model.encoder, "model.encoder.embed_tokens.weight"),
                            (model.decoder, "model.decoder.embed_tokens.weight")):
            assign_embeddings(stack.embedding.embeddings, read, name)
    for index, layer in enumerate(model.encoder.encoder_layers):
        set_layer(layer, read, f"model.encoder.layers.{index}")
    for index, layer in enumerate(model.decoder.decoder_layers):
        set_layer(layer, read, f"model.decoder.layers.{index}", decoder=True)


def set_output(model, read, bias):
    """The pre-softmax projection: tied to the target embeddings (plus `bias`), or `lm_head` of its own."""
    if model.tie_output:
        assign(model.output_bias, with_our_padding_bias(bias), "the output bias")
    else:
        assign(model.output_projection.kernel, with_our_padding_row(read("lm_head.weight")).T, "lm_head.weight")
        assign(model.output_projection.bias, with_our_padding_bias(bias), "the output bias")


def with_our_padding_row(embeddings):
    """`(vocab, d)` checkpoint embeddings -> `(vocab + 1, d)`: our padding id 0 first (zeros), theirs moved up one."""
    return np.concatenate([np.zeros((ID_OFFSET,) + embeddings.shape[1:], np.float32), embeddings], axis=0)


# The output bias of our padding id: its logit is never the argmax and carries no probability,
# as if the id were not there (every search also forbids it outright).
PADDING_LOGIT_BIAS = -30.0


def with_our_padding_bias(bias):
    return np.concatenate([np.full((ID_OFFSET,), PADDING_LOGIT_BIAS, np.float32), np.reshape(bias, [-1])])
