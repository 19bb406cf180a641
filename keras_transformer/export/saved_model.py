"""The whole translator as one SavedModel: raw strings in, translations out.

Tutorials usually export a model that needs Python around it (a tokenizer
in the client, a decoding loop in a script). Here the tokenizer, the cached
beam search and the detokenizer are all in the graph, built from TensorFlow
and tensorflow-text ops only, so the stock `tensorflow_model_server` (which
links tensorflow-text's ops) serves it as it is.

An export lives at `EXPORT_BASE/<version>/`, the layout TensorFlow Serving
watches: it serves the highest version and picks up a new one when it
appears. A version is written under a hidden temporary name and renamed into
place when complete, so the server never sees half an export.

Signatures (see `SIGNATURES`):
- `serving_default`: `text` (string `[batch]`) -> `translation` (string
  `[batch]`), `score` (float32 `[batch]`, the length-normalised log-probability).
- `translate_with_attention`: the same plus `source_tokens`, `target_tokens`
  (string `[batch, None]`, padded with "") and `cross_attention` (float32
  `[batch, layers, heads, target_tokens, source_tokens]`).
- `score_tokens`: `source_ids`, `target_ids` (int32 `[batch, None]`, 0 =
  padding, targets starting with [START]) -> `logits` (float32
  `[batch, target_len, target_vocab]`), for clients that tokenize themselves.

Inputs are checked in the graph, at run time, before any other kernel sees
them. A loaded SavedModel does not enforce the shapes its signatures declare,
and TensorFlow Serving checks none either, so a scalar string or a matrix of
them would otherwise reach tensorflow-text's tokenizer, which crashes the
whole process on them. The signatures therefore declare their inputs with no
shape at all (nothing downstream may assume one), check the rank and shape
first, and answer anything else with an `InvalidArgument` error that names the
input and the shape it must have. Within those shapes: an empty string
translates to "", a source longer than the model's `max_length` is truncated
to it, an empty batch gives empty outputs, bytes that are not UTF-8 are
replaced by U+FFFD.
"""

import json
import os
import re
import shutil
import tempfile

import tensorflow as tf

from keras_transformer.saving import DamagedFileError, first_line as _first_line

SIGNATURES = {
    "serving_default": ("text",),
    "translate_with_attention": ("text",),
    "score_tokens": ("source_ids", "target_ids"),
}

# No declared shape: a declared one would let TensorFlow's graph optimiser
# take it as a fact and fold the run-time checks below away.
_TEXT = tf.TensorSpec(None, tf.string, name="text")
_SOURCE_IDS = tf.TensorSpec(None, tf.int32, name="source_ids")
_TARGET_IDS = tf.TensorSpec(None, tf.int32, name="target_ids")


class TranslationService:
    """The signatures of an export, around a `keras_transformer.inference.Translator`.

    Args:
        translator: the `Translator` whose settings (beam size, length
            penalty, output limits) the export keeps.

    Example:
    >>> service = TranslationService(translator)
    >>> service.serve(tf.constant(["Ein Mann fährt Fahrrad."]))["translation"]
    """

    def __init__(self, translator):
        self.translator = translator
        model = translator.model
        self._logits = tf.function(lambda source_ids, target_ids: model((source_ids, target_ids), training=False))
        # What the signatures capture is named after the weights' paths (see `_call_naming_captures`).
        self._capture_names = {id(variable.value.handle): _identifier(variable.path) for variable in model.variables}

    @tf.function(input_signature=[_TEXT])
    def serve(self, text):
        outputs = _call_naming_captures(self.translator.__call__, self._capture_names, _checked_sentences(text))
        return {"translation": outputs["translation"], "score": outputs["score"]}

    @tf.function(input_signature=[_TEXT])
    def translate_with_attention(self, text):
        outputs = _call_naming_captures(
            self.translator.translate_with_attention, self._capture_names, _checked_sentences(text)
        )
        names = ("translation", "score", "source_tokens", "target_tokens", "cross_attention")
        return {name: outputs[name] for name in names}

    @tf.function(input_signature=[_SOURCE_IDS, _TARGET_IDS])
    def score_tokens(self, source_ids, target_ids):
        model = self.translator.model
        source_ids, target_ids = _checked_id_batches(source_ids, target_ids)
        checks = [
            _check_ids(source_ids, model.src_vocab_size, "source_ids"),
            _check_ids(target_ids, model.tgt_vocab_size, "target_ids"),
            tf.debugging.assert_less_equal(
                tf.shape(target_ids)[1], model.max_length,
                message=f"target_ids are longer than the model's max_length ({model.max_length})",
            ),
            tf.debugging.assert_less_equal(
                tf.shape(source_ids)[1], model.max_length,
                message=f"source_ids are longer than the model's max_length ({model.max_length})",
            ),
        ]
        with tf.control_dependencies(checks):
            logits = _call_naming_captures(self._logits, self._capture_names, source_ids, target_ids)
        return {"logits": tf.cast(logits, tf.float32)}

    def signatures(self):
        return {
            "serving_default": self.serve.get_concrete_function(),
            "translate_with_attention": self.translate_with_attention.get_concrete_function(),
            "score_tokens": self.score_tokens.get_concrete_function(),
        }

    def saveable(self):
        """The object to hand to `tf.saved_model.save`: the functions and the model's variables.

        The functions read the `tf.Variable`s inside the Keras variables, so
        those are what must be saved. Saving the Keras wrappers instead makes
        the export save a copy of each variable under another name, and a
        session-based loader (`saved_model_cli run`, TensorFlow Serving)
        restores the copies while the functions read the uninitialised
        originals.
        """
        root = tf.Module(name="translation_service")
        root.model_variables = [variable.value for variable in self.translator.model.variables]
        root.serve = self.serve
        root.translate_with_attention = self.translate_with_attention
        root.score_tokens = self.score_tokens
        return root


def _call_naming_captures(function, names, *args):
    """`function(*args)` (a `tf.function`) from the function being traced, after naming what it reads.

    A traced function takes what it reads from outside (the model's weights,
    the tokenizers' WordPiece models) as extra, captured inputs. Saving a
    signature renames each captured input whose name is not already its
    argument name in the graph (a lowercase identifier at the top of the
    graph), and logs every one it renamed. Left alone, the inputs `function`
    captured come in under running numbers ("4935, 4937, ...": two screens
    of log for this model), and a weight read inside a layer as "resource"
    in the layer's name scope. Captured here first, at the top of the graph,
    under the weights' paths (`names`, by the tensor's `id`) or
    "captured_<n>", they are saved under those names, and the call below
    reuses these captures.
    """
    concrete = function.get_concrete_function(*args)
    graph = tf.compat.v1.get_default_graph()  # the FuncGraph of the function being traced
    for tensor in concrete.captured_inputs:
        graph.capture(tensor, name=names.get(id(tensor)) or f"captured_{len(graph.inputs)}")
    return concrete(*args)


def _identifier(path):
    """`path` as a SavedModel keeps an input name: lowercase letters, digits and "_", a letter first."""
    name = re.sub(r"[^a-z0-9_]", "_", path.lower())
    return name if name[:1].isalpha() else f"v_{name}"


def _checked_sentences(text):
    """`text` as a `[batch]` string vector, or an InvalidArgument error naming it."""
    return _checked_rank(text, "text", 1, "a string vector of shape [batch]")


def _checked_id_batches(source_ids, target_ids):
    """Both inputs as `[batch, length]` matrices of one batch size, or an InvalidArgument error."""
    expected = "an int32 matrix of shape [batch, length]"
    source_ids = _checked_rank(source_ids, "source_ids", 2, expected)
    target_ids = _checked_rank(target_ids, "target_ids", 2, expected)
    # Their shapes may be read only now that both ranks are known to be 2.
    source_shape, target_shape = tf.shape(source_ids), tf.shape(target_ids)
    same_batch = tf.debugging.Assert(
        tf.equal(source_shape[0], target_shape[0]),
        ["source_ids and target_ids must hold the same number of rows; got shapes", source_shape, target_shape],
    )
    with tf.control_dependencies([same_batch]):
        return tf.identity(source_ids), tf.identity(target_ids)


def _checked_rank(tensor, name, rank, expected):
    """`tensor`, once a run-time check has found it of rank `rank`; its static shape says so."""
    shape = tf.shape(tensor)
    check = tf.debugging.Assert(tf.equal(tf.size(shape), rank), [f"{name} must be {expected}; got shape", shape])
    with tf.control_dependencies([check]):
        # A reshape to its own shape, padded to `rank` dimensions: it runs
        # after the check, and its output has a rank the graph can rely on.
        checked = tf.reshape(tensor, tf.concat([shape, tf.ones([rank], tf.int32)], axis=0)[:rank])
    checked.set_shape([None] * rank)
    return checked


def _check_ids(ids, vocab_size, name):
    return tf.debugging.assert_equal(
        tf.reduce_all((ids >= 0) & (ids < vocab_size)),
        True,
        message=f"{name} must be ids in [0, {vocab_size})",
    )


def _versions(export_base):
    if not os.path.isdir(export_base):
        return []
    return sorted(int(name) for name in os.listdir(export_base) if name.isdigit())


def export_translator(translator, export_base, version=None):
    """Write `translator` as SavedModel version `version` under `export_base`.

    Args:
        translator: a `keras_transformer.inference.Translator`.
        export_base: the directory TensorFlow Serving watches.
        version: a positive integer; default one more than the highest
            version already there (1 for a new directory). An existing
            version is never overwritten.

    Returns:
        The path of the new version directory.
    """
    path = version_path(export_base, version)
    version = int(os.path.basename(path))
    os.makedirs(export_base, exist_ok=True)
    # Serving ignores names that are not numbers: build there, then rename.
    staging = tempfile.mkdtemp(prefix=f".{version}-incomplete-", dir=export_base)
    try:
        service = TranslationService(translator)
        tf.saved_model.save(service.saveable(), staging, signatures=service.signatures())
        _write_settings(staging, translator)
        os.chmod(staging, 0o755)  # mkdtemp's 0700 would hide it from a server running as another user
        os.rename(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def version_path(export_base, version=None):
    """Where version `version` (default: the next one) of an export goes; an error if it exists."""
    if version is None:
        version = (_versions(export_base) or [0])[-1] + 1
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"version must be a positive integer, got {version!r}")
    path = os.path.join(export_base, str(version))
    if os.path.exists(path):
        raise FileExistsError(f"{path} already exists: pick another version or remove it first")
    return path


def _write_settings(directory, translator):
    # assets.extra travels with the version but is not part of the graph.
    extra = os.path.join(directory, "assets.extra")
    os.makedirs(extra, exist_ok=True)
    model = translator.model
    settings = {
        "beam_size": translator.beam_size,
        "length_alpha": translator.length_alpha,
        "max_extra_length": translator.max_extra_length,
        "max_output_length": translator.max_output_length,
        "max_source_length": model.max_length,
        "source_vocab_size": model.src_vocab_size,
        "target_vocab_size": model.tgt_vocab_size,
        "num_layers": model.num_layers,
        "num_heads": model.num_heads,
        "signatures": {name: list(inputs) for name, inputs in SIGNATURES.items()},
    }
    with open(os.path.join(extra, "translator.json"), "w", encoding="utf-8") as file:
        json.dump(settings, file, indent=2)


def resolve_export(path):
    """`path` itself when it holds a SavedModel, else its highest numbered version."""
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        return path
    versions = _versions(path)
    if not versions:
        raise FileNotFoundError(f"{path} holds neither a saved_model.pb nor numbered versions of one")
    return os.path.join(path, str(versions[-1]))


def load_export(path):
    """Load an export (a version directory, or a base: its highest version).

    A damaged export (a truncated `saved_model.pb` or variables file, say)
    raises a `DamagedFileError` naming the version directory.
    """
    # The WordPiece ops must be registered before the graph is loaded.
    import tensorflow_text  # noqa: F401

    version = resolve_export(path)
    try:
        return tf.saved_model.load(version)
    except Exception as error:  # protobuf, TensorFlow and OS errors alike: the message says which
        raise DamagedFileError(f"{version} is not a loadable SavedModel: {_first_line(error)}") from None
