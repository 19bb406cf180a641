"""What a LiteRT file answers: one service per kind of run, its signatures traced from the library's own objects.

`LiteRTTranslation` (`text` -> `translation`, `score`, `truncated`),
`LiteRTClassification` (`text` -> `label`, `label_id`, `probabilities`) and
`LiteRTGeneration` (`text` -> `text`, `continuation`, `new_tokens`; and
`generate` with sampling settings), each a `LiteRTService` that
`converter.export_litert` converts.
"""

import tensorflow as tf

from keras_transformer.export.litert.cache import write_along
from keras_transformer.export.litert.decoding import LiteRTDecoding
from keras_transformer.export.litert.text import LiteRTTokenizer
from keras_transformer.inference.generator import framed_prompts
from keras_transformer.inference.search import beam_rows_per_source
from keras_transformer.inference.sampling import SamplingSettings
from keras_transformer.layers.cached_attention import KeyValueCache
from keras_transformer.on_device import DEFAULT_BATCH_SIZE  # what the runner gives the file at once
from keras_transformer.text.portable import dense_rows

# Where a full batch's self-attention cache would grow by more than CACHE_BYTES_PER_POSITION a
# position, the runner gives the file at most ROWS_PER_RUN rows (sentences x the search's rows per
# sentence) at once, and a larger batch goes in parts. A beam search's step over a large cache is
# memory-bound: at beam 4, 16 sentences a run ran as fast as 32 or faster on OPUS-MT-base's size (3
# MiB a position for 32 sentences), where it held half the memory, and on the Multi30k recipe's (0.9
# MiB, with the greedy path beside the beams); on the demo run's small model (0.3 MiB) each run's
# fixed work weighed more, and 32 were faster (BENCHMARKS.md, "On device").
CACHE_BYTES_PER_POSITION = 512 * 1024
ROWS_PER_RUN = 64


# A language model's cache keeps its room for every position from the start: each step writes its
# position with LiteRT's block write.
LANGUAGE_MODEL_CACHE = KeyValueCache(write=lambda cached, new, index: write_along(cached, new, index, axis=2))

TEXT = tf.TensorSpec([None], tf.string, name="text")
SOURCE_LANGUAGE = tf.TensorSpec([None], tf.string, name="source_language")
TARGET_LANGUAGE = tf.TensorSpec([None], tf.string, name="target_language")


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

    def signature_keys(self):
        """The file's signatures by name: the first method's is `serving_default`."""
        return ["serving_default"] + list(self.names[1:])

    def signatures(self):
        functions = [getattr(self.root, name).get_concrete_function() for name in self.names]
        return dict(zip(self.signature_keys(), functions))


class LiteRTTranslation(LiteRTService):
    """A `Translator` in LiteRT's ops: `translate(text) -> {"translation", "score", "truncated"}` (module docstring).

    A multilingual checkpoint's (M2M100, NLLB) has the SavedModel's
    `translate_between` too: `text`, `source_language`, `target_language`.
    """

    def __init__(self, translator):
        self.translator = translator
        self.source = LiteRTTokenizer(translator.source_tokenizer, translator.model.max_length)
        functions = {"translate": (self.translate, [TEXT])}
        if translator.languages:
            functions["translate_between"] = (self.translate_between, [TEXT, SOURCE_LANGUAGE, TARGET_LANGUAGE])
        super().__init__(translator.model, functions)

    def translate(self, text):
        return self._translation(*self.source.framed_and_truncated(text))

    def translate_between(self, text, source_language, target_language):
        """`translate` with each text's own language pair, as `Translator.translate_between`.

        LiteRT has no op that fails a request: a text whose codes the model
        does not name gets the translation "" and the score NaN (the runner,
        `on_device.LiteRTModel.translate`, refuses such a request before the
        file runs).
        """
        translator = self.translator
        source_ids, source_known = translator.source_tokenizer.language_lookup(source_language)
        target_ids, target_known = translator.target_tokenizer.language_lookup(target_language)
        return self._translation(*self.source.framed_and_truncated(text, source_ids), first_ids=target_ids,
                                 unanswered=~(source_known & target_known))

    def _translation(self, source_ids, truncated, first_ids=None, unanswered=None):
        """The search and the detokenizer; `unanswered` rows get "" and the score NaN; `truncated` passed on."""
        translator = self.translator
        tokens, scores = translator.search(source_ids, first_ids=first_ids, decoding=LiteRTDecoding())
        # The frame alone ([START] [END]): nothing to translate.
        empty = tf.reduce_sum(tf.cast(source_ids != 0, tf.int32), axis=1) <= translator.source_tokenizer.frame_length
        scores = tf.where(empty, 0.0, scores)
        if unanswered is not None:
            empty |= unanswered
            scores = tf.where(unanswered, float("nan"), scores)
        tokens = tf.where(empty[:, None], 0, tokens)  # no tokens: "" (LiteRT selects no strings)
        # Padded to the longest output allowed: the detokenizer's string join needs its width when traced.
        cap = translator.settings.max_output_length
        tokens = tf.reshape(tf.pad(tokens, [[0, 0], [0, cap - tf.shape(tokens)[1]]]), [-1, cap])
        return {"translation": translator.target_tokenizer.detokenize(tokens), "score": scores, "truncated": truncated}

    def settings(self):
        translator = self.translator
        return {
            "kind": "translation", **translator.settings.to_config(), "max_source_length": translator.model.max_length,
            "max_source_pieces": translator.pieces_read,
            "sentences_per_run": self._sentences_per_run(),
            "lowercase": self.source.lower_case, "max_bytes": self.source.max_bytes,
            **({"languages": translator.languages} if translator.languages else {}),
        }

    def _sentences_per_run(self):
        """The sentences the runner gives the file at once (`CACHE_BYTES_PER_POSITION`, `ROWS_PER_RUN`)."""
        settings, decoder = self.translator.settings, self.translator.model.decoder
        rows = 1 if settings.beam_size == 1 else beam_rows_per_source(settings.beam_size, settings.keep_greedy)
        keys_and_values = 2 * decoder.num_layers * decoder.d_model * 4  # float32, a row's, a position's
        if DEFAULT_BATCH_SIZE * rows * keys_and_values <= CACHE_BYTES_PER_POSITION:
            return DEFAULT_BATCH_SIZE
        return max(1, min(DEFAULT_BATCH_SIZE, ROWS_PER_RUN // rows))


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
                "lowercase": self.source.lower_case, "max_bytes": self.source.max_bytes}


class LiteRTGeneration(LiteRTService):
    """A language model in LiteRT's ops, around an `inference.Generator`: prompts in, text out.

    Signatures, as the SavedModel's (`export.language_model`), with the
    outputs `text`, `continuation` (string `[batch]`) and `new_tokens` (int32):
    `serving_default` takes `text` and samples with the export's settings and
    seed 0; `generate` also takes the scalars `seed` (int32), `temperature`,
    `top_k`, `top_p` and `max_new_tokens`. A LiteRT file cannot refuse a
    request, so settings out of range are brought into it (a negative
    temperature is greedy, `max_new_tokens` at most what the model has room
    for); `keras_transformer.on_device` refuses them first.
    """

    SETTINGS = (("seed", tf.int32), ("temperature", tf.float32), ("top_k", tf.int32), ("top_p", tf.float32),
                ("max_new_tokens", tf.int32))

    def __init__(self, generator):
        self.generator = generator
        self.source = LiteRTTokenizer(generator.tokenizer, generator.model.max_length)
        settings = [tf.TensorSpec([], dtype, name=name) for name, dtype in self.SETTINGS]
        super().__init__(generator.model, {"generate_with_defaults": (self.generate_with_defaults, [TEXT]),
                                           "generate": (self.generate, [TEXT, *settings])})

    def generate_with_defaults(self, text):
        defaults = self.generator.defaults
        return self.generate(text, tf.constant(0), *(tf.constant(defaults[name], dtype)
                                                     for name, dtype in self.SETTINGS[1:]))

    def generate(self, text, seed, temperature, top_k, top_p, max_new_tokens):
        generator, max_length = self.generator, self.generator.model.max_length
        max_new_tokens = tf.clip_by_value(max_new_tokens, 1, max_length - 1)
        top_p = tf.where((top_p > 0) & (top_p <= 1), top_p, 1.0)
        prompts, prompt_lengths = framed_prompts(self.source.pieces(text), generator.tokenizer.start_id,
                                                 max_length - max_new_tokens)
        settings = SamplingSettings(max_new_tokens, tf.maximum(temperature, 0.0), tf.maximum(top_k, 0), top_p, seed)
        tokens, lengths = generator.sample(prompts, prompt_lengths, settings, cache_policy=LANGUAGE_MODEL_CACHE)
        # Padded to the model's length: the detokenizer's string join needs its width when traced.
        tokens = tf.reshape(tf.pad(tokens, [[0, 0], [0, max_length - tf.shape(tokens)[1]]]), [-1, max_length])
        outputs = generator.outputs(tokens, lengths, prompt_lengths)
        return {name: outputs[name] for name in ("text", "continuation", "new_tokens")}

    def settings(self):
        return {"kind": "language_model", **self.generator.defaults, "max_length": self.generator.model.max_length,
                "lowercase": self.source.lower_case, "max_bytes": self.source.max_bytes}
