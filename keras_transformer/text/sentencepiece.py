"""A pretrained checkpoint's own SentencePiece tokenization, as TensorFlow ops.

A model trained elsewhere (OPUS-MT's Marian models, M2M100, NLLB) only
understands the ids its own tokenizer makes, so we cannot learn a vocabulary
for it: we run its SentencePiece model (`source.spm`, `sentencepiece.bpe.model`)
with tensorflow-text, and map the pieces to the checkpoint's ids exactly as
Hugging Face's tokenizers do:

    text -> [>>lang<< code split off] -> SentencePiece pieces (strings)
         -> the checkpoint's vocabulary (piece -> id; a piece it lacks is <unk>)
         -> [start] [prefix, e.g. a language code] pieces </s>

The mapping goes through the piece *strings*, not SentencePiece's own ids:
a Marian `vocab.json` numbers pieces in its own order, and may lack pieces
the SentencePiece model has.

Our models keep id 0 for padding (masked everywhere); a checkpoint's padding
id is something else (Marian's is its last id, M2M100's is 1). So every
checkpoint id moves up by one (`ID_OFFSET`) on the way in and down on the
way out, and id 0 is a padding token of our own that the checkpoint never
sees. What a user sees, text and token strings, is the checkpoint's.
"""

import dataclasses
import hashlib
import io
import json
import os

import tensorflow as tf
import tensorflow_text as text

from keras_transformer.saving import first_line, read_json, replace_whole, write_json
from keras_transformer.text.portable import join_columns, left_aligned

# checkpoint id + ID_OFFSET = our id; our id 0 is padding.
ID_OFFSET = 1
# The token string of our padding id (it is in no checkpoint's vocabulary).
OUR_PADDING = "<keras_transformer:padding>"
# A saved tokenizer's files: the SentencePiece model(s), the vocabulary, the settings (written last).
ENCODE_MODEL, DECODE_MODEL, VOCAB_FILE = "sentencepiece.model", "sentencepiece-decode.model", "vocab.json"
KIND = "sentencepiece"
# The models `learn` makes (SentencePiece's own names).
SENTENCEPIECE_MODEL_TYPES = ("unigram", "bpe")


def check_sentencepiece_settings(model_type, character_coverage):
    """A one-line ValueError for settings SentencePiece's trainer refuses (checked before a run starts)."""
    if model_type not in SENTENCEPIECE_MODEL_TYPES:
        raise ValueError(f"model_type must be one of {SENTENCEPIECE_MODEL_TYPES}, got {model_type!r}")
    if not 0.98 <= character_coverage <= 1.0:
        raise ValueError(f"character_coverage must be between 0.98 and 1.0 (SentencePiece's range), "
                         f"got {character_coverage}")


@dataclasses.dataclass(frozen=True)
class SentencePieceSettings:
    """How a SentencePiece tokenizer frames, splits and decodes text, besides its model and vocabulary.

    The switches are named by what they do; `pretrained/` sets them as a
    checkpoint's own tokenizer behaves. `tokenizer.json` records them.

    Args:
        unk_token, end_token: the checkpoint's unknown and end-of-sentence tokens.
        start_token: the decoder's first input (a target side's tokenizer),
            or None (a source side's: nothing goes before the text).
        pad_token: the checkpoint's padding token (never part of a text).
        prefix_tokens: tokens put before every text (a language code).
        language_code_prefix: a text that starts with ">>xx<<" has that
            code split off and looked up as one token (multilingual Marian).
        special_tokens: further tokens dropped from decoded text.
        strip_trailing_space: decoded text loses its trailing spaces too, as
            Python's `str.strip` after SentencePiece's decoding (Marian,
            M2M100); NLLB's decoder removes only the one space in front.
        word_by_word: split the text at every space and segment each word
            alone, an empty word (a space more) being the piece "▁": what a
            `tokenizers` pipeline (NLLB's Metaspace pre-tokenizer) does, where
            SentencePiece itself drops extra spaces.
        collapse_spaces: with `word_by_word`, runs of spaces become one first
            (NLLB's normalizer).
        languages: `{code: token}`, the languages a request may name, each
            by the code `--source-lang`/`--target-lang` take ("fr",
            "fra_Latn") and its token ("__fr__", "fra_Latn"): what
            `language_ids` reads (M2M100, NLLB; empty for others).
    """

    unk_token: str = "<unk>"
    end_token: str = "</s>"
    start_token: str = None
    pad_token: str = None
    prefix_tokens: tuple = ()
    language_code_prefix: bool = False
    special_tokens: tuple = ()
    strip_trailing_space: bool = True
    word_by_word: bool = False
    collapse_spaces: bool = False
    languages: dict = None

    def to_json(self):
        """The settings as `tokenizer.json` records them."""
        recorded = dataclasses.asdict(self)
        recorded.update(prefix_tokens=list(self.prefix_tokens), special_tokens=list(self.special_tokens))
        # Only where there are some: other tokenizers' tokenizer.json stays as it was.
        if not self.languages:
            del recorded["languages"]
        return recorded

    @classmethod
    def from_json(cls, recorded):
        recorded = {**recorded, "prefix_tokens": tuple(recorded.get("prefix_tokens", ())),
                    "special_tokens": tuple(recorded.get("special_tokens", ()))}
        return cls(**recorded)


class SentencePieceTokenizer(tf.Module):
    """Text <-> ids with a checkpoint's SentencePiece model and vocabulary, as TensorFlow ops.

    Args:
        model: the SentencePiece model's bytes (a `.spm` / `.model` file).
        vocab: the checkpoint's tokens in id order (`vocab[i]` is id i).
        settings: the `SentencePieceSettings` (special tokens, framing,
            splitting, decoding).
        decode_model: the SentencePiece model that turns pieces back into
            text (default: `model`; a shared Marian vocabulary decodes with
            the source side's model, as Hugging Face does).

    Example:
    >>> settings = SentencePieceSettings(unk_token="<unk>", end_token="</s>")
    >>> tokenizer = SentencePieceTokenizer(open("source.spm", "rb").read(), vocab, settings)
    >>> tokenizer.tokenize(["Hello world."])      # [[34292, 246, 5, 1]]: checkpoint ids + 1
    >>> tokenizer.detokenize([[34292, 246, 5, 1]])  # [b"Hello world."]
    """

    def __init__(self, model, vocab, settings=SentencePieceSettings(), decode_model=None, name=None):
        super().__init__(name=name)
        vocab = list(vocab)
        unk_token, end_token, start_token = settings.unk_token, settings.end_token, settings.start_token
        pad_token, prefix_tokens = settings.pad_token, settings.prefix_tokens
        for role, token in (("unk_token", unk_token), ("end_token", end_token), ("start_token", start_token),
                            ("pad_token", pad_token), *(("prefix token", token) for token in prefix_tokens),
                            *(("language token", token) for token in (settings.languages or {}).values())):
            if token is not None and token not in vocab:
                raise ValueError(f"the vocabulary has no {role} {token!r}")
        if len(set(vocab)) != len(vocab):
            raise ValueError("the vocabulary lists a token more than once")
        self.model = bytes(model)
        self.decode_model = self.model if decode_model is None else bytes(decode_model)
        self.checkpoint_vocab = vocab
        # Kept as JSON: a tf.Module would wrap a dict attribute (the languages) in a tracking proxy.
        self._settings_json = json.dumps(settings.to_json())
        self.vocab = [OUR_PADDING] + vocab  # our id order
        self.pad_id = 0
        self.unk_id = self.id_of(unk_token)
        self.end_id = self.id_of(end_token)
        self.start_id = self.id_of(start_token) if start_token is not None else None
        self.prefix_ids = [self.id_of(token) for token in prefix_tokens]
        # Tokens that never reach decoded text: Hugging Face's skip_special_tokens.
        self.dropped_ids = sorted(
            {0, self.unk_id, self.end_id}
            | {self.id_of(token) for token in (start_token, pad_token, *settings.special_tokens) if token in vocab}
        )
        self._encoder = _sentencepiece(self.model, tf.string)
        self._tokens = tf.constant(self.vocab)
        self._decoder = _sentencepiece(self.decode_model, tf.int32)
        self._ends = _Ends(_surfaces(self.vocab, self._decoder), self.dropped_ids,
                           strip_all=settings.strip_trailing_space)
        self._ids = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(tf.constant(self.vocab[1:]), tf.range(1, len(self.vocab))),
            default_value=self.unk_id,
        )

    @property
    def settings(self):
        """The `SentencePieceSettings` (what `tokenizer.json` records)."""
        return SentencePieceSettings.from_json(json.loads(self._settings_json))

    def id_of(self, token):
        """Our id of a checkpoint token (its checkpoint id + `ID_OFFSET`)."""
        return self.vocab.index(token, 1)

    @property
    def languages(self):
        """`{code: token}` of the languages a request may name (empty: none)."""
        return self.settings.languages or {}

    def language_lookup(self, codes):
        """`(ids, known)` for `(batch,)` language codes: our ids of their tokens, and whether each is a code of ours.

        An unknown code's id is the first language's: `language_ids` refuses
        it; a LiteRT file, which has no op to refuse with, answers its row
        with nothing (`export.litert`).
        """
        if not self.languages:
            raise ValueError("this tokenizer names no languages (only a multilingual checkpoint's do)")
        codes = tf.convert_to_tensor(codes, tf.string)
        known = tf.constant(list(self.languages), tf.string)
        token_ids = tf.constant([self.id_of(token) for token in self.languages.values()], tf.int32)
        matches = tf.equal(codes[:, None], known[None, :])
        return (tf.gather(token_ids, tf.argmax(tf.cast(matches, tf.int32), axis=1, output_type=tf.int32)),
                tf.reduce_any(matches, axis=1))

    def language_ids(self, codes, name="language"):
        """`(batch,)` language codes -> `(batch,)` int32, our ids of their tokens.

        An unknown code fails the graph with an `InvalidArgument` error that
        names `name` (the request's input) and the codes it got.
        """
        codes = tf.convert_to_tensor(codes, tf.string)
        ids, known = self.language_lookup(codes)
        unknown = tf.boolean_mask(codes, ~known)
        examples = ", ".join(list(self.languages)[:4])
        check = tf.debugging.Assert(
            tf.equal(tf.size(unknown), 0),
            [f"{name} must be a language code of this model ({len(self.languages)} codes: {examples}, ...); got", unknown],
            summarize=4,
        )
        with tf.control_dependencies([check]):
            return tf.identity(ids)

    @property
    def vocab_size(self):
        return len(self.vocab)

    @property
    def frame_length(self):
        """How many ids `tokenize` puts around a text's pieces: an empty text has this many."""
        return (self.start_id is not None) + len(self.prefix_ids) + 1

    def fingerprint(self):
        """A digest of what decides the ids: the models, the vocabulary and the framing."""
        digest = hashlib.sha256(self.model)
        digest.update(self.decode_model)
        # The languages a request may name decide no text's ids (a prefix token does).
        framing = {key: value for key, value in self.settings.to_json().items() if key != "languages"}
        digest.update(json.dumps([list(self.checkpoint_vocab), framing], sort_keys=True).encode("utf-8"))
        return digest.hexdigest()

    # -- a vocabulary of a run's own ---------------------------------------------------

    @classmethod
    def learn(cls, texts, vocab_size=8000, model_type="unigram", character_coverage=1.0, lower_case=False,
              start_token="<s>"):
        """A new SentencePiece vocabulary learned from `texts` (`train --tokenizer sentencepiece`).

        What the translation toolkits learn (Marian, OpenNMT, fairseq, Hugging
        Face's models): the `sentencepiece` package's unigram or BPE model on
        NFKC-normalized text (case-folded with `lower_case`), "▁" for a space,
        `<unk>`, `<s>` (the decoder's start) and `</s>`. The same texts give
        the same model. `vocab_size` is a ceiling: a small corpus gets the
        pieces it has. `character_coverage`: the share of the text's
        characters the model must know (1.0 for a small alphabet, 0.9995 for
        Chinese or Japanese, as SentencePiece advises); the rarest others
        are `<unk>`. `start_token`: what a text starts with, `<s>` for a
        target side (the decoder's first input), None for a source side
        (pieces then `</s>`, as Marian's tokenizer frames a source).

        Example:
        >>> tokenizer = SentencePieceTokenizer.learn(sentences, vocab_size=4000, model_type="bpe")
        """
        import sentencepiece

        check_sentencepiece_settings(model_type, character_coverage)
        texts = [text for text in texts if text.strip()]
        if not texts:
            raise ValueError("a SentencePiece vocabulary needs some text to learn from")
        model = io.BytesIO()
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size, model_type=model_type,
                character_coverage=character_coverage,
                normalization_rule_name="nmt_nfkc_cf" if lower_case else "nmt_nfkc",
                unk_id=0, bos_id=1, eos_id=2, pad_id=-1, hard_vocab_limit=False,
                num_threads=1, minloglevel=2,  # one thread: the same pieces on every machine
            )
        except RuntimeError as error:  # SentencePiece's own check, e.g. a vocabulary smaller than the alphabet
            raise ValueError(f"SentencePiece cannot learn this vocabulary: {first_line(error)}") from None
        processor = sentencepiece.SentencePieceProcessor(model_proto=model.getvalue())
        vocab = [processor.id_to_piece(index) for index in range(processor.get_piece_size())]
        return cls(model.getvalue(), vocab, SentencePieceSettings(start_token=start_token))

    def with_start_token(self, start_token):
        """A tokenizer of the same model and vocabulary whose texts start with `start_token` (None: with nothing)."""
        decode_model = None if self.decode_model == self.model else self.decode_model
        return type(self)(self.model, self.checkpoint_vocab, dataclasses.replace(self.settings, start_token=start_token),
                          decode_model=decode_model)

    # -- saving, loading ---------------------------------------------------------------

    def save(self, directory):
        """The model(s), `vocab.json` and then `tokenizer.json`, each whole or not at all."""
        from keras_transformer.text.tokenizer import TOKENIZER_SETTINGS

        os.makedirs(directory, exist_ok=True)
        models = {ENCODE_MODEL: self.model}
        if self.decode_model != self.model:
            models[DECODE_MODEL] = self.decode_model
        for file_name, content in models.items():
            replace_whole(os.path.join(directory, file_name), lambda path, content=content: _write_bytes(path, content))
        write_json(os.path.join(directory, VOCAB_FILE), list(self.checkpoint_vocab))
        write_json(os.path.join(directory, TOKENIZER_SETTINGS), {"kind": KIND, **self.settings.to_json()})

    @classmethod
    def load(cls, directory, settings):
        """The tokenizer `save` wrote in `directory`; `settings` is its `tokenizer.json`."""
        settings = {key: value for key, value in settings.items() if key != "kind"}
        with open(os.path.join(directory, ENCODE_MODEL), "rb") as file:
            model = file.read()
        decode_path = os.path.join(directory, DECODE_MODEL)
        decode_model = None
        if os.path.exists(decode_path):
            with open(decode_path, "rb") as file:
                decode_model = file.read()
        vocab = read_json(os.path.join(directory, VOCAB_FILE))
        return cls(model, vocab, SentencePieceSettings.from_json(settings), decode_model=decode_model)

    # -- text -> ids -> text -----------------------------------------------------------

    def tokenize(self, strings, add_start_end=True, language_ids=None):
        """`(batch,)` strings -> ragged `(batch, None)` int32 ids: [start] [prefix] [code] pieces [end].

        Without `add_start_end`, only the code (if any) and the pieces.
        `language_ids`: `(batch,)` each text's language token (`language_ids`),
        in place of the one prefix token.
        """
        if language_ids is not None and not add_start_end:
            raise ValueError("language_ids take the place of the prefix, which only add_start_end puts there")
        strings = tf.convert_to_tensor(strings, tf.string)
        # SentencePiece needs valid UTF-8: a bad byte becomes U+FFFD, as Python's decoding would.
        strings = tf.strings.unicode_transcode(strings, "UTF-8", "UTF-8", errors="replace")
        rows = tf.shape(strings, out_type=tf.int64)[0]
        columns = []
        if self.settings.language_code_prefix:
            # ">>fra<< Bonjour": the code is a token of its own, the rest goes to SentencePiece.
            has_code = tf.strings.regex_full_match(strings, r"(?s)>>.*?<<.*")
            codes = tf.strings.regex_replace(strings, r"(?s)^(>>.*?<<).*$", r"\1")
            strings = tf.where(has_code, tf.strings.regex_replace(strings, r"(?s)^>>.*?<<", ""), strings)
            code_ids = tf.RaggedTensor.from_row_lengths(
                tf.boolean_mask(self._ids.lookup(codes), has_code), tf.cast(has_code, tf.int64)
            )
            columns.append(code_ids)
        pieces = self._word_by_word(strings) if self.settings.word_by_word else self._encoder.tokenize(strings)
        columns.append(tf.ragged.map_flat_values(self._ids.lookup, pieces))
        if add_start_end:
            leading = [_fixed_columns(rows, [self.start_id])] if self.start_id is not None else []
            if language_ids is not None:
                if len(self.prefix_ids) != 1:
                    raise ValueError("only a tokenizer with one prefix token (a language's) takes language_ids")
                leading.append(tf.RaggedTensor.from_tensor(tf.reshape(tf.cast(language_ids, tf.int32), [-1, 1])))
            elif self.prefix_ids:
                leading.append(_fixed_columns(rows, self.prefix_ids))
            columns[:0] = leading
            columns.append(_fixed_columns(rows, [self.end_id]))
        ids = tf.concat(columns, axis=1) if len(columns) > 1 else columns[0]
        return tf.cast(ids, tf.int32)

    def _word_by_word(self, strings):
        """Pieces of each space-separated word, a lone "▁" for each extra space (see `word_by_word`)."""
        if self.settings.collapse_spaces:
            strings = tf.strings.regex_replace(strings, " {2,}", " ")
        words = tf.strings.split(strings, sep=" ")
        # The text's leading space is the "▁" every first word has: an empty first word (which is
        # also all an empty text splits into) is no word.
        first = tf.ragged.range(words.row_lengths()) == 0
        keep = ~(first & (words == ""))
        words = tf.ragged.boolean_mask(words, keep)
        word_pieces = self._encoder.tokenize(words)  # (batch, words, pieces)
        per_word = word_pieces.values
        empty = per_word.row_lengths() == 0
        spaces = tf.RaggedTensor.from_row_lengths(
            tf.fill([tf.reduce_sum(tf.cast(empty, tf.int32))], "\u2581"), tf.cast(empty, tf.int64)
        )
        return word_pieces.with_values(tf.concat([per_word, spaces], axis=1)).merge_dims(1, 2)

    def detokenize(self, ids):
        """Ids (dense or ragged, `(batch, length)`) -> `(batch,)` text, special tokens dropped.

        SentencePiece's decoding of pieces (joined, "▁" a space), then Hugging
        Face's strip of the ends: written as table lookups on the tokens and
        one string join (`text.portable`), which a LiteRT file runs too.
        """
        if isinstance(ids, tf.RaggedTensor):
            ids = ids.to_tensor()
        ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
        width = ids.shape[1]  # known when tracing for LiteRT (`join_columns`)
        # An id outside the vocabulary (a model of another size) reads as <unk>, and is dropped.
        ids = tf.where((ids >= 0) & (ids < self.vocab_size), ids, self.unk_id)
        ids, _ = left_aligned((ids, tf.ones_like(ids, tf.bool)), tf.gather(self._ends.dropped, ids))
        return self._ends.join(ids, width)

    def id_to_token(self, ids):
        """Ids -> the checkpoint's token strings (same shape), for labelling attention maps."""
        if isinstance(ids, tf.RaggedTensor):
            return tf.ragged.map_flat_values(tf.gather, self._tokens, ids)
        return tf.gather(self._tokens, ids)


class _NamedModelResource(tf.saved_model.experimental.TrackableResource):
    """A SentencePiece model loaded under a name of its own, so that it lives as long as the process.

    tensorflow-text loads the model into a resource private to the op's
    kernel, and TensorFlow drops eager kernels whenever it clears its caches
    (`tf.random.set_seed` does, and so `keras.utils.set_random_seed`): the
    model goes, and the tokenizer fails ("Resource ... does not exist"). A
    resource with a shared name belongs to the process instead; tokenizers
    of the same model share it. An export re-creates it when loaded.
    """

    def __init__(self, model):
        super().__init__()
        self._model = model
        self._shared_name = "keras_transformer_sentencepiece_" + hashlib.sha256(model).hexdigest()[:16]
        _ = self.resource_handle  # created now

    def _create_resource(self):
        from tensorflow_text.python.ops.sentencepiece_tokenizer import gen_sentencepiece_tokenizer

        return gen_sentencepiece_tokenizer.sentencepiece_op(model=self._model, shared_name=self._shared_name)


def _sentencepiece(model, out_type):
    try:
        tokenizer = text.SentencepieceTokenizer(model, out_type=out_type)
        tokenizer._model_resource = _NamedModelResource(model)  # see _NamedModelResource
    except tf.errors.OpError:
        raise ValueError(f"not a SentencePiece model ({len(model)} bytes that do not parse as one)") from None
    return tokenizer


def _surfaces(vocab, model):
    """What each token adds to decoded text, as SentencePiece's decoding of pieces writes it.

    A piece is its own text ("▁" for a space), even one the SentencePiece
    model lacks (`DecodePieces` keeps an unknown piece's surface); the model's
    own unknown piece reads " ⁇ ", and its control pieces (<s>, </s>) nothing.
    """
    unknown_piece = model.id_to_string(0).numpy().decode("utf-8")
    spm_ids = model.string_to_id(tf.constant(vocab)).numpy()
    alone = model.detokenize(tf.RaggedTensor.from_tensor(spm_ids[:, None])).numpy()
    surfaces = []
    for token, spm_id, decoded in zip(vocab, spm_ids, alone):
        if token == unknown_piece:
            surfaces.append(" \u2047 ")
        elif spm_id != 0 and not decoded and token.strip("\u2581"):  # a control piece decodes to nothing
            surfaces.append("")
        else:
            surfaces.append(token)
    return surfaces


class _Ends:
    """How kept ids become text: each token's surface, its text's ends trimmed as Hugging Face trims them.

    With `strip_all` (Marian, M2M100: Python's `str.strip`) the whitespace at
    both ends goes: tokens of nothing but whitespace before the first other
    one and after the last are dropped, and those two lose their outer
    whitespace. Without (NLLB) only the text's one leading space goes, from
    the first token that writes anything. Each token's four spellings
    (as it is, as first, as last, as both) are one table.
    """

    _WHITESPACE = " \t\n\r\v\f"

    def __init__(self, surfaces, dropped_ids, strip_all):
        surfaces = [surface.replace("\u2581", " ") for surface in surfaces]
        self.size = len(surfaces)
        self.dropped = tf.constant([index in set(dropped_ids) for index in range(self.size)])
        if strip_all:
            self.nothing = tf.constant([not surface.strip(self._WHITESPACE) for surface in surfaces])
            first = [surface.lstrip(self._WHITESPACE) for surface in surfaces]
            last = [surface.rstrip(self._WHITESPACE) for surface in surfaces]
            both = [surface.strip(self._WHITESPACE) for surface in surfaces]
        else:
            self.nothing = tf.constant([not surface for surface in surfaces])
            first = [surface.removeprefix(" ") for surface in surfaces]
            last, both = surfaces, first
        self.strip_all = strip_all
        self.spellings = tf.constant(surfaces + first + last + both + [""])

    def join(self, ids, width):
        """`(batch, length)` left-aligned kept ids (-1 after them) -> `(batch,)` strings."""
        real = ids >= 0
        ids = tf.maximum(ids, 0)
        writes = real & ~tf.gather(self.nothing, ids)
        before = tf.cumsum(tf.cast(writes, tf.int32), axis=1, exclusive=True)  # writing tokens before each
        after = tf.cumsum(tf.cast(writes, tf.int32), axis=1, exclusive=True, reverse=True)
        is_first, is_last = writes & (before == 0), writes & (after == 0)
        shown = real & ((before > 0) & (after > 0) | writes) if self.strip_all else real
        variant = tf.cast(is_first, tf.int32) + 2 * tf.cast(is_last, tf.int32)
        index = tf.where(shown, ids + self.size * variant, 4 * self.size)  # 4 * size: ""
        if width is not None:
            index = tf.reshape(index, [-1, width])
        return join_columns(tf.gather(self.spellings, index))


def _fixed_columns(rows, ids):
    """`(rows, len(ids))` ragged int32: the same ids in every row."""
    return tf.RaggedTensor.from_tensor(tf.tile(tf.constant([ids], tf.int32), tf.stack([rows, 1])))


def _write_bytes(path, content):
    with open(path, "wb") as file:
        file.write(content)

