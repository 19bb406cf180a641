"""How attention weights are stored in TensorBoard logs, for the "Attention" tab to read.

Per logged sample and step (epoch), two kinds of summaries, both marked with
this plugin's name so that TensorBoard hands them to the plugin:

    tag                                    value                             plugin content (JSON)
    attention/sample_{i}/texts             a JSON string: the sample's       {"sample": i, "type": "texts"}
                                           texts and tokens by side
    attention/sample_{i}/{kind}/layer_{l}  float32 (heads, queries, keys)    {"sample": i, "type": "attention",
                                                                              "kind": kind, "layer": l,
                                                                              "queries": side, "keys": side}

(The "attention/" prefix keeps them apart from the heatmap images of the
same sample, kind and layer: TensorBoard keeps one series per tag.)

A map's rows and columns are labelled with the tokens of two "sides" of the
sample, named in its plugin content and found in the texts at the same
step: "source" and "target" for a translation (cross-attention's queries
are the target's tokens, its keys the source's), "cls" (just "[CLS]") and
"sentence" for a classifier's [CLS] row, "pooled" and "sentence" for its
attention pooling's token weights. The tokens are stored per step
because the translation the model produces, and so the target's tokens,
change from epoch to epoch.

`write_sample` writes one sample's summaries; `read_texts` and
`map_content` read them back (the plugin does).

Example:
>>> with tf.summary.create_file_writer("logs/samples").as_default(step=epoch):
...     write_sample(0, {"source": "ein hund", "reference": "a dog"}, {"source": [...], "target": [...]},
...                  [("cross", 0, "target", "source", weights)])
"""

import json

import numpy as np
import tensorflow as tf
from tensorboard.compat.proto import summary_pb2

PLUGIN_NAME = "attention"
TEXTS, ATTENTION = "texts", "attention"


def texts_tag(sample):
    return f"{PLUGIN_NAME}/sample_{sample}/{TEXTS}"


def map_tag(sample, kind, layer):
    return f"{PLUGIN_NAME}/sample_{sample}/{kind}/layer_{layer}"


def _metadata(content):
    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=PLUGIN_NAME, content=json.dumps(content, sort_keys=True).encode("utf-8")
        ),
        # TensorBoard hands a plugin only summaries that say what kind of data they are.
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )


def write_sample(sample, texts, tokens, maps, step=None):
    """Write one sample's texts, tokens and attention maps to the default summary writer.

    Args:
        sample: the sample's number (0, 1, ...), fixed across steps.
        texts: `{name: text}` shown beside the maps ("source", "reference",
            "translation"; "text", "label", "prediction").
        tokens: `{side: [token, ...]}` labelling the maps' rows and columns.
        maps: `(kind, layer, queries side, keys side, weights)` tuples, the
            weights `(heads, queries, keys)` (stored as float32: TensorBoard's
            fast loader cannot read float16 tensors back).
        step: the step (epoch); None: the writer's default step.
    """
    for kind, layer, queries, keys, weights in maps:
        weights = np.asarray(weights)
        expected = (len(tokens[queries]), len(tokens[keys]))
        if weights.ndim != 3 or weights.shape[1:] != expected:
            raise ValueError(
                f"the {kind} map of layer {layer} has shape {weights.shape}, "
                f"expected (heads, {expected[0]}, {expected[1]}) for its {queries} and {keys} tokens"
            )
        content = {"sample": sample, "type": ATTENTION, "kind": kind, "layer": layer, "queries": queries, "keys": keys}
        tf.summary.write(
            map_tag(sample, kind, layer), tf.constant(weights, tf.float32), step=step, metadata=_metadata(content)
        )
    value = json.dumps({"texts": texts, "tokens": tokens}, ensure_ascii=False)
    tf.summary.write(
        texts_tag(sample), tf.constant(value), step=step, metadata=_metadata({"sample": sample, "type": TEXTS})
    )


def map_content(plugin_content):
    """The plugin content of a summary, as a dict (`{}` for one that is not this plugin's JSON)."""
    try:
        content = json.loads(plugin_content.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return content if isinstance(content, dict) else {}


def read_texts(value):
    """`(texts, tokens)` from a texts summary's value (a scalar string tensor, as numpy)."""
    raw = value.item() if isinstance(value, np.ndarray) else value
    stored = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    return stored["texts"], stored["tokens"]
