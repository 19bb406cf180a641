"""A trained language model as one SavedModel: prompts in, generated text out.

The language model's counterpart of `export_translator`: the WordPiece
tokenizer, the sampler on the key/value cache and the detokenizer are one
graph of TensorFlow and tensorflow-text ops (the `inference.Generator` the
CLI uses), so the stock `tensorflow_model_server` serves it. It is written
as version `EXPORT_BASE/<version>/` (see `versions`);
`assets.extra/language_model.json` records the default settings and the
model's sizes.

Signatures (see `LANGUAGE_MODEL_SIGNATURES`), both with the outputs `text`
(string `[batch]`: the prompt as the model read it, then its continuation),
`continuation` (string `[batch]`, the new text alone) and `new_tokens`
(int32 `[batch]`):
- `serving_default`: `text` (string `[batch]`), sampled with the settings
  the export was made with and seed 0: the same prompt, the same answer,
  whatever else is in the batch (up to the rounding of the prompts' shared
  positions, which are read in one pass).
- `generate`: `text` plus the scalars `seed` (int64), `temperature`
  (float32, 0 = greedy), `top_k` (int32, 0 = no limit), `top_p` (float32,
  1 = no limit) and `max_new_tokens` (int32). TensorFlow Serving wants every
  input of a signature in a request, so the settings are a signature of
  their own rather than optional inputs.

Inputs are checked in the graph before anything reads them (see
`requests`): `text` must be a string vector and every setting a scalar in
its range, else an `InvalidArgument` error names the input. An empty prompt
is continued from [START]; a prompt longer than the model can read beside
what it writes keeps its last pieces; an empty batch gives empty outputs.
"""

import tensorflow as tf

from keras_transformer.export.captures import call_naming_captures, capture_names
from keras_transformer.export.requests import TEXT, checked_rank, checked_sentences
from keras_transformer.export.versions import version_path, write_version
from keras_transformer.inference.generator import settings_rules
from keras_transformer.inference.tracing import graph_function

# The settings `generate` takes, in its argument order: (name, dtype).
SETTINGS = (("seed", tf.int64), ("temperature", tf.float32), ("top_k", tf.int32), ("top_p", tf.float32),
            ("max_new_tokens", tf.int32))
LANGUAGE_MODEL_SIGNATURES = {"serving_default": ("text",), "generate": ("text", *(name for name, _ in SETTINGS))}
OUTPUTS = ("text", "continuation", "new_tokens")


class GenerationService:
    """The signatures of a language model's export, around a `keras_transformer.inference.Generator`.

    Args:
        generator: the `Generator` whose default settings `serving_default` uses.

    Example:
    >>> service = GenerationService(generator)
    >>> service.serve(tf.constant(["This movie was"]))["text"]
    """

    def __init__(self, generator):
        self.generator = generator
        self._generate = graph_function(generator.generate)
        self._capture_names = capture_names(generator.model)

    def _outputs(self, text, *settings):
        outputs = call_naming_captures(self._generate, self._capture_names, text, *settings)
        return {name: outputs[name] for name in OUTPUTS}

    @graph_function(input_signature=[TEXT])
    def serve(self, text):
        defaults = self.generator.defaults
        settings = [tf.constant(0, tf.int64)] + [
            tf.constant(defaults[name], dtype) for name, dtype in SETTINGS[1:]
        ]
        return self._outputs(checked_sentences(text), *settings)

    @graph_function(input_signature=[TEXT, *(tf.TensorSpec(None, dtype, name=name) for name, dtype in SETTINGS)])
    def generate(self, text, seed, temperature, top_k, top_p, max_new_tokens):
        text = checked_sentences(text)
        seed, temperature, top_k, top_p, max_new_tokens = (
            checked_rank(value, name, 0, f"a scalar ({dtype.name})")
            for value, (name, dtype) in zip((seed, temperature, top_k, top_p, max_new_tokens), SETTINGS)
        )
        rules = settings_rules(temperature, top_k, top_p, max_new_tokens, self.generator.model.max_length)
        checks = [tf.debugging.Assert(condition, [message]) for condition, message in rules]
        with tf.control_dependencies(checks):
            text = tf.identity(text)
        return self._outputs(text, seed, temperature, top_k, top_p, max_new_tokens)

    def signatures(self):
        return {"serving_default": self.serve.get_concrete_function(), "generate": self.generate.get_concrete_function()}

    def saveable(self):
        """The object to hand to `tf.saved_model.save` beside `signatures()`: the model's `tf.Variable`s.

        The variables inside the Keras variables, as for the translator (see
        `TranslationService.saveable`).
        """
        root = tf.Module(name="generation_service")
        root.model_variables = [variable.value for variable in self.generator.model.variables]
        return root


def export_language_model(generator, export_base, version=None):
    """Write `generator` (a `keras_transformer.inference.Generator`) as SavedModel version `version`.

    Args:
        generator: the model, its tokenizer and the default settings of `serving_default`.
        export_base: the directory TensorFlow Serving watches.
        version: a positive integer; default one more than the highest
            version already there. An existing version is never overwritten.

    Returns:
        The path of the new version directory.

    Example:
    >>> export_language_model(Generator(model, tokenizer, top_p=0.9), "exports/imdb-lm")
    'exports/imdb-lm/1'
    """
    version_path(export_base, version)  # a taken version is refused before anything is traced
    service = GenerationService(generator)
    return write_version(export_base, version, service, "language_model.json", _settings(generator))


def _settings(generator):
    """What `assets.extra/language_model.json` records: the default settings and the model's sizes."""
    model = generator.model
    return {
        **generator.defaults,
        "seed": 0,
        "max_length": model.max_length,
        "vocab_size": model.vocab_size,
        "lower_case": generator.tokenizer.lower_case,
        "num_layers": model.num_layers,
        "d_model": model.d_model,
        "num_heads": model.num_heads,
        "signatures": {name: list(inputs) for name, inputs in LANGUAGE_MODEL_SIGNATURES.items()},
        "outputs": list(OUTPUTS),
    }
