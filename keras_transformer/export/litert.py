"""A run as one LiteRT file: on-device translation, classification and generation, text in and text out.

LiteRT (formerly TensorFlow Lite) is TensorFlow's runtime for phones,
browsers and small machines. `export_litert` writes a run into a new
directory:

    OUT/model.tflite     the tokenizer, the model, the search and the detokenizer
    OUT/litert.json      what the file holds (its kind, signature, settings, operators)

The file runs on LiteRT's builtin operators plus the tensorflow-text kernels
that `tensorflow_text.tflite_registrar` registers (the WordPiece and
SentencePiece tokenizers, splitting strings into bytes, joining strings):
no TensorFlow ("Flex")
operator, so the plain mobile runtime runs it. `check_operators` reads the
file's operator table and refuses anything else before OUT is written.

What changes on the way from the SavedModel (`export.translator`):

- the search runs in chunks of `CHUNK_STEPS` steps on a self-attention
  cache in two parts, written with LiteRT's `DYNAMIC_UPDATE_SLICE` and
  settled once a chunk, when it grows by a chunk: the searches' shapes
  change only between chunks, where they drop their finished sentences,
  so that LiteRT prepares a chunk's loop once and hands on, uncopied, what
  a step leaves alone (the settled cache: beam search reorders only the
  recent part within a chunk). Beam search's top-k is sized when the loop
  is prepared (`top_k_sized_when_prepared`). The
  log-softmax is spelled out in operators XNNPACK runs. The cache writes
  and the log-softmax are what tracing for LiteRT changes
  (`litert_tracing`). The same translations.
- the text ops are the portable ones (`text.portable`): lowercasing from a
  table, the detokenizer's string join. Two things the SavedModel does to
  its input are left to the caller, since LiteRT has no kernel for them:
  Unicode NFC normalisation (text typed on a keyboard is NFC already; the
  runner in `keras_transformer.on_device` normalises, as an Android app does
  with `java.text.Normalizer`) and repairing invalid UTF-8 (the tokenizer
  reads a malformed byte as an unknown word).
- `quantization`: None (float32), "float16" (weights stored in half
  precision), or "int8" (dynamic-range, no calibration data: every weight
  matrix in int8 with a scale per channel, embeddings and output
  projection included; an embedding table looked up only, with one scale
  for the whole table; a tied one stored once, with a scale per row,
  `one_copy_of_each_table`), whose rows are looked up in int8 and
  scaled (`int8_lookups`). The model computes in float32 whatever
  precision it was trained in.

Three kinds of run, three services: `LiteRTTranslation` (`text` ->
`translation`, `score`, `truncated`), `LiteRTClassification` (`text` -> `label`,
`label_id`, `probabilities`) and `LiteRTGeneration` (`text` -> `text`,
`continuation`, `new_tokens`; and `generate` with sampling settings).
"""

import collections
import logging
import os
import tempfile

import tensorflow as tf

from keras_transformer.inference.generator import framed_prompts
from keras_transformer.inference.search import beam_rows_per_source
from keras_transformer.inference.sampling import SamplingSettings
from keras_transformer.litert_tracing import tracing_for_litert
from keras_transformer.on_device import DEFAULT_BATCH_SIZE, MODEL_FILE, SETTINGS_FILE  # what the runner reads
from keras_transformer.saving import directory_written_whole, write_json
from keras_transformer.text import SentencePieceTokenizer, WordPieceTokenizer
from keras_transformer.text.bpe_merges import BPEMerges, is_bpe
from keras_transformer.text.portable import dense_rows, left_aligned, lowercase_table, lowercase_utf8

QUANTIZATIONS = ("float16", "int8")
# The tensorflow-text kernels `tensorflow_text.tflite_registrar` registers with LiteRT, by operator name.
TEXT_OPERATORS = frozenset({
    "FastWordpieceTokenizeWithOffsets", "TFText>FastWordpieceDetokenize", "FastBertNormalize",
    "TFText>FastSentencepieceTokenize", "TFText>FastSentencepieceDetokenize", "TFText>NgramsStringJoin",
    "TFText>ByteSplitWithOffsets", "TFText>ByteSplitByOffsets", "RaggedTensorToTensor", "TFText>Utf8Binarize",
    "TFText>WhitespaceTokenize",
})
# The searches settle their self-attention cache once every this many steps (`inference.steps`):
# between settles LiteRT's loop copies only the chunk's positions from step to step, and a settle
# appends the chunk to the settled part. The searches drop their finished sentences there too.
CHUNK_STEPS = 8
# Where a full batch's self-attention cache would grow by more than CACHE_BYTES_PER_POSITION a
# position, the runner gives the file at most ROWS_PER_RUN rows (sentences x the search's rows per
# sentence) at once, and a larger batch goes in parts. A beam search's step over a large cache is
# memory-bound: at beam 4, 16 sentences a run ran as fast as 32 or faster on OPUS-MT-base's size (3
# MiB a position for 32 sentences), where it held half the memory, and on the Multi30k recipe's (0.9
# MiB, with the greedy path beside the beams); on the demo run's small model (0.3 MiB) each run's
# fixed work weighed more, and 32 were faster (BENCHMARKS.md, "On device").
CACHE_BYTES_PER_POSITION = 512 * 1024
ROWS_PER_RUN = 64
# Lowercasing reads at most this many bytes of a text per position of the model's input (the
# tokenizer cuts at `max_length` tokens anyway). Only a text whose first `max_length` tokens average
# more than this (words of 30 letters and more, each one [UNK]) is cut sooner than the SavedModel cuts it.
BYTES_PER_POSITION = 32


class LiteRTTokenizer:
    """A run's tokenizer as LiteRT's ops: text -> `(batch, <= max_length)` framed ids, as the SavedModel's.

    A WordPiece vocabulary runs on the same `FastWordpieceTokenizer` kernel
    as in TensorFlow (its lowercasing from a table). A checkpoint's
    SentencePiece model runs on tensorflow-text's `FastSentencepieceTokenizer`,
    LiteRT's kernel, which reimplements SentencePiece's unigram search; a
    BPE model (M2M100's, NLLB's) gets its characters from that kernel and
    its merges from `text.bpe_merges`. The ids are mapped to the
    checkpoint's through the piece each names, and the segmentation is
    compared with the checkpoint tokenizer's on `PROBE_SENTENCES` before
    anything is exported: a model segmented otherwise is refused in one
    line. A multilingual Marian's `>>xx<<` code is split off from the
    text's bytes.

    Args:
        tokenizer: the run's `text.WordPieceTokenizer` or `text.SentencePieceTokenizer`.
        max_length: ids per text at most ([START] ... [END], cut keeping [END]).
    """

    def __init__(self, tokenizer, max_length):
        self.tokenizer, self.max_length = tokenizer, max_length
        self.max_bytes = BYTES_PER_POSITION * max_length
        self.lower_case = isinstance(tokenizer, WordPieceTokenizer) and tokenizer.lower_case
        self.lowercase = lowercase_table() if self.lower_case else None
        if isinstance(tokenizer, WordPieceTokenizer):
            self.leading = [tokenizer.start_id]
            self._segment = tokenizer.wordpiece.tokenize
        elif isinstance(tokenizer, SentencePieceTokenizer):
            self.leading = ([] if tokenizer.start_id is None else [tokenizer.start_id]) + tokenizer.prefix_ids
            self._segment = _sentencepiece_segmenter(tokenizer, max_length)
        else:
            raise ValueError(f"the LiteRT export has no kernel for a {type(tokenizer).__name__}")

    def pieces(self, texts):
        """Ragged `(batch, None)` ids of the texts' pieces, unframed (a BPE model's: the first `max_length`)."""
        if self.lowercase is not None:
            texts = lowercase_utf8(texts, self.lowercase, self.max_bytes)
        return self._segment(texts)

    def framed(self, texts, language_ids=None):
        """`(batch, width)` int32: the leading ids, pieces and [END], cut to `max_length` keeping [END], 0 after.

        `language_ids`: `(batch,)` each text's language token, in place of
        the one prefix token (M2M100's, NLLB's source language).
        """
        return self.framed_and_truncated(texts, language_ids)[0]

    def framed_and_truncated(self, texts, language_ids=None):
        """`(framed(texts), truncated)`: `truncated` `(batch,)` bool, the texts that did not fit `max_length`."""
        pieces = self.pieces(texts)
        leading = len(self.leading)
        full_lengths = tf.cast(pieces.row_lengths(), tf.int32) + leading + 1
        lengths = tf.minimum(full_lengths, self.max_length)
        width = tf.reduce_max(tf.concat([lengths, [0]], axis=0))
        inside = tf.pad(dense_rows(pieces, width), [[0, 0], [leading, 0]])[:, :width]  # column j: piece j - leading
        columns = tf.range(width)[None, :]
        leading_ids = tf.gather(tf.constant(self.leading + [0], tf.int32), tf.minimum(columns, leading))
        if language_ids is not None:
            if len(self.tokenizer.prefix_ids) != 1:
                raise ValueError("only a tokenizer with one prefix token (a language's) takes language_ids")
            leading_ids = tf.where(columns == leading - 1, language_ids[:, None], leading_ids)
        end = self.tokenizer.end_id
        framed = tf.where(columns < leading, leading_ids,
                          tf.where(columns == lengths[:, None] - 1, end, tf.where(columns < lengths[:, None], inside, 0)))
        return framed, full_lengths > self.max_length


# Sentences a SentencePiece model must segment as the checkpoint's tokenizer does for its LiteRT export.
PROBE_SENTENCES = [
    "Hello world.", "The dog's bike, isn't it?", "Ein Mann fährt Fahrrad (mit Hut).", "東京タワー 🙂 emoji",
    "", "  two  spaces ", "ÉNORME Succès: 42 km/h, 3.5%!", "Zwei junge Männer spielen Fußball im Park.",
    "x" * 300, "It's 10:30 - time to go… “quoted” ‘text’",
]


def _sentencepiece_segmenter(tokenizer, max_length):
    """`texts -> ragged ids` of a `SentencePieceTokenizer`'s pieces with LiteRT's kernel, or a ValueError.

    A BPE model's pieces after the first `max_length` (which the frame cuts
    anyway) are not made: see `BPEMerges.first_pieces_only`.
    """
    import tensorflow_text as text

    settings = tokenizer.settings
    # A BPE model (M2M100's, NLLB's): characters from the kernel, merges in the graph (`text.bpe_merges`).
    bpe = BPEMerges(tokenizer.model, word_by_word=settings.word_by_word) if is_bpe(tokenizer.model) else None
    if settings.word_by_word and bpe is None:
        raise ValueError("the LiteRT export cannot run this checkpoint's tokenizer (a unigram model on text split "
                         "at every space): export a SavedModel or a CTranslate2 model instead")
    fast = text.FastSentencepieceTokenizer(bpe.character_model if bpe else tokenizer.model)
    # Each of the model's ids -> ours, through the piece it names; a control piece (<s>, </s>), which
    # segmentation never yields but the fast kernel gives for characters it does not know, is <unk>.
    slow = text.SentencepieceTokenizer(tokenizer.model)
    spm_ids = tf.range(slow.vocab_size())
    pieces = [piece.decode("utf-8") for piece in slow.id_to_string(spm_ids).numpy()]
    alone = slow.detokenize(tf.reshape(spm_ids, [-1, 1])).numpy()
    known = {piece: index for index, piece in enumerate(tokenizer.vocab) if index > 0}
    ours = [tokenizer.unk_id if (not decoded and piece.strip("\u2581") and spm_id > 0) else
            known.get(piece, tokenizer.unk_id) for spm_id, (piece, decoded) in enumerate(zip(pieces, alone))]
    table = tf.constant(ours, tf.int32)
    codes = [token for token in tokenizer.vocab if token.startswith(">>") and token.endswith("<<")]

    def model_ids(texts):  # ragged: the SentencePiece model's ids of each text's pieces
        if bpe is None:
            return fast.tokenize(texts)
        characters = fast.tokenize(texts)
        symbols = dense_rows(characters, _longest(characters), padding=-1)
        if bpe.word_by_word:
            # A leading space is the first word's own "▁" (`_word_by_word`): the one put in front goes.
            symbols = tf.where(_starts_with_space(texts)[:, None],
                               tf.pad(symbols[:, 1:], [[0, 0], [0, 1]], constant_values=-1), symbols)
        if settings.collapse_spaces:  # a run of spaces is one
            spaces = symbols == bpe.word_start_id
            symbols, _ = left_aligned((symbols, spaces), spaces & tf.pad(spaces[:, :-1], [[0, 0], [1, 0]]))
        return _ragged_without(bpe.merge(bpe.first_pieces_only(symbols, max_length)), -1)

    def segment(texts):
        if not settings.language_code_prefix:
            return tf.ragged.map_flat_values(tf.gather, table, model_ids(texts))
        code, rest = _language_code_split(texts)
        code_ids = _code_ids(code, codes, tokenizer)
        pieces = tf.ragged.map_flat_values(tf.gather, table, model_ids(rest)).with_row_splits_dtype(tf.int64)
        # The code's id, where there is one, as a column of its own: a where on the pieces' lengths, no mask.
        with_code = tf.concat([tf.where(code != "", code_ids, -1)[:, None],
                               dense_rows(pieces, _longest(pieces), padding=-1)], axis=1)
        return _ragged_without(with_code, -1)

    # The kernel must segment as the checkpoint's tokenizer does (it does not when it runs a BPE model
    # itself: hence `bpe`). One thing it cannot do is name a character the model does not know: such a
    # piece is <unk> on device, where the SavedModel looks its text up in the checkpoint's vocabulary
    # (which may list it; docs/on-device.md).
    probes = tf.constant(PROBE_SENTENCES)
    if bpe is None:
        expected = text.SentencepieceTokenizer(tokenizer.model, out_type=tf.int32).tokenize(probes)
        same = fast.tokenize(probes).to_list() == expected.to_list()
    else:
        same = segment(probes).to_list() == tokenizer.tokenize(probes, add_start_end=False).to_list()
    if not same:
        raise ValueError("LiteRT's SentencePiece kernel segments text otherwise than this checkpoint's tokenizer: "
                         "export a SavedModel or a CTranslate2 model instead")
    return segment


def _longest(ragged):
    """The longest row's length (0 for no rows), int32."""
    return tf.reduce_max(tf.concat([tf.cast(ragged.row_lengths(), tf.int32), [0]], axis=0))


def _ragged_without(values, padding):
    """`(batch, width)` -> ragged rows of the values that are not `padding`, in order (gathers only)."""
    kept = values != padding
    return tf.RaggedTensor.from_row_lengths(tf.boolean_mask(values, kept),
                                            tf.reduce_sum(tf.cast(kept, tf.int64), axis=1))


def _language_code_split(texts):
    """`(codes, rests)`: a text that starts with ">>" and has "<<" after it splits after the first "<<" (else "", text).

    The regular expression `^>>.*?<<` of the checkpoint's tokenizer, from the
    text's bytes and tensorflow-text's split at byte offsets.
    """
    import tensorflow_text as text

    split = text.ByteSplitter().split(texts)
    lengths = tf.cast(split.row_lengths(), tf.int32)
    width = tf.reduce_max(tf.concat([lengths, [2]], axis=0))
    values = tf.cast(dense_rows(split, width + 1), tf.int32)  # a 0 after every text
    following = tf.pad(values[:, 1:], [[0, 0], [0, 1]])
    columns = tf.range(width + 1)[None, :]
    closes = (values == ord("<")) & (following == ord("<")) & (columns >= 2)
    starts_with_code = (values[:, 0] == ord(">")) & (values[:, 1] == ord(">")) & tf.reduce_any(closes, axis=1)
    code_end = tf.where(starts_with_code, tf.argmax(tf.cast(closes, tf.int32), axis=1, output_type=tf.int32) + 2, 0)
    return _substrings(texts, tf.zeros_like(code_end), code_end), _substrings(texts, code_end, lengths)


def _starts_with_space(texts):
    """`(batch,)` bool: whether each text's first byte is a space."""
    import tensorflow_text as text

    return tf.cast(dense_rows(text.ByteSplitter().split(texts), 1), tf.int32)[:, 0] == ord(" ")


def _substrings(texts, starts, ends):
    """Each text's bytes [start, end): tensorflow-text's split at byte offsets, one piece per text."""
    import tensorflow_text as text

    found = text.ByteSplitter().split_by_offsets(texts, starts[:, None], ends[:, None])
    return tf.reshape(found.flat_values if isinstance(found, tf.RaggedTensor) else found, [-1])


def _code_ids(code, codes, tokenizer):
    """Our id of each text's language code: the vocabulary's token equal to it, else <unk>."""
    if not codes:
        return tf.fill(tf.shape(code), tokenizer.unk_id)
    matches = tf.equal(code[:, None], tf.constant(codes)[None, :])
    ids = tf.gather(tf.constant([tokenizer.id_of(token) for token in codes], tf.int32),
                    tf.argmax(tf.cast(matches, tf.int32), axis=1, output_type=tf.int32))
    return tf.where(tf.reduce_any(matches, axis=1), ids, tokenizer.unk_id)


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
        tokens, scores = translator.search(source_ids, first_ids=first_ids, chunk_steps=CHUNK_STEPS)
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
        tokens, lengths = generator.sample(prompts, prompt_lengths, settings)
        # Padded to the model's length: the detokenizer's string join needs its width when traced.
        tokens = tf.reshape(tf.pad(tokens, [[0, 0], [0, max_length - tf.shape(tokens)[1]]]), [-1, max_length])
        outputs = generator.outputs(tokens, lengths, prompt_lengths)
        return {name: outputs[name] for name in ("text", "continuation", "new_tokens")}

    def settings(self):
        return {"kind": "language_model", **self.generator.defaults, "max_length": self.generator.model.max_length,
                "lowercase": self.source.lower_case, "max_bytes": self.source.max_bytes}


def check_request(out_dir, quantization):
    """A ValueError or FileExistsError for what `export_litert` would refuse: checked before any model is loaded."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS} (or none, for float32), got {quantization!r}")
    if os.path.exists(out_dir):
        raise FileExistsError(f"{out_dir} already exists: pick another directory or remove it first")


def convert(service, quantization=None):
    """The LiteRT file (bytes) of `service`'s signatures: builtin operators and tensorflow-text's only."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS} (or none, for float32), got {quantization!r}")
    with tempfile.TemporaryDirectory() as directory:
        # (Saving warns that tensorflow-text's inputs are renamed in the intermediate SavedModel: nothing to act on.)
        quiet, tensorflow_logger = logging.getLogger("tensorflow"), logging.getLogger("tensorflow").level
        quiet.setLevel(logging.ERROR)
        try:
            # Saving traces the functions again: for LiteRT too.
            with tracing_for_litert():
                tf.saved_model.save(service.root, directory, signatures=service.signatures())
        finally:
            quiet.setLevel(tensorflow_logger)
        converter = tf.lite.TFLiteConverter.from_saved_model(directory, signature_keys=service.signature_keys())
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        converter.allow_custom_ops = True  # tensorflow-text's kernels, checked by name below
        if quantization is not None:
            converter.optimizations = [tf.lite.Optimize.DEFAULT]  # without data: dynamic-range int8 weights
        if quantization == "float16":
            converter.target_spec.supported_types = [tf.float16]
        model = converter.convert()
    check_operators(model)
    model = top_k_sized_when_prepared(model)
    return int8_lookups(one_copy_of_each_table(model)) if quantization == "int8" else model


def top_k_sized_when_prepared(model):
    """The file (bytes) with no unknown size left in a `TOPK_V2` input's shape signature.

    The converter marks the batch axis unknown (-1) in the shape signature
    of every tensor it flows through. LiteRT's `TOPK_V2` reads that mark as
    "this input's size may change at any run" and sizes its outputs at every
    run, not once when its graph is prepared; and a loop (`WHILE`) whose
    body holds one tensor sized at run time copies its whole state in and
    out at every step, where otherwise it copies only what the step
    changed. Beam search keeps its batch within a chunk of steps
    (`inference.search.Chunks`): its top-k's sizes are known whenever its
    loop is prepared, and LiteRT prepares a loop's body again whenever the
    shapes it starts with change (and the operators after one whose output
    is sized at run time, once it has run), so the outputs are always sized
    from the input's actual shape. Nothing else reads the signature of a
    tensor inside a graph (a graph's own inputs, whose signatures say what a
    caller may resize, are left as they are).

    Each unknown size is overwritten in place with the size the converter
    wrote into the tensor's shape: the file is not rebuilt, so its weights
    keep the converter's alignment.
    """
    from ai_edge_litert import schema_py_generated as schema

    model = bytearray(model)  # the signatures' numbers are written in place
    root = schema.Model.GetRootAs(model, 0)
    top_k = {index for index in range(root.OperatorCodesLength())
             if max(root.OperatorCodes(index).BuiltinCode(), root.OperatorCodes(index).DeprecatedBuiltinCode())
             == schema.BuiltinOperator.TOPK_V2}
    for subgraph in (root.Subgraphs(index) for index in range(root.SubgraphsLength())):
        graph_inputs = set(subgraph.InputsAsNumpy().tolist()) if not subgraph.InputsIsNone() else set()
        for operator in (subgraph.Operators(index) for index in range(subgraph.OperatorsLength())):
            if operator.OpcodeIndex() not in top_k or operator.Inputs(0) in graph_inputs:
                continue
            tensor = subgraph.Tensors(operator.Inputs(0))
            if not tensor.ShapeSignatureIsNone():
                signature = tensor.ShapeSignatureAsNumpy()  # a view into `model`
                signature[signature == -1] = tensor.ShapeAsNumpy()[signature == -1]
    return bytes(model)


def one_copy_of_each_table(model):
    """The int8 file (bytes) with a tied embedding table stored once, row by row.

    With tied embeddings one table is both looked up (the embeddings) and
    multiplied by (the output projection), and dynamic-range quantization
    makes two int8 copies of it: one with a single scale for the whole
    table, which a `DEQUANTIZE` turns back into floats for the lookups, and
    one with a scale per row for the projection. Here each such `DEQUANTIZE`
    reads the per-row copy instead, where one holds the same weight (equal
    to within one step of the coarser copy's scale, everywhere) and the
    `DEQUANTIZE` is the only reader of its own, and the other copy goes: a
    quarter smaller file at OPUS-MT-base's size, and lookups quantized row by
    row, more finely than before. A table read by an int8 `GATHER` instead
    (looked up in the decoding loop alone: a target vocabulary of its own)
    keeps both copies: a gather's output carries the one scale of its
    input, so it cannot read the per-row copy. A file whose weights lie
    outside its flatbuffer (over 2 GB) is returned as it is.
    """
    import copy

    import flatbuffers
    import numpy as np
    from ai_edge_litert import schema_py_generated as schema

    flatbuffer = schema.ModelT.InitFromObj(schema.Model.GetRootAs(model, 0))
    buffers = flatbuffer.buffers
    if any(buffer.offset > 1 for buffer in buffers):
        return model

    def scales(tensor):
        quantization = tensor.quantization
        has_data = buffers[tensor.buffer].data is not None and len(buffers[tensor.buffer].data) > 0
        if tensor.type != schema.TensorType.INT8 or quantization is None or quantization.scale is None or not has_data:
            return None
        return np.asarray(quantization.scale, np.float32)

    def dequantized(tensor):
        values = np.frombuffer(bytes(buffers[tensor.buffer].data), np.int8).reshape(tensor.shape)
        return values * scales(tensor).reshape([-1] + [1] * (values.ndim - 1))  # one scale, or one a row

    per_row = [tensor for subgraph in flatbuffer.subgraphs for tensor in subgraph.tensors
               if scales(tensor) is not None and scales(tensor).size > 1 and tensor.quantization.quantizedDimension == 0]
    dequantize = [index for index, code in enumerate(flatbuffer.operatorCodes)
                  if max(code.builtinCode, code.deprecatedBuiltinCode) == schema.BuiltinOperator.DEQUANTIZE]
    for subgraph in flatbuffer.subgraphs:
        readers = collections.Counter(int(index) for operator in subgraph.operators for index in operator.inputs)
        readers.update(int(index) for index in (subgraph.outputs if subgraph.outputs is not None else []))
        for operator in subgraph.operators:
            table = subgraph.tensors[operator.inputs[0]]
            if (operator.opcodeIndex not in dequantize or readers[int(operator.inputs[0])] != 1
                    or scales(table) is None or scales(table).size != 1):
                continue
            for twin in (twin for twin in per_row if list(twin.shape) == list(table.shape)):
                if np.abs(dequantized(twin) - dequantized(table)).max() <= scales(table)[0] * (1 + 1e-4):
                    table.buffer, table.quantization = twin.buffer, copy.deepcopy(twin.quantization)
                    # A DEQUANTIZE of per-channel input is the operator's version 5 (LiteRT's op_version).
                    code = flatbuffer.operatorCodes[operator.opcodeIndex]
                    code.version = max(code.version, 5)
                    break
    # The buffers still in use: the tensors', and the converter's metadata (its runtime version, its options).
    pointed_at = {tensor.buffer for subgraph in flatbuffer.subgraphs for tensor in subgraph.tensors}
    pointed_at.update(entry.buffer for entry in flatbuffer.metadata or [])
    pointed_at.update(int(number) for number in (flatbuffer.metadataBuffer if flatbuffer.metadataBuffer is not None else []))
    for number, buffer in enumerate(buffers):
        if number not in pointed_at:
            buffer.data = None
    builder = flatbuffers.Builder(1024)
    builder.Finish(flatbuffer.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def int8_lookups(model):
    """The int8 file (bytes) with each table's lookups reading int8 rows, not the whole table turned into floats.

    A tied table's lookups read its per-row int8 copy through a `DEQUANTIZE`
    of the whole table (`one_copy_of_each_table`): LiteRT computes that once
    and keeps it, a float32 table as large as four int8 ones (112 MB at
    OPUS-MT-base's size), and the decoder's lookups, inside the search's
    loops, take it in as a loop operand: each `WHILE` copies it into its
    body and out again, and holds those copies too. Here each lookup
    gathers the int8 rows it needs and scales them by their rows' scales
    (`GATHER`, `DEQUANTIZE` with a scale of 1, `GATHER` of the scales,
    `MUL`: the same floats, `q * scale`, as the whole table's), the loops
    no longer carry the table, and its `DEQUANTIZE` goes. A table that
    anything but a plain lookup or a loop that passes it on reads is left
    as it is, as is a file whose weights lie outside its flatbuffer.
    """
    import copy

    import flatbuffers
    import numpy as np
    from ai_edge_litert import schema_py_generated as schema

    flatbuffer = schema.ModelT.InitFromObj(schema.Model.GetRootAs(model, 0))
    if any(buffer.offset > 1 for buffer in flatbuffer.buffers):
        return model
    builtin = schema.BuiltinOperator
    codes, subgraphs = flatbuffer.operatorCodes, flatbuffer.subgraphs

    def kind(operator):
        code = codes[operator.opcodeIndex]
        return max(code.builtinCode, code.deprecatedBuiltinCode)

    def opcode(operator_kind, version):
        """The index of a code of `operator_kind` at `version` or above (LiteRT's op_version), added if none is."""
        for index, code in enumerate(codes):
            if max(code.builtinCode, code.deprecatedBuiltinCode) == operator_kind and code.version >= version:
                return index
        code = schema.OperatorCodeT()
        code.builtinCode, code.deprecatedBuiltinCode, code.version = operator_kind, min(operator_kind, 127), version
        codes.append(code)
        return len(codes) - 1

    # How many operators run each subgraph: a loop body that two operators share is left alone.
    runs = collections.Counter(
        getattr(operator.builtinOptions, name) for subgraph in subgraphs for operator in subgraph.operators
        for name in ("condSubgraphIndex", "bodySubgraphIndex", "thenSubgraphIndex", "elseSubgraphIndex")
        if hasattr(operator.builtinOptions, name))

    def readers(subgraph, tensor):
        return [operator for operator in subgraph.operators if tensor in list(operator.inputs)]

    def only_looked_up(graph, tensor, lookups, loops, passed_on_as=None):
        """Whether `tensor` (a table in subgraph `graph`) is read only by lookups, and by loops that pass it on
        untouched to bodies where the same holds; gathers `(graph, GATHER)` into `lookups` and `(WHILE, operand)`
        into `loops`, outer loops first. `passed_on_as`: in a loop's body, the output that hands it on."""
        subgraph = subgraphs[graph]
        outputs = list(subgraph.outputs if subgraph.outputs is not None else [])
        if [number for number, output in enumerate(outputs) if output == tensor] not in ([], [passed_on_as]):
            return False
        for operator in readers(subgraph, tensor):
            inputs, options = list(operator.inputs), operator.builtinOptions
            if (kind(operator) == builtin.GATHER and inputs.index(tensor) == 0 and inputs.count(tensor) == 1
                    and options.axis == 0 and options.batchDims == 0):
                lookups.append((graph, operator))
                continue
            if kind(operator) != builtin.WHILE or inputs.count(tensor) != 1:
                return False
            operand = inputs.index(tensor)
            cond, body = subgraphs[options.condSubgraphIndex], subgraphs[options.bodySubgraphIndex]
            passed_on = body.inputs[operand]
            if (runs[options.condSubgraphIndex] != 1 or runs[options.bodySubgraphIndex] != 1
                    or body.outputs[operand] != passed_on or readers(cond, cond.inputs[operand])
                    or readers(subgraph, operator.outputs[operand]) or operator.outputs[operand] in outputs):
                return False
            loops.append((operator, operand))
            if not only_looked_up(options.bodySubgraphIndex, passed_on, lookups, loops, passed_on_as=operand):
                return False
        return True

    def add_tensor(subgraph, name, tensor_type, shape, signature=None, buffer=0, unit_scale=False):
        tensor = schema.TensorT()
        tensor.name, tensor.type, tensor.buffer = name, tensor_type, buffer
        tensor.shape = np.asarray(shape, np.int32)
        tensor.shapeSignature = None if signature is None else np.asarray(signature, np.int32)
        if unit_scale:  # int8 read as the integers they are: (q - 0) * 1
            tensor.quantization = schema.QuantizationParametersT()
            tensor.quantization.scale, tensor.quantization.zeroPoint = [1.0], [0]
        subgraph.tensors.append(tensor)
        return len(subgraph.tensors) - 1

    def add_operator(operator_kind, inputs, outputs, like=None, version=1):
        """A new operator: `like`'s options (and its code, unless it needs a higher `version`)."""
        operator = schema.OperatorT()
        if like is not None:
            version = max(version, codes[like.opcodeIndex].version)
        operator.opcodeIndex = opcode(operator_kind, version)
        operator.inputs, operator.outputs = list(inputs), list(outputs)
        if like is not None:
            operator.builtinOptionsType, operator.builtinOptions = like.builtinOptionsType, copy.deepcopy(
                like.builtinOptions)
        elif operator_kind == builtin.MUL:
            operator.builtinOptionsType, operator.builtinOptions = schema.BuiltinOptions.MulOptions, schema.MulOptionsT()
        return operator

    changed = False
    for graph, subgraph in enumerate(subgraphs):
        for dequantize in [operator for operator in subgraph.operators if kind(operator) == builtin.DEQUANTIZE]:
            table = subgraph.tensors[dequantize.inputs[0]]
            scales = table.quantization.scale if table.quantization is not None else None
            if (table.type != schema.TensorType.INT8 or len(table.shape) != 2 or scales is None
                    or len(scales) != table.shape[0] or table.quantization.quantizedDimension != 0
                    or any(table.quantization.zeroPoint)):
                continue
            lookups, loops = [], []
            if not only_looked_up(graph, dequantize.outputs[0], lookups, loops) or not lookups:
                continue
            scales_buffer = schema.BufferT()
            scales_buffer.data = np.frombuffer(np.asarray(scales, np.float32).tobytes(), np.uint8)
            flatbuffer.buffers.append(scales_buffer)
            for lookup_graph, lookup in lookups:
                owner = subgraphs[lookup_graph]
                ids, rows = lookup.inputs[1], owner.tensors[lookup.outputs[0]]
                name = rows.name.decode() if isinstance(rows.name, bytes) else rows.name
                shape, signature = list(rows.shape), rows.shapeSignature
                one_per_row = (shape[:-1] + [1], None if signature is None else list(signature)[:-1] + [1])
                int8_table = add_tensor(owner, name + "/int8_table", schema.TensorType.INT8, table.shape,
                                        buffer=table.buffer, unit_scale=True)
                scale_table = add_tensor(owner, name + "/row_scales", schema.TensorType.FLOAT32,
                                         [table.shape[0], 1], buffer=len(flatbuffer.buffers) - 1)
                int8_rows = add_tensor(owner, name + "/int8_rows", schema.TensorType.INT8, shape, signature,
                                       unit_scale=True)
                unscaled = add_tensor(owner, name + "/unscaled", schema.TensorType.FLOAT32, shape, signature)
                row_scales = add_tensor(owner, name + "/scales", schema.TensorType.FLOAT32, *one_per_row)
                position = owner.operators.index(lookup)
                owner.operators[position:position + 1] = [
                    # An int8 GATHER and an int8 DEQUANTIZE are their operators' version 2 (LiteRT's op_version).
                    add_operator(builtin.GATHER, [int8_table, ids], [int8_rows], like=lookup, version=2),
                    add_operator(builtin.DEQUANTIZE, [int8_rows], [unscaled], version=2),
                    add_operator(builtin.GATHER, [scale_table, ids], [row_scales], like=lookup),
                    add_operator(builtin.MUL, [unscaled, row_scales], lookup.outputs),
                ]
            # Inner loops first: an outer loop's operand numbers stay as they were until its turn.
            for loop, operand in reversed(loops):
                options = loop.builtinOptions
                body, cond = subgraphs[options.bodySubgraphIndex], subgraphs[options.condSubgraphIndex]
                for holder, field in ((loop, "inputs"), (loop, "outputs"), (body, "inputs"), (body, "outputs"),
                                      (cond, "inputs")):
                    setattr(holder, field, [value for number, value in enumerate(getattr(holder, field))
                                            if number != operand])
            subgraph.operators.remove(dequantize)
            changed = True
    if not changed:
        return model
    builder = flatbuffers.Builder(1024)
    builder.Finish(flatbuffer.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


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
    check_request(out_dir, quantization)
    model = convert(service, quantization)
    with directory_written_whole(out_dir) as partial:
        with open(os.path.join(partial, MODEL_FILE), "wb") as file:
            file.write(model)
        with tracing_for_litert():  # the functions as traced for the file
            signatures = service.signatures()
        write_json(os.path.join(partial, SETTINGS_FILE), {
            **service.settings(), "quantization": quantization or "float32", "operators": operators(model),
            "signature": {name: {"inputs": [spec.name for spec in function.structured_input_signature[0]],
                                 "outputs": sorted(function.structured_outputs)}
                          for name, function in signatures.items()},
        })
    return out_dir

