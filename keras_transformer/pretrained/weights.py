"""Our layers' weights and a BART-family checkpoint's tensors, both ways (Marian, M2M100 and NLLB share the names).

PyTorch's `Linear` stores `(out, in)` and computes `x W^T + b`; our layers
store kernels `(in, out)`, split per head where attention needs it:

    q_proj.weight (d, d)   <-> query_kernel      (d, heads, head_dim)   = W_q^T, split
    k_proj, v_proj         <-> key_value_kernel  (d, 2, heads, head_dim)
    out_proj.weight (d, d) <-> output_kernel     (heads, head_dim, d)
    fc1 / fc2              <-> feed_forward.hidden / .projection
    *_layer_norm           <-> the sub-layer's `norm` (pre- or post-LN alike)

A layer of theirs has self_attn (+ encoder_attn in the decoder) and fc1/fc2,
each with its LayerNorm, exactly our sub-layers. Each of our variables is
listed once (`Weight`), with the checkpoint tensors it is made of and the
reshape each way: `import-hf` reads through the list (`assign_all`),
`export --format hf` writes through it (`checkpoint_tensors`), so the two
directions cannot disagree. Every assignment checks the shape, so a wrong
mapping fails loudly here, not quietly in a translation.
"""

import dataclasses
import itertools
from typing import Callable

import numpy as np

from keras_transformer.saving import ROWS_AT_ONCE, scatter_rows, variable_as_array
from keras_transformer.text.sentencepiece import ID_OFFSET

# The output bias of our padding id: its logit is never the argmax and carries no probability,
# as if the id were not there (every search also forbids it outright).
PADDING_LOGIT_BIAS = -30.0


@dataclasses.dataclass(frozen=True)
class Weight:
    """One variable of ours and the checkpoint tensors it is made of.

    `to_ours(*their arrays)` gives the variable's value, `to_theirs(value)`
    their arrays in `names` order. `model_axes`: the variable's axes that
    run along d_model, which a change of the model axis' order (`publish`'s
    sinusoid columns) permutes. `vocabulary_axis`: the axis of token ids
    (embeddings, output bias), whose rows `VocabularyRows` moves;
    `side`: whose vocabulary it is ("source" or "target").
    `embeddings`: a token table, read a block of rows at a time.
    `optional`: a tensor some checkpoints leave out (`to_ours()` is called
    without it).
    """

    variable: object
    names: tuple
    to_ours: Callable = lambda array: array
    to_theirs: Callable = lambda value: (value,)
    model_axes: tuple = ()
    vocabulary_axis: int = None
    side: str = "target"
    embeddings: bool = False
    optional: bool = False


class VocabularyRows:
    """Token rows, ours <-> theirs: our id is their id + `ID_OFFSET`, our id 0 being our padding.

    An imported vocabulary has a padding token of its own, so our row 0 has
    no place in theirs (`padding_kept=False`: dropped on the way out, filled
    on the way in). A vocabulary learned here has none, and gains their
    `<pad>` as its last token, `size - 1`: our padding row goes there, and
    the ids between our last token and it (unused tokens, where the other
    side's vocabulary is larger) get rows that are never chosen (zeros, and
    an output bias of `PADDING_LOGIT_BIAS`).
    """

    def __init__(self, padding_kept=False, size=None):
        self.padding_kept = padding_kept
        self.size = size

    def theirs(self, ours, axis=0):
        tokens = ours[(slice(None),) * axis + (slice(ID_OFFSET, None),)]  # a view: the table is not copied here
        if not self.padding_kept:
            return tokens
        unused_shape = list(ours.shape)
        unused_shape[axis] = (self.size or tokens.shape[axis] + ID_OFFSET) - ours.shape[axis]
        unused = np.full(unused_shape, PADDING_LOGIT_BIAS if ours.ndim == 1 else 0.0, ours.dtype)
        padding = ours[(slice(None),) * axis + (slice(0, ID_OFFSET),)]
        return np.concatenate([tokens, unused, padding], axis=axis)

    def ours(self, theirs, padding, axis=0):
        """An imported vocabulary's `theirs` with our padding's rows (`padding`, ID_OFFSET of them) in front."""
        return np.concatenate([padding, theirs], axis=axis)


# -- the list: every variable of a BART-family Transformer -------------------------------------


def _dense(dense, prefix, input_is_model, output_is_model):
    """A Dense layer: kernel `(in, out)` <-> `prefix.weight` `(out, in)`, bias as it is."""
    return [
        Weight(dense.kernel, (f"{prefix}.weight",), np.transpose, lambda value: (value.T,),
               model_axes=(0,) * input_is_model + (1,) * output_is_model),
        Weight(dense.bias, (f"{prefix}.bias",), model_axes=(0,) * output_is_model),
    ]


def _norm(norm, prefix):
    return [Weight(norm.gamma, (f"{prefix}.weight",), model_axes=(0,)),
            Weight(norm.beta, (f"{prefix}.bias",), model_axes=(0,))]


def _attention(attention, prefix):
    """q/k/v/out projections of `prefix` (e.g. "model.encoder.layers.0.self_attn") <-> a `MultiHeadAttention`."""
    heads, head_dim = attention.num_heads, attention.head_dim

    def in_heads(weight):  # (out, in) -> (in, heads, head_dim)
        return weight.T.reshape(-1, heads, head_dim)

    def from_heads(kernel):  # (in, heads, head_dim) -> (out, in)
        return kernel.reshape(kernel.shape[0], -1).T

    names = {part: (f"{prefix}.{part}.weight", f"{prefix}.{part}.bias") for part in ("q_proj", "k_proj", "v_proj")}
    return [
        Weight(attention.query_kernel, names["q_proj"][:1], in_heads, lambda value: (from_heads(value),),
               model_axes=(0,)),
        Weight(attention.query_bias, names["q_proj"][1:], lambda bias: bias.reshape(heads, head_dim),
               lambda value: (value.reshape(-1),)),
        Weight(attention.key_value_kernel, (names["k_proj"][0], names["v_proj"][0]),
               lambda keys, values: np.stack([in_heads(keys), in_heads(values)], axis=1),
               lambda value: (from_heads(value[:, 0]), from_heads(value[:, 1])), model_axes=(0,)),
        Weight(attention.key_value_bias, (names["k_proj"][1], names["v_proj"][1]),
               lambda keys, values: np.stack([keys.reshape(heads, head_dim), values.reshape(heads, head_dim)]),
               lambda value: (value[0].reshape(-1), value[1].reshape(-1))),
        Weight(attention.output_kernel, (f"{prefix}.out_proj.weight",), lambda weight: weight.T.reshape(heads, head_dim, -1),
               lambda value: (value.reshape(-1, value.shape[-1]).T,), model_axes=(2,)),
        Weight(attention.output_bias, (f"{prefix}.out_proj.bias",), model_axes=(0,)),
    ]


def _layer(layer, prefix, decoder=False):
    """One encoder or decoder layer of theirs (`prefix` = "model.encoder.layers.3") <-> ours."""
    weights = _attention(layer.self_attention.attention, f"{prefix}.self_attn")
    weights += _norm(layer.self_attention.norm, f"{prefix}.self_attn_layer_norm")
    if decoder:
        weights += _attention(layer.cross_attention_block.attention, f"{prefix}.encoder_attn")
        weights += _norm(layer.cross_attention_block.norm, f"{prefix}.encoder_attn_layer_norm")
    feed_forward = layer.feed_forward.feed_forward
    weights += _dense(feed_forward.hidden, f"{prefix}.fc1", input_is_model=True, output_is_model=False)
    weights += _dense(feed_forward.projection, f"{prefix}.fc2", input_is_model=False, output_is_model=True)
    return weights + _norm(layer.feed_forward.norm, f"{prefix}.final_layer_norm")


def _embeddings(variable, name, side):
    return Weight(variable, (name,), model_axes=(1,), vocabulary_axis=0, side=side, embeddings=True)


def _output_bias(variable, name):
    """The logits' bias, stored `(1, vocab)` as `name`; zeros where the checkpoint has none.

    `name` None: the family has no such bias (M2M100), so ours must stay
    zeros to be written out.
    """
    vocab_size = variable.shape[0] - ID_OFFSET

    def to_ours(bias=None):
        return np.zeros([vocab_size], np.float32) if bias is None else np.reshape(bias, [-1])

    def to_theirs(value):
        if name is None:
            if np.any(value != 0):
                raise ValueError("the output bias has been trained (it is not zero), and this model family has "
                                 "no output bias to hold it")
            return ()
        return (value[None, :],)

    return Weight(variable, (name,) if name else (), to_ours, to_theirs, vocabulary_axis=0, optional=True)


# The one embedding table of a shared vocabulary, as `save_pretrained` names it (older checkpoints: the encoder's).
SHARED_EMBEDDINGS, ENCODER_EMBEDDINGS = "model.shared.weight", "model.encoder.embed_tokens.weight"


def shared_embeddings_name(read):
    """The name a checkpoint (`read`: a `WeightReader`) gives its shared embeddings."""
    return SHARED_EMBEDDINGS if read.has(SHARED_EMBEDDINGS) else ENCODER_EMBEDDINGS


def model_weights(model, output_bias, final_norms=False, shared_name=SHARED_EMBEDDINGS):
    """Every variable of `model` (a `models.Transformer` as a family builds it) with its checkpoint tensors.

    `output_bias`: the checkpoint's name for the logits' bias (Marian's
    `final_logits_bias`), or None where it has none (M2M100: ours stays 0).
    `final_norms`: the LayerNorm after each stack (pre-LN M2M100).
    `shared_name`: the one embedding table of a shared vocabulary.
    """
    weights = []
    if model.share_embeddings:
        weights.append(_embeddings(model.encoder.embedding.embeddings, shared_name, "source"))
    else:
        weights += [_embeddings(model.encoder.embedding.embeddings, ENCODER_EMBEDDINGS, "source"),
                    _embeddings(model.decoder.embedding.embeddings, "model.decoder.embed_tokens.weight", "target")]
    for index, layer in enumerate(model.encoder.encoder_layers):
        weights += _layer(layer, f"model.encoder.layers.{index}")
    for index, layer in enumerate(model.decoder.decoder_layers):
        weights += _layer(layer, f"model.decoder.layers.{index}", decoder=True)
    if final_norms:
        weights += _norm(model.encoder.final_norm, "model.encoder.layer_norm")
        weights += _norm(model.decoder.final_norm, "model.decoder.layer_norm")
    if not model.tie_output:  # lm_head, (vocab, d), has no bias of its own
        weights.append(Weight(model.output_projection.kernel, ("lm_head.weight",), np.transpose,
                              lambda value: (value.T,), model_axes=(0,), vocabulary_axis=1))
    bias = model.output_bias if model.tie_output else model.output_projection.bias
    return weights + [_output_bias(bias, output_bias)]


# -- checkpoint -> our variables ------------------------------------------------------------------


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


def assign_all(weights, read):
    """Every `Weight` of `weights` from the checkpoint (`read`: a `WeightReader`); biases it lacks are zeros.

    Imported vocabularies keep their own padding: our padding rows are
    zeros (embeddings) and `PADDING_LOGIT_BIAS` (the output bias).
    """
    rows = VocabularyRows(padding_kept=False)
    for weight in weights:
        if weight.embeddings:
            assign_embeddings(weight.variable, read, weight.names[0])
            continue
        value = weight.to_ours(*(read(name) for name in weight.names if read.has(name) or not weight.optional))
        if weight.vocabulary_axis is not None:  # the output bias, or an untied lm_head's kernel
            padding_shape = list(np.shape(value))
            padding_shape[weight.vocabulary_axis] = ID_OFFSET
            fill = PADDING_LOGIT_BIAS if len(padding_shape) == 1 else 0.0
            value = rows.ours(value, np.full(padding_shape, fill, np.float32), axis=weight.vocabulary_axis)
        assign(weight.variable, value, "/".join(weight.names))


def assign(variable, value, name):
    value = np.asarray(value, np.float32)
    if tuple(variable.shape) != value.shape:
        raise ValueError(f"{name}: the checkpoint's shape {value.shape} does not fit {tuple(variable.shape)}")
    variable.assign(value)


def assign_embeddings(variable, read, name):
    """The checkpoint's `(vocab, d)` embeddings `name` into our `(vocab + 1, d)` table: row 0 (our padding) zeros, theirs after.

    Read and written a block of rows at a time (`saving.scatter_rows`): the
    largest matrix of a checkpoint is never whole in memory beside it.
    """
    shape = read.shape(name)
    if tuple(variable.shape) != (shape[0] + ID_OFFSET, shape[1]):
        raise ValueError(f"{name}: the checkpoint's shape {shape} does not fit {tuple(variable.shape)}")
    padding = [(0, np.zeros((ID_OFFSET, shape[1]), np.float32))]
    theirs = ((ID_OFFSET + start, np.asarray(rows, np.float32)) for start, rows in read.row_blocks(name, ROWS_AT_ONCE))
    scatter_rows(variable, itertools.chain(padding, theirs))


# -- our variables -> checkpoint ------------------------------------------------------------------


def checkpoint_tensors(weights, rows, model_order=None):
    """`(name, array)` of the checkpoint's tensors, one variable at a time (what `export --format hf` writes).

    `rows`: `{"source": VocabularyRows, "target": VocabularyRows}`. `model_order`: the model axis' new order
    (`their column j = our column model_order[j]`), or None to keep ours.
    """
    for weight in weights:
        value = variable_as_array(weight.variable, np.float32)
        if model_order is not None:
            for axis in weight.model_axes:
                value = np.take(value, model_order, axis=axis)
        if weight.vocabulary_axis is not None:
            value = rows[weight.side].theirs(value, axis=weight.vocabulary_axis)
        yield from zip(weight.names, weight.to_theirs(value))
