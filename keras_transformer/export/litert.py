"""A run as one LiteRT file: on-device translation, classification and generation, text in and text out.

LiteRT (formerly TensorFlow Lite) is TensorFlow's runtime for phones,
browsers and small machines. `export_litert` writes a run into a new
directory:

    OUT/model.tflite     the tokenizer, the model, the search and the detokenizer
    OUT/litert.json      what the file holds (its kind, signature, settings, operators)

The file runs on LiteRT's builtin operators plus the tensorflow-text kernels
that `tensorflow_text.tflite_registrar` registers (the WordPiece tokenizer,
splitting strings into bytes, joining strings): no TensorFlow ("Flex")
operator, so the plain mobile runtime runs it. `check_operators` reads the
file's operator table and refuses anything else before OUT is written.

What changes on the way from the SavedModel (`export.translator`):

- the search runs with fixed shapes (`static_shapes`): the self-attention
  cache has its whole room from the start and is written in place with
  LiteRT's `DYNAMIC_UPDATE_SLICE` (`layers.cached_attention.cache_writes_for_litert`);
  finished sentences stay in the batch. The same translations.
- the text ops are the portable ones (`text.portable`): lowercasing from a
  table, the detokenizer's string join. Two things the SavedModel does to
  its input are left to the caller, since LiteRT has no kernel for them:
  Unicode NFC normalisation (text typed on a keyboard is NFC already; the
  runner in `keras_transformer.on_device` normalises, as an Android app does
  with `java.text.Normalizer`) and repairing invalid UTF-8 (the tokenizer
  reads a malformed byte as an unknown word).
- `quantization`: None (float32), "float16" (weights stored in half
  precision), or "int8" (dynamic-range: every weight matrix, embeddings and
  output projection included, in int8 with a scale per channel; no
  calibration data). The model computes in float32 whatever precision it
  was trained in.

Signatures: `serving_default` of a translator takes `text` (string `[batch]`)
and returns `translation` (string `[batch]`) and `score` (float32 `[batch]`).
"""

import json
import os
import shutil
import tempfile

import tensorflow as tf

from keras_transformer.layers.cached_attention import cache_writes_for_litert
from keras_transformer.saving import write_json
from keras_transformer.text import WordPieceTokenizer
from keras_transformer.text.portable import dense_rows, lowercase_table, lowercase_utf8

MODEL_FILE, SETTINGS_FILE = "model.tflite", "litert.json"
QUANTIZATIONS = ("float16", "int8")
# The tensorflow-text kernels `tensorflow_text.tflite_registrar` registers with LiteRT, by operator name.
TEXT_OPERATORS = frozenset({
    "FastWordpieceTokenizeWithOffsets", "TFText>FastWordpieceDetokenize", "FastBertNormalize",
    "TFText>FastSentencepieceTokenize", "TFText>FastSentencepieceDetokenize", "TFText>NgramsStringJoin",
    "TFText>ByteSplitWithOffsets", "TFText>ByteSplitByOffsets", "RaggedTensorToTensor", "TFText>Utf8Binarize",
    "TFText>WhitespaceTokenize",
})
# Lowercasing reads at most this many bytes of a text per position of the model's input: more
# than any `max_length` tokens take (the tokenizer cuts the rest anyway).
BYTES_PER_POSITION = 32


class LiteRTTokenizer:
    """A `WordPieceTokenizer`'s text -> ids in LiteRT's ops: `(batch, <= max_length)` framed ids, as the SavedModel's.

    Args:
        tokenizer: the run's `text.WordPieceTokenizer`.
        max_length: ids per text at most ([START] ... [END], cut keeping [END]).
    """

    def __init__(self, tokenizer, max_length):
        if not isinstance(tokenizer, WordPieceTokenizer):
            raise ValueError(
                "the LiteRT export runs WordPiece vocabularies; this run's tokenizer is "
                f"{type(tokenizer).__name__} (an imported checkpoint's SentencePiece): export a SavedModel or "
                "CTranslate2 model instead"
            )
        self.tokenizer, self.max_length = tokenizer, max_length
        self.max_bytes = BYTES_PER_POSITION * max_length
        self.lowercase = lowercase_table() if tokenizer.lower_case else None

    def pieces(self, texts):
        """Ragged `(batch, None)` ids of the texts' pieces, unframed."""
        if self.lowercase is not None:
            texts = lowercase_utf8(texts, self.lowercase, self.max_bytes)
        return self.tokenizer.wordpiece.tokenize(texts)

    def framed(self, texts):
        """`(batch, width)` int32: [START] pieces [END], cut to `max_length` keeping [END], padded with 0."""
        pieces = self.pieces(texts)
        lengths = tf.minimum(tf.cast(pieces.row_lengths(), tf.int32) + 2, self.max_length)
        width = tf.reduce_max(tf.concat([lengths, [0]], axis=0))
        inside = tf.pad(dense_rows(pieces, width), [[0, 0], [1, 0]])[:, :width]  # column j: piece j - 1
        columns = tf.range(width)[None, :]
        tokenizer = self.tokenizer
        return tf.where(columns == 0, tokenizer.start_id,
                        tf.where(columns == lengths[:, None] - 1, tokenizer.end_id,
                                 tf.where(columns < lengths[:, None], inside, tokenizer.pad_id)))


TEXT = tf.TensorSpec([None], tf.string, name="text")


class LiteRTService:
    """What `export_litert` converts: `root`, a `tf.Module` holding the model's variables and the signatures.

    The signatures close over the Python objects they call, which the
    module does not track: saving it traces the signatures alone.
    """

    def __init__(self, model, functions):
        self.root = tf.Module(name="litert")
        self.root.model_variables = [variable.value for variable in model.variables]
        for name, (function, input_signature) in functions.items():
            setattr(self.root, name, tf.function(function, input_signature=input_signature))
        self.names = list(functions)

    def signatures(self):
        signatures = {name: getattr(self.root, name).get_concrete_function() for name in self.names}
        return {"serving_default" if name == self.names[0] else name: function for name, function in signatures.items()}


class LiteRTTranslation(LiteRTService):
    """A `Translator` in LiteRT's ops: `translate(text) -> {"translation", "score"}` (see the module docstring)."""

    def __init__(self, translator):
        self.translator = translator
        self.source = LiteRTTokenizer(translator.source_tokenizer, translator.model.max_length)
        super().__init__(translator.model, {"translate": (self.translate, [TEXT])})

    def translate(self, text):
        translator = self.translator
        source_ids = self.source.framed(text)
        tokens, scores = translator.search(source_ids, static_shapes=True)
        # The frame alone ([START] [END]): nothing to translate.
        empty = tf.reduce_sum(tf.cast(source_ids != 0, tf.int32), axis=1) <= translator.source_tokenizer.frame_length
        tokens = tf.where(empty[:, None], 0, tokens)
        # Padded to the longest output allowed: the detokenizer's string join needs its width when traced.
        cap = translator.max_output_length
        tokens = tf.reshape(tf.pad(tokens, [[0, 0], [0, cap - tf.shape(tokens)[1]]]), [-1, cap])
        return {"translation": translator.target_tokenizer.detokenize(tokens), "score": tf.where(empty, 0.0, scores)}

    def settings(self):
        translator = self.translator
        return {
            "kind": "translation", "beam_size": translator.beam_size, "length_alpha": translator.length_alpha,
            "max_extra_length": translator.max_extra_length, "max_output_length": translator.max_output_length,
            "max_source_length": translator.model.max_length,
            "lowercase": translator.source_tokenizer.lower_case, "max_bytes": self.source.max_bytes,
        }


class LiteRTClassification(LiteRTService):
    """A text classifier in LiteRT's ops: `classify(text) -> {"label", "label_id", "probabilities"}`.

    As the SavedModel's `serving_default` (`export.classifier`): [CLS] and the
    text's pieces, cut to `max_length`, through the encoder, the pooling and
    the head.
    """

    def __init__(self, model, tokenizer, max_length, labels):
        self.model, self.max_length, self.labels = model, max_length, list(labels)
        self.source = LiteRTTokenizer(tokenizer, max_length)
        self.cls_id = tokenizer.vocab.index("[CLS]")
        super().__init__(model, {"classify": (self.classify, [TEXT])})

    def classify(self, text):
        pieces = self.source.pieces(text)
        lengths = tf.minimum(tf.cast(pieces.row_lengths(), tf.int32) + 1, self.max_length)
        width = tf.reduce_max(tf.concat([lengths, [1]], axis=0))  # [CLS] alone for an empty text
        inside = tf.pad(dense_rows(pieces, width), [[0, 0], [1, 0]])[:, :width]  # column j: piece j - 1
        columns = tf.range(width)[None, :]
        ids = tf.where(columns == 0, self.cls_id, tf.where(columns < lengths[:, None], inside, 0))
        logits = tf.cast(self.model.head(self.model.embed(ids, training=False), training=False), tf.float32)
        label_id = tf.argmax(logits, axis=-1, output_type=tf.int32)
        return {"label": tf.gather(tf.constant(self.labels), label_id), "label_id": label_id,
                "probabilities": tf.nn.softmax(logits, axis=-1)}

    def settings(self):
        return {"kind": "classification", "labels": self.labels, "max_length": self.max_length,
                "lowercase": self.source.tokenizer.lower_case, "max_bytes": self.source.max_bytes}


def convert(service, quantization=None):
    """The LiteRT file (bytes) of `service`'s signatures: builtin operators and tensorflow-text's only."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS} (or none, for float32), got {quantization!r}")
    with tempfile.TemporaryDirectory() as directory:
        with cache_writes_for_litert():
            signatures = service.signatures()
        tf.saved_model.save(service.root, directory, signatures=signatures)
        converter = tf.lite.TFLiteConverter.from_saved_model(directory, signature_keys=list(signatures))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        converter.allow_custom_ops = True  # tensorflow-text's kernels, checked by name below
        if quantization is not None:
            converter.optimizations = [tf.lite.Optimize.DEFAULT]  # without data: dynamic-range int8 weights
        if quantization == "float16":
            converter.target_spec.supported_types = [tf.float16]
        model = converter.convert()
    check_operators(model)
    return model


def operators(model):
    """The names of the operators a LiteRT file (bytes) uses: builtin ones by their enum name, custom ones by theirs."""
    from ai_edge_litert import schema_py_generated as schema

    names = {value: name for name, value in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    flatbuffer = schema.Model.GetRootAsModel(model, 0)
    found = set()
    for index in range(flatbuffer.OperatorCodesLength()):
        code = flatbuffer.OperatorCodes(index)
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        found.add(code.CustomCode().decode() if builtin == schema.BuiltinOperator.CUSTOM else names[builtin])
    return sorted(found)


def check_operators(model):
    """A ValueError naming every operator of `model` that is neither builtin nor a tensorflow-text kernel."""
    from ai_edge_litert import schema_py_generated as schema

    builtin = set(vars(schema.BuiltinOperator))
    foreign = [name for name in operators(model) if name not in builtin and name not in TEXT_OPERATORS]
    if foreign:
        raise ValueError(f"the LiteRT file would need operators the mobile runtime lacks: {', '.join(foreign)}")


def export_litert(service, out_dir, quantization=None):
    """Write `service` (e.g. `LiteRTTranslation`) into the new directory `out_dir`; returns `out_dir`.

    Converted into a temporary directory beside `out_dir` and renamed when
    whole: a failed conversion leaves nothing, and an existing `out_dir` is
    refused before any work.
    """
    if os.path.exists(out_dir):
        raise FileExistsError(f"{out_dir} already exists: pick another directory or remove it first")
    model = convert(service, quantization)
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    partial = tempfile.mkdtemp(prefix=".litert-", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(partial, 0o777 & ~umask)  # as os.makedirs would have made it, not mkdtemp's owner-only
    try:
        with open(os.path.join(partial, MODEL_FILE), "wb") as file:
            file.write(model)
        write_json(os.path.join(partial, SETTINGS_FILE), {
            **service.settings(), "quantization": quantization or "float32", "operators": operators(model),
            "signature": {name: {"inputs": [spec.name for spec in function.structured_input_signature[0]],
                                 "outputs": sorted(function.structured_outputs)}
                          for name, function in service.signatures().items()},
        })
        os.rename(partial, out_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return out_dir


def read_settings(out_dir):
    with open(os.path.join(out_dir, SETTINGS_FILE), encoding="utf-8") as file:
        return json.load(file)
