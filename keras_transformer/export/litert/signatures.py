"""What a LiteRT file answers: one service per kind of run, its signatures traced from the library's own objects.

`LiteRTTranslation` (`text` -> `translation`, `score`, `truncated`),
`LiteRTClassification` (`text` -> `label`, `label_id`, `probabilities`) and
`LiteRTGeneration` (`text` -> `text`, `continuation`, `new_tokens`; and
`generate` with sampling settings), each a `LiteRTService` that
`converter.export_litert` converts. With `ops="builtin"` each takes its
texts' `pieces` (int32, as the host's tokenizer numbers them) and answers
ids (`tokens`, `label_id`), the tokenizers beside the file
(`device_text`).
"""

import tensorflow as tf

from keras_transformer.export.litert.cache import write_along
from keras_transformer.export.litert.decoding import LiteRTDecoding
from keras_transformer.export.litert.text import Framing, LiteRTTokenizer
from keras_transformer.inference.generator import framed_padded_prompts, framed_prompts
from keras_transformer.inference.sampling import SamplingSettings
from keras_transformer.inference.search import beam_rows_per_source
from keras_transformer.inference.tracing import graph_function
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
# A builtin file's inputs: each text's pieces as the host's tokenizer numbers them (0 after them), and
# a multilingual checkpoint's language tokens as ids.
PIECES = tf.TensorSpec([None, None], tf.int32, name="pieces")
SOURCE_LANGUAGE_ID = tf.TensorSpec([None], tf.int32, name="source_language_id")
TARGET_LANGUAGE_ID = tf.TensorSpec([None], tf.int32, name="target_language_id")
# What a file holds around the model: tensorflow-text's kernels and text in and out, or builtin
# operators only and ids in and out (the host tokenizes: `export.litert.device_text`).
OPS = ("text", "builtin")


def id_specs(fixed_rows, width):
    """A builtin file's inputs: `pieces` and the language ids of any size, or of `fixed_rows` rows of `width` ids.

    LiteRT.js runs a file whose inputs have fixed shapes only (a web page's
    file, `export.web`); the runner then pads each text's pieces to `width`.
    """
    if fixed_rows is None:
        return PIECES, SOURCE_LANGUAGE_ID, TARGET_LANGUAGE_ID
    return (tf.TensorSpec([fixed_rows, width], tf.int32, name="pieces"),
            tf.TensorSpec([fixed_rows], tf.int32, name="source_language_id"),
            tf.TensorSpec([fixed_rows], tf.int32, name="target_language_id"))


def check_ops(ops):
    if ops not in OPS:
        raise ValueError(f"ops must be one of {OPS}, got {ops!r}")


def pieces_and_counts(pieces):
    """`(pieces, counts)` of a builtin file's `pieces` input: its `(batch, width)` ids and each row's count (no 0)."""
    return pieces, tf.reduce_sum(tf.cast(pieces != 0, tf.int32), axis=1)


def first_columns(pieces, width):
    """The first `width` columns of `(batch, columns)` ids, padded with 0 where there are fewer."""
    return tf.pad(pieces, [[0, 0], [0, width]])[:, :width]


class LiteRTService:
    """What `export_litert` converts: the signatures, and `root`, a `tf.Module` holding the model's variables.

    The signatures close over the Python objects they call, which the
    module does not track. They are not the module's methods either: a
    method is traced again when the module is saved (in the saving
    context), and the converter reads the signatures alone.
    """

    def __init__(self, model, functions, ops="text", fixed_rows=None):
        self.ops, self.fixed_rows = ops, fixed_rows
        self.root = tf.Module(name="litert")
        self.root.model_variables = [variable.value for variable in model.variables]
        self.functions = {name: graph_function(function, input_signature=input_signature)
                          for name, (function, input_signature) in functions.items()}
        self.names = list(functions)

    def signature_keys(self):
        """The file's signatures by name: the first method's is `serving_default`."""
        return ["serving_default"] + list(self.names[1:])

    def signatures(self):
        functions = [self.functions[name].get_concrete_function() for name in self.names]
        return dict(zip(self.signature_keys(), functions))


class LiteRTTranslation(LiteRTService):
    """A `Translator` in LiteRT's ops: `translate(text) -> {"translation", "score", "truncated"}` (module docstring).

    A multilingual checkpoint's (M2M100, NLLB) has the SavedModel's
    `translate_between` too: `text`, `source_language`, `target_language`.
    With `ops="builtin"`, ids in and out: `translate(pieces) -> {"tokens",
    "score", "truncated"}` (`truncated` as int32 1 or 0) and `translate_between(pieces, source_language_id,
    target_language_id)`.
    """

    def __init__(self, translator, ops="text", fixed_rows=None):
        check_ops(ops)
        self.translator = translator
        max_length = translator.model.max_length
        if ops == "text":
            self.source = LiteRTTokenizer(translator.source_tokenizer, max_length)
            functions = {"translate": (self.translate, [TEXT])}
            between = (self.translate_between, [TEXT, SOURCE_LANGUAGE, TARGET_LANGUAGE])
        else:
            self.source = Framing(translator.source_tokenizer, max_length)
            pieces, source_language, target_language = id_specs(fixed_rows, max_length)
            functions = {"translate": (self.translate_pieces, [pieces])}
            between = (self.translate_pieces_between, [pieces, source_language, target_language])
        if translator.languages:
            functions["translate_between"] = between
        super().__init__(translator.model, functions, ops, fixed_rows)

    def translate(self, text):
        return self._translation(*self.source.framed_and_truncated(text))

    def translate_pieces(self, pieces):
        pieces, counts = pieces_and_counts(pieces)
        return self._translation(*self.source.framed_and_truncated(lambda width: first_columns(pieces, width), counts))

    def translate_pieces_between(self, pieces, source_language_id, target_language_id):
        """`translate_pieces` with each text's own language tokens (the host looks their codes up)."""
        pieces, counts = pieces_and_counts(pieces)
        framed, truncated = self.source.framed_and_truncated(lambda width: first_columns(pieces, width), counts,
                                                              source_language_id)
        return self._translation(framed, truncated, first_ids=target_language_id)

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
        if self.ops == "builtin":  # int32 flags: LiteRT.js reads float32, int32 and uint8 tensors only
            return {"tokens": tokens, "score": scores, "truncated": tf.cast(truncated, tf.int32)}
        return {"translation": translator.target_tokenizer.detokenize(tokens), "score": scores, "truncated": truncated}

    def settings(self):
        translator = self.translator
        text_settings = ({"lowercase": self.source.lower_case, "max_bytes": self.source.max_bytes}
                         if self.ops == "text" else {})
        return {
            "kind": "translation", **translator.settings.to_config(), "max_source_length": translator.model.max_length,
            "max_source_pieces": translator.pieces_read,
            "sentences_per_run": self._sentences_per_run(), **text_settings,
            **({"languages": translator.languages} if translator.languages else {}),
        }

    def tokenizers(self):
        """The tokenizers a builtin file's host runs, by the name `litert.json` gives them."""
        return {"source": self.translator.source_tokenizer, "target": self.translator.target_tokenizer}

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
    the head. With `ops="builtin"`: `classify(pieces) -> {"label_id",
    "probabilities"}` (the labels are in `litert.json`).
    """

    def __init__(self, model, tokenizer, max_length, labels, ops="text", fixed_rows=None):
        check_ops(ops)
        self.model, self.tokenizer, self.max_length, self.labels = model, tokenizer, max_length, list(labels)
        self.cls_id = tokenizer.vocab.index("[CLS]")
        if ops == "text":
            self.source = LiteRTTokenizer(tokenizer, max_length)
            function = self.classify
        else:
            function = self.classify_pieces
        spec = TEXT if ops == "text" else id_specs(fixed_rows, max_length)[0]
        super().__init__(model, {"classify": (function, [spec])}, ops, fixed_rows)

    def classify(self, text):
        pieces = self.source.pieces(text)
        outputs = self._classified(lambda width: dense_rows(pieces, width), tf.cast(pieces.row_lengths(), tf.int32))
        return {"label": tf.gather(tf.constant(self.labels), outputs["label_id"]), **outputs}

    def classify_pieces(self, pieces):
        pieces, counts = pieces_and_counts(pieces)
        return self._classified(lambda width: first_columns(pieces, width), counts)

    def _classified(self, columns_of, counts):
        """`label_id` and `probabilities` of texts of `counts` pieces; `columns_of(width)`: their first `width`."""
        lengths = tf.minimum(counts + 1, self.max_length)
        width = tf.reduce_max(tf.concat([lengths, [1]], axis=0))  # [CLS] alone for an empty text
        inside = tf.pad(columns_of(width), [[0, 0], [1, 0]])[:, :width]  # column j: piece j - 1
        columns = tf.range(width)[None, :]
        ids = tf.where(columns == 0, self.cls_id, tf.where(columns < lengths[:, None], inside, 0))
        logits = tf.cast(self.model.head(self.model.embed(ids, training=False), training=False), tf.float32)
        return {"label_id": tf.argmax(logits, axis=-1, output_type=tf.int32),
                "probabilities": tf.nn.softmax(logits, axis=-1)}

    def settings(self):
        text_settings = ({"lowercase": self.source.lower_case, "max_bytes": self.source.max_bytes}
                         if self.ops == "text" else {})
        return {"kind": "classification", "labels": self.labels, "max_length": self.max_length, **text_settings}

    def tokenizers(self):
        return {"text": self.tokenizer}


class LiteRTGeneration(LiteRTService):
    """A language model in LiteRT's ops, around an `inference.Generator`: prompts in, text out.

    Signatures, as the SavedModel's (`export.language_model`), with the
    outputs `text`, `continuation` (string `[batch]`) and `new_tokens` (int32):
    `serving_default` takes `text` and samples with the export's settings and
    seed 0; `generate` also takes the scalars `seed` (int32), `temperature`,
    `top_k`, `top_p` and `max_new_tokens`. A LiteRT file cannot refuse a
    request, so settings out of range are brought into it (a negative
    temperature is greedy, `max_new_tokens` at most what the model has room
    for); `keras_transformer.on_device` refuses them first. With
    `ops="builtin"`, `pieces` in place of `text`, and the outputs `tokens`
    (`(batch, max_length)`, [START] first, 0 after), `lengths` and `new_tokens`.
    """

    SETTINGS = (("seed", tf.int32), ("temperature", tf.float32), ("top_k", tf.int32), ("top_p", tf.float32),
                ("max_new_tokens", tf.int32))

    def __init__(self, generator, ops="text", fixed_rows=None):
        check_ops(ops)
        self.generator = generator
        if ops == "text":
            self.source = LiteRTTokenizer(generator.tokenizer, generator.model.max_length)
        settings = [tf.TensorSpec([], dtype, name=name) for name, dtype in self.SETTINGS]
        prompts = TEXT if ops == "text" else id_specs(fixed_rows, generator.model.max_length)[0]
        super().__init__(generator.model, {"generate_with_defaults": (self.generate_with_defaults, [prompts]),
                                           "generate": (self.generate, [prompts, *settings])}, ops, fixed_rows)

    def generate_with_defaults(self, prompts):
        defaults = self.generator.defaults
        return self.generate(prompts, tf.constant(0), *(tf.constant(defaults[name], dtype)
                                                        for name, dtype in self.SETTINGS[1:]))

    def generate(self, prompts, seed, temperature, top_k, top_p, max_new_tokens):
        """Continue `prompts` (texts, or a builtin file's `pieces`) with these sampling settings."""
        generator, max_length = self.generator, self.generator.model.max_length
        max_new_tokens = tf.clip_by_value(max_new_tokens, 1, max_length - 1)
        top_p = tf.where((top_p > 0) & (top_p <= 1), top_p, 1.0)
        room, start_id = max_length - max_new_tokens, generator.tokenizer.start_id
        if self.ops == "text":
            prompts, prompt_lengths = framed_prompts(self.source.pieces(prompts), start_id, room)
        else:
            pieces, counts = pieces_and_counts(prompts)
            prompts, prompt_lengths = framed_padded_prompts(first_columns(pieces, tf.maximum(tf.shape(pieces)[1], 1)),
                                                            counts, start_id, room)
        settings = SamplingSettings(max_new_tokens, tf.maximum(temperature, 0.0), tf.maximum(top_k, 0), top_p, seed)
        tokens, lengths = generator.sample(prompts, prompt_lengths, settings, cache_policy=LANGUAGE_MODEL_CACHE)
        # Padded to the model's length: the detokenizer's string join needs its width when traced.
        tokens = tf.reshape(tf.pad(tokens, [[0, 0], [0, max_length - tf.shape(tokens)[1]]]), [-1, max_length])
        if self.ops == "builtin":
            return {"tokens": tokens, "lengths": lengths, "new_tokens": lengths - prompt_lengths}
        outputs = generator.outputs(tokens, lengths, prompt_lengths)
        return {name: outputs[name] for name in ("text", "continuation", "new_tokens")}

    def settings(self):
        text_settings = ({"lowercase": self.source.lower_case, "max_bytes": self.source.max_bytes}
                         if self.ops == "text" else {})
        return {"kind": "language_model", **self.generator.defaults, "max_length": self.generator.model.max_length,
                **text_settings}

    def tokenizers(self):
        return {"text": self.generator.tokenizer}
