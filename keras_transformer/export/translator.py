"""The whole translator as one SavedModel: raw strings in, translations out.

Tutorials usually export a model that needs Python around it (a tokenizer
in the client, a decoding loop in a script). Here the tokenizer, the cached
beam search and the detokenizer are all in the graph, built from TensorFlow
and tensorflow-text ops only, so the stock `tensorflow_model_server` (which
links tensorflow-text's ops) serves it as it is. It is written as version
`EXPORT_BASE/<version>/` (see `versions`).

Signatures (see `SIGNATURES` and `LANGUAGE_PAIR_SIGNATURES`):
- `serving_default`: `text` (string `[batch]`) -> `translation` (string
  `[batch]`), `score` (float32 `[batch]`, the length-normalised log-probability),
  `truncated` (bool `[batch]`: the text was longer than the model reads, and
  only its first `max_source_pieces` pieces, `translator.json`, were translated).
- `translate_with_attention`: the same plus `source_tokens`, `target_tokens`
  (string `[batch, None]`, padded with "") and `cross_attention` (float32
  `[batch, layers, heads, target_tokens, source_tokens]`).
- `score_tokens`: `source_ids`, `target_ids` (int32 `[batch, None]`, 0 =
  padding, targets starting with [START]) -> `logits` (float32
  `[batch, target_len, target_vocab]`), for clients that tokenize themselves.
- `translate_between`, in the export of an M2M100 or NLLB checkpoint only:
  `text`, `source_language`, `target_language` -> `translation`, `score`,
  `truncated` (see `Translator.translate_between`; `translator.json` lists the codes).

Inputs are checked in the graph before any other kernel sees them (see
`requests`): anything of another rank is refused with an `InvalidArgument`
error naming the input. Within those shapes: an empty string translates to
"", a source longer than the model's `max_length` is truncated to it, an
empty batch gives empty outputs, bytes that are not UTF-8 are replaced by
U+FFFD.
"""

import os

import tensorflow as tf

from keras_transformer.export.captures import call_naming_captures, capture_names
from keras_transformer.export.requests import (
    SOURCE_IDS,
    SOURCE_LANGUAGE,
    TARGET_IDS,
    TARGET_LANGUAGE,
    TEXT,
    check_ids,
    checked_id_batches,
    checked_rank,
    checked_sentences,
)
from keras_transformer.export.versions import version_path, write_version
from keras_transformer.inference.tracing import graph_function
from keras_transformer.saving import read_json

SIGNATURES = {
    "serving_default": ("text",),
    "translate_with_attention": ("text",),
    "score_tokens": ("source_ids", "target_ids"),
}
# The signature of a multilingual checkpoint's export (`Translator.languages`), beside those above.
LANGUAGE_PAIR_SIGNATURES = {"translate_between": ("text", "source_language", "target_language")}
# What the export records beside its graph (`assets.extra/`): its settings and signatures.
SETTINGS_FILE = "translator.json"
# What `serving_default` and `translate_between` answer.
TRANSLATION_OUTPUTS = ("translation", "score", "truncated")

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
        self._logits = graph_function(lambda source_ids, target_ids: model((source_ids, target_ids), training=False))
        # What the signatures capture is named after the weights' paths (see `call_naming_captures`).
        self._capture_names = capture_names(model)

    @graph_function(input_signature=[TEXT])
    def serve(self, text):
        outputs = call_naming_captures(self.translator.__call__, self._capture_names, checked_sentences(text))
        return {name: outputs[name] for name in TRANSLATION_OUTPUTS}

    @graph_function(input_signature=[TEXT])
    def translate_with_attention(self, text):
        outputs = call_naming_captures(
            self.translator.translate_with_attention, self._capture_names, checked_sentences(text)
        )
        names = (*TRANSLATION_OUTPUTS, "source_tokens", "target_tokens", "cross_attention")
        return {name: outputs[name] for name in names}

    @graph_function(input_signature=[TEXT, SOURCE_LANGUAGE, TARGET_LANGUAGE])
    def translate_between(self, text, source_language, target_language):
        expected = "a string vector of shape [batch], one code per text"
        inputs = (checked_sentences(text), checked_rank(source_language, "source_language", 1, expected),
                  checked_rank(target_language, "target_language", 1, expected))
        outputs = call_naming_captures(self.translator.translate_between, self._capture_names, *inputs)
        return {name: outputs[name] for name in TRANSLATION_OUTPUTS}

    @graph_function(input_signature=[SOURCE_IDS, TARGET_IDS])
    def score_tokens(self, source_ids, target_ids):
        model = self.translator.model
        source_ids, target_ids = checked_id_batches(source_ids, target_ids)
        checks = [
            check_ids(source_ids, model.src_vocab_size, "source_ids"),
            check_ids(target_ids, model.tgt_vocab_size, "target_ids"),
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
            logits = call_naming_captures(self._logits, self._capture_names, source_ids, target_ids)
        return {"logits": tf.cast(logits, tf.float32)}

    def signatures(self):
        return {
            name: getattr(self, _FUNCTIONS[name]).get_concrete_function()
            for name in exported_signatures(self.translator)
        }

    def saveable(self):
        """The object to hand to `tf.saved_model.save` beside `signatures()`: what the signatures read.

        The functions read the `tf.Variable`s inside the Keras variables, so
        those are what must be saved. Saving the Keras wrappers instead makes
        the export save a copy of each variable under another name, and a
        session-based loader (`saved_model_cli run`, TensorFlow Serving)
        restores the copies while the functions read the uninitialised
        originals. The functions are not the object's methods: a loader
        calls the signatures, and a method would be traced again (in the
        saving context) and saved twice.
        """
        root = tf.Module(name="translation_service")
        root.model_variables = [variable.value for variable in self.translator.model.variables]
        # A checkpoint's SentencePiece tokenizers hold resources (the model, the piece table) that the
        # export must carry; our WordPiece tokenizers hold constants only.
        root.tokenizers = [self.translator.source_tokenizer, self.translator.target_tokenizer]
        return root


# The service's method behind each signature.
_FUNCTIONS = {"serving_default": "serve", "translate_with_attention": "translate_with_attention",
              "score_tokens": "score_tokens", "translate_between": "translate_between"}


def exported_signatures(translator):
    """`{signature: its inputs}` of `translator`'s export: `SIGNATURES`, and `translate_between` where it has languages."""
    return {**SIGNATURES, **(LANGUAGE_PAIR_SIGNATURES if translator.languages else {})}


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
    version_path(export_base, version)  # a taken version is refused before anything is traced
    return write_version(export_base, version, TranslationService(translator), SETTINGS_FILE, _settings(translator))


def export_settings(version_dir):
    """What the export at `version_dir` recorded of itself (`_settings`), or {} where it recorded nothing."""
    path = os.path.join(version_dir, "assets.extra", SETTINGS_FILE)
    return read_json(path) if os.path.exists(path) else {}


def signature_names(version_dir):
    """The signatures an export at `version_dir` answers, as its `translator.json` lists them."""
    return list(export_settings(version_dir)["signatures"])


def _settings(translator):
    """What `assets.extra/translator.json` records: the decoding settings and the model's sizes."""
    model = translator.model
    return {
        **translator.settings.to_config(),
        "max_source_length": model.max_length,
        "max_source_pieces": translator.pieces_read,
        "source_vocab_size": model.src_vocab_size,
        "target_vocab_size": model.tgt_vocab_size,
        "num_layers": model.num_layers,
        "num_heads": model.num_heads,
        "signatures": {name: list(inputs) for name, inputs in exported_signatures(translator).items()},
        **({"languages": translator.languages} if translator.languages else {}),
    }
