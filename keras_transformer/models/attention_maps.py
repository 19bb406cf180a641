"""The names of a `Transformer`'s attention maps, and what their rows and columns are.

`Transformer(..., return_attention_scores=True)` returns one
`(batch, heads, queries, keys)` map per attention sub-layer, named by where
that sub-layer sits in the model (stack / layer / sub-layer):

    name                                kind            queries (rows)   keys (columns)
    "encoder/layer_{i}/self_attention"  "encoder"       source tokens    source tokens
    "decoder/layer_{i}/self_attention"  "decoder_self"  target tokens    target tokens
    "decoder/layer_{i}/cross_attention" "cross"         target tokens    source tokens

The kinds are the short names people choose maps by (`plot-attention
--kind`, the TensorBoard tags `sample_0/cross/layer_0`). This module is the
one place that spells names and kinds: build a name with
`attention_map_name(kind, layer)`, read one back with
`parse_attention_map_name(name)`, and label a map's axes with
`queries_and_keys(kind, source_tokens, target_tokens)`.

Example:
>>> attention_map_name(CROSS, 1)  # "decoder/layer_1/cross_attention"
>>> parse_attention_map_name("encoder/layer_0/self_attention")  # ("encoder", 0)
>>> queries_and_keys(CROSS, ["ein", "hund"], ["a", "dog"])  # (["a", "dog"], ["ein", "hund"])
"""

from keras_transformer.layers.stack import layer_name

ENCODER, DECODER_SELF, CROSS = "encoder", "decoder_self", "cross"
KINDS = (ENCODER, DECODER_SELF, CROSS)
# A classifier's map: the [CLS] row of each layer's self-attention, its
# single query "[CLS]" over the sentence's tokens (sides "cls" and "sentence").
CLS_ROW = "cls"
CLS_ROW_SIDES = ("cls", "sentence")
# A classifier with attention pooling: its learned token weights, one query
# (the pooled vector) over the sentence's tokens, as a one-layer, one-head map.
POOLING = "pooling"
POOLING_SIDES = ("pooled", "sentence")
POOLING_QUERY = "[pooled]"
SOURCE, TARGET = "source", "target"
# A language model's maps are decoder self-attention over one text: both axes are its tokens.
TEXT_SIDE = "text"

# The Keras names of a Transformer's two stacks: the first part of a map's name.
ENCODER_STACK, DECODER_STACK = "encoder", "decoder"

# kind -> (stack, attention sub-layer): the parts of its maps' names around "layer_{i}".
_NAME_PARTS = {
    ENCODER: (ENCODER_STACK, "self_attention"),
    DECODER_SELF: (DECODER_STACK, "self_attention"),
    CROSS: (DECODER_STACK, "cross_attention"),
}
_KIND_OF_PARTS = {parts: kind for kind, parts in _NAME_PARTS.items()}

# kind -> (queries, keys): which sentence the rows and the columns belong to.
# The decoder's queries are target positions; only cross-attention's keys are the source's.
TOKEN_SIDES = {
    ENCODER: (SOURCE, SOURCE),
    DECODER_SELF: (TARGET, TARGET),
    CROSS: (TARGET, SOURCE),
}


def _check_kind(kind):
    if kind not in KINDS:
        raise ValueError(f"unknown attention kind {kind!r}; choose from {list(KINDS)}")


def attention_map_name(kind, layer):
    """The name of layer `layer`'s map of `kind` (see the module docstring).

    Args:
        kind: "encoder", "decoder_self" or "cross".
        layer: the layer's index, from 0.

    Example:
    >>> attention_map_name("decoder_self", 0)  # "decoder/layer_0/self_attention"
    """
    _check_kind(kind)
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise ValueError(f"layer must be an index from 0, got {layer!r}")
    stack, sublayer = _NAME_PARTS[kind]
    return f"{stack}/{layer_name(layer)}/{sublayer}"


def attention_map_names(num_layers, kind):
    """The names of a `num_layers`-layer model's maps of `kind`, layer 0 first."""
    return [attention_map_name(kind, layer) for layer in range(num_layers)]


def parse_attention_map_name(name):
    """`(kind, layer)` of a map's name; ValueError for a name that is not one.

    Example:
    >>> parse_attention_map_name("decoder/layer_1/cross_attention")  # ("cross", 1)
    """
    parts = name.split("/")
    if len(parts) == 3:
        stack, layer, sublayer = parts
        kind = _KIND_OF_PARTS.get((stack, sublayer))
        index = layer.rpartition("_")[2]
        if kind is not None and index.isdigit() and layer == layer_name(int(index)):
            return kind, int(index)
    raise ValueError(
        f"{name!r} is not an attention map name such as {attention_map_name(CROSS, 0)!r}"
    )


def token_sides(kind):
    """`(queries, keys)` of a map of `kind`, each "source" or "target"."""
    _check_kind(kind)
    return TOKEN_SIDES[kind]


def queries_and_keys(kind, source, target):
    """Of a `source` and a `target` value, those of a map's queries (rows) and keys (columns).

    The values are anything one has per sentence: the tokens that label the
    axes, their lengths, their padding masks.

    Example:
    >>> queries, keys = queries_and_keys("cross", result["source_tokens"], result["target_tokens"])
    >>> plot_attention(result["attention"][attention_map_name("cross", 0)], queries, keys)
    """
    values = {SOURCE: source, TARGET: target}
    queries, keys = token_sides(kind)
    return values[queries], values[keys]


def maps_with_sides(attention):
    """A Transformer's maps (`{name: (heads, queries, keys)}`) as `(kind, layer, queries side, keys side, weights)`.

    The form the attention explorer's summaries and pages take
    (`keras_transformer.tensorboard_plugin`), with the tokens given by side:
    `{SOURCE: source_tokens, TARGET: target_tokens}`.
    """
    maps = []
    for name, weights in attention.items():
        kind, layer = parse_attention_map_name(name)
        maps.append((kind, layer, *TOKEN_SIDES[kind], weights))
    return maps


def stack_attention_maps(stack, scores):
    """A stack's scores ("layer_{i}/<sub-layer>") under the model's names ("<stack>/layer_{i}/<sub-layer>")."""
    return {f"{stack}/{name}": value for name, value in scores.items()}


__all__ = [
    "CLS_ROW",
    "CLS_ROW_SIDES",
    "CROSS",
    "DECODER_SELF",
    "DECODER_STACK",
    "ENCODER",
    "ENCODER_STACK",
    "KINDS",
    "SOURCE",
    "TARGET",
    "TEXT_SIDE",
    "TOKEN_SIDES",
    "attention_map_name",
    "attention_map_names",
    "maps_with_sides",
    "parse_attention_map_name",
    "queries_and_keys",
    "stack_attention_maps",
    "token_sides",
]
