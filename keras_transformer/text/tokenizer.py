"""Sub-word tokenization with tensorflow-text's WordPiece (paper Section 5.1).

The paper encodes sentences "using byte-pair encoding ... a shared source-target
vocabulary of about 37000 tokens"; WordPiece is the same idea (frequent words
stay whole, rare words split into pieces such as `Fahr ##rad`) and
tensorflow-text runs it as TensorFlow ops. That matters: the same tokenizer
object tokenizes inside the `tf.data` pipeline, detokenizes decoder output,
and goes into an exported SavedModel with no Python left.

Ids 0..3 are reserved: `[PAD]` (padding, masked everywhere), `[UNK]`,
`[START]` (the decoder's first input) and `[END]` (where a translation stops).
A classifier's vocabulary adds `[CLS]`: the token put in front of every text,
whose final state sums the text up (BERT's convention).
"""

import collections
import hashlib
import os
import re
import unicodedata

import numpy as np
import tensorflow as tf
import tensorflow_text as text
from tensorflow_text.python.ops import bert_tokenizer
from tensorflow_text.tools.wordpiece_vocab import wordpiece_tokenizer_learner_lib as learner

from keras_transformer.saving import DamagedFileError, read_json, replace_whole, write_json
from keras_transformer.text.portable import join_columns, left_aligned

PAD, UNK, START, END = "[PAD]", "[UNK]", "[START]", "[END]"
RESERVED_TOKENS = (PAD, UNK, START, END)
CLS = "[CLS]"
# A saved tokenizer: a folder with these two files.
VOCAB_FILE, TOKENIZER_SETTINGS = "vocab.txt", "tokenizer.json"
CLASSIFIER_TOKENS = RESERVED_TOKENS + (CLS,)
# Masked-language-model pre-training adds [MASK], the stand-in for a hidden
# token; a classifier started from a pre-trained encoder keeps that vocabulary.
MASK = "[MASK]"
PRETRAINING_TOKENS = CLASSIFIER_TOKENS + (MASK,)

# Vocabulary learning keeps whole words and pieces seen at least this often
# (the library's default, 10, drops too much of a small corpus).
MIN_COUNT = 2
# The learner's threshold is the count of the word ranked at this multiple of
# the asked-for size: it then learns somewhat more tokens than asked, and the
# least used are dropped (`_vocabulary_from_word_counts`). At 0.75, IMDB's
# reviews gave 28,247 tokens for 32,000 asked; at 1.0, 32,000.
_THRESHOLD_RANK = 1.0
# Word counts go through tensorflow-text's learner with its defaults but these.
_LEARNER_SETTINGS = dict(
    num_iterations=3, max_input_tokens=int(5e6), max_token_length=50, max_unique_chars=1000, joiner="##"
)

# Detokenized text would have a space around every punctuation mark ("Ein
# Mann ( mit Hut ) , oder ?"); `detokenize` leaves the space out where text is
# written without one: before a closing mark, after an opening one, and around
# a hyphen, apostrophe or slash between two letters or digits ("T-shirt",
# "dog's", "and/or").
_CLOSING, _OPENING, _JOINING = ".,!?;:%)]}", "([{", "-'’/"


def normalize(strings, lower_case=False):
    """Repair invalid UTF-8, apply Unicode NFC, optionally lowercase (keeping umlauts)."""
    strings = tf.strings.unicode_transcode(
        strings, input_encoding="UTF-8", output_encoding="UTF-8", errors="replace"
    )
    strings = text.normalize_utf8(strings, "NFC")
    if lower_case:
        strings = tf.strings.lower(strings, encoding="utf-8")
    return strings


class WordPieceTokenizer(tf.Module):
    """Text <-> ids with a WordPiece vocabulary, as TensorFlow ops.

    Args:
        vocab: list of tokens; must start with the reserved tokens.
        lower_case: lowercase text before tokenizing.
        reserved_tokens: the special tokens that start the vocabulary.

    Example:
    >>> tokenizer = WordPieceTokenizer.learn(["Ein Mann fährt Fahrrad."], vocab_size=100)
    >>> ids = tokenizer.tokenize(["Ein Mann fährt."])   # [[2, ..., 3]] ragged
    >>> tokenizer.detokenize(ids)                        # [b"Ein Mann f\\xc3\\xa4hrt."]
    """

    def __init__(self, vocab, lower_case=False, reserved_tokens=RESERVED_TOKENS, name=None):
        super().__init__(name=name)
        vocab = list(vocab)
        reserved_tokens = list(reserved_tokens)
        if vocab[: len(reserved_tokens)] != reserved_tokens:
            raise ValueError(
                f"the vocabulary must start with the reserved tokens {reserved_tokens}; "
                f"it starts with {vocab[: len(reserved_tokens)]}"
            )
        if len(set(vocab)) != len(vocab):
            raise ValueError("the vocabulary lists a token more than once")
        self.vocab = vocab
        self.lower_case = lower_case
        self.reserved_tokens = reserved_tokens
        self.pad_id = vocab.index(PAD)
        self.unk_id = vocab.index(UNK)
        self.start_id = vocab.index(START)
        self.end_id = vocab.index(END)
        self._wordpiece = text.FastWordpieceTokenizer(
            vocab,
            suffix_indicator="##",
            unknown_token=UNK,
            no_pretokenization=False,  # split on whitespace and punctuation first
            support_detokenization=True,
            token_out_type=tf.int32,
        )
        self._tokens = tf.constant(vocab)
        # The ids decoded text leaves out: the framing and the padding.
        self.dropped_ids = (self.pad_id, self.start_id, self.end_id)
        self._spelling = _Spelling(vocab, self.dropped_ids)

    @property
    def vocab_size(self):
        return len(self.vocab)

    @property
    def wordpiece(self):
        """The `text.FastWordpieceTokenizer` that splits normalised text into pieces (unframed, ragged ids)."""
        return self._wordpiece

    # `tokenize` frames every text with [START] and [END].
    frame_length = 2

    @property
    def languages(self):
        """None to name: a vocabulary of our own is one language pair's (see `SentencePieceTokenizer.languages`)."""
        return {}

    def fingerprint(self):
        """A digest of what decides the ids: the vocabulary and the casing (for data tokenized with it)."""
        content = "\n".join(self.vocab) + f"\nlower_case={self.lower_case}"
        return hashlib.sha256(content.encode("utf-8")).hexdigest()

    # -- learning, saving, loading -----------------------------------------

    @classmethod
    def learn(cls, texts, vocab_size=8000, lower_case=False, reserved_tokens=RESERVED_TOKENS, min_count=MIN_COUNT):
        """Learn a vocabulary of at most `vocab_size` tokens from `texts`: strings, or a `tf.data.Dataset` of them.

        Words are counted once (a dataset is streamed, never held in memory),
        then `_vocabulary_from_word_counts` runs the WordPiece learner once.
        """
        if vocab_size <= len(reserved_tokens):
            raise ValueError(f"vocab_size must exceed the {len(reserved_tokens)} reserved tokens, got {vocab_size}")
        if not isinstance(texts, tf.data.Dataset):
            texts = list(texts)
            if not texts:
                raise ValueError("cannot learn a vocabulary from no text")
            texts = tf.data.Dataset.from_tensor_slices(tf.constant(texts, tf.string))
        split_words = bert_tokenizer.BasicTokenizer(lower_case=False)  # normalize() does the casing
        words = texts.batch(1024).map(
            lambda batch: split_words.tokenize(normalize(batch, lower_case)).flat_values,
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        word_counts = collections.Counter()
        for batch in words.as_numpy_iterator():
            word_counts.update(batch)
        if not word_counts:
            raise ValueError("cannot learn a vocabulary from no text")
        word_counts = {word.decode("utf-8"): count for word, count in word_counts.items()}
        vocab = _vocabulary_from_word_counts(word_counts, vocab_size, list(reserved_tokens), min_count)
        return cls(vocab, lower_case=lower_case, reserved_tokens=reserved_tokens)

    def save(self, directory):
        """Write `vocab.txt` (one token a line), then `tokenizer.json` (the settings), each whole or not at all.

        So a directory with `tokenizer.json` holds a complete tokenizer, even
        to a reader (another worker) looking while it is being written.
        """
        os.makedirs(directory, exist_ok=True)

        def write_vocab(path):
            with open(path, "w", encoding="utf-8") as file:
                file.write("\n".join(self.vocab) + "\n")

        replace_whole(os.path.join(directory, VOCAB_FILE), write_vocab)
        write_json(
            os.path.join(directory, TOKENIZER_SETTINGS),
            {"lower_case": self.lower_case, "reserved_tokens": self.reserved_tokens},
        )

    @classmethod
    def load(cls, directory):
        vocab_path = os.path.join(directory, VOCAB_FILE)
        if not os.path.exists(vocab_path):
            raise FileNotFoundError(f"no vocabulary at {vocab_path}")
        try:
            with open(vocab_path, encoding="utf-8") as file:
                vocab = file.read().splitlines()
        except UnicodeDecodeError as error:
            raise DamagedFileError(f"{vocab_path} is not UTF-8 text ({error.reason} at byte {error.start})") from None
        settings = read_json(os.path.join(directory, TOKENIZER_SETTINGS))
        return cls(vocab, **settings)

    # -- text -> ids -> text ------------------------------------------------

    def tokenize(self, strings, add_start_end=True):
        """`(batch,)` strings -> ragged `(batch, None)` int32 ids, framed by [START] ... [END]."""
        strings = tf.convert_to_tensor(strings, tf.string)
        ids = self._wordpiece.tokenize(normalize(strings, self.lower_case))
        if not add_start_end:
            return ids
        batch = ids.nrows()
        starts = tf.fill([batch, 1], self.start_id)
        ends = tf.fill([batch, 1], self.end_id)
        return tf.concat([starts, ids, ends], axis=1)

    def tokenize_with_cls(self, strings, max_length):
        """`(batch,)` strings -> dense `(batch, <= max_length)` int32 ids: [CLS], then the pieces, cut to fit.

        For a classifier, whose vocabulary has `CLASSIFIER_TOKENS`; the
        padding is `[PAD]` (id 0), which the encoder masks.
        """
        pieces = self.tokenize(strings, add_start_end=False)[:, : max_length - 1]
        cls_column = tf.fill([pieces.nrows(), 1], self.vocab.index(CLS))
        # Padded before the [CLS] column joins: an empty batch keeps its one column.
        return tf.concat([cls_column, pieces.to_tensor()], axis=1)

    def detokenize(self, ids, first=None):
        """Ids (dense or ragged, `(batch, length)`) -> `(batch,)` readable strings.

        `first`: `(batch,)` int32, each row's first position to write (the
        tokens before it still decide the spacing; no space leads): what a
        continuation adds to its prompt.

        Padding, [START] and [END] are dropped; a piece (`##rad`) joins the
        token before it; words are separated by a space except where text is
        written without one (`_CLOSING`, `_OPENING`, `_JOINING`). Built from
        gathers and one string join, so that a LiteRT file runs the same
        code (`export.litert`).
        """
        if isinstance(ids, tf.RaggedTensor):
            ids = ids.to_tensor()
        ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
        # An id outside the vocabulary (a model of another size) reads as [UNK].
        ids = tf.where((ids >= 0) & (ids < self.vocab_size), ids, self.unk_id)
        return self._spelling.spell(ids, first)

    def id_to_token(self, ids):
        """Ids -> their token strings (same shape), for labelling attention maps."""
        if isinstance(ids, tf.RaggedTensor):
            return tf.ragged.map_flat_values(tf.gather, self._tokens, ids)
        return tf.gather(self._tokens, ids)

    def hugging_face_json(self):
        """This tokenizer as a Hugging Face `tokenizer.json` (a dict), which the `tokenizers` library runs.

        The same ids and text: NFC (and lowercasing), CJK characters split
        off as tensorflow-text's pre-tokenization splits them, a split at
        spaces and punctuation (BERT's), the WordPiece model with its `##`
        and tensorflow-text's 100-byte words (the same for ASCII words), and
        `detokenize`'s spacing as decoders working on the joined text. The
        framing is the caller's: the ids `dropped_ids` names are left out
        before decoding. `export.litert.device_text` checks it on held-out text.
        """
        letter_or_digit = r"[\p{L}\p{N}]"
        joins = [{"type": "Replace", "content": mark,
                  "pattern": {"Regex": f"(?<={letter_or_digit}) {re.escape(mark)} (?={letter_or_digit})"}}
                 for mark in _JOINING]
        return {
            "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "post_processor": None,
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "NFC"},
                {"type": "BertNormalizer", "clean_text": False, "handle_chinese_chars": True, "strip_accents": False,
                 "lowercase": False},
                *([{"type": "Lowercase"}] if self.lower_case else []),
            ]},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "model": {"type": "WordPiece", "unk_token": UNK, "continuing_subword_prefix": "##",
                      "max_input_chars_per_word": 100, "vocab": {token: index for index, token in enumerate(self.vocab)}},
            "decoder": {"type": "Sequence", "decoders": [
                {"type": "WordPiece", "prefix": "##", "cleanup": False},  # a space before each word, none before a piece
                {"type": "Fuse"},  # one text: the spacing rules below read across tokens
                *joins,
                {"type": "Replace", "pattern": {"Regex": f" (?=[{re.escape(_CLOSING)}])"}, "content": ""},
                {"type": "Replace", "pattern": {"Regex": f"(?<=[{re.escape(_OPENING)}]) "}, "content": ""},
            ]},
        }


def _vocabulary_from_word_counts(word_counts, vocab_size, reserved_tokens, min_count=MIN_COUNT):
    """A WordPiece vocabulary of at most `vocab_size` tokens from `{word: count}`, in one learner pass.

    tensorflow-text's `learn` searches for the count threshold that yields
    the asked-for size by running the whole learner again for each guess
    (several minutes for a large sample). Here the learner runs once, at a
    threshold that yields a few more tokens than asked: the count of the word
    ranked `_THRESHOLD_RANK * vocab_size` (at least `min_count`). Then every word is tokenized with
    that vocabulary, each token's uses are counted (times the word's count),
    and the least used tokens go until the vocabulary fits. Single characters
    always stay, so every word of the text still has a spelling. On Multi30k's
    German side (8000 tokens) this takes 5 s where the search took 63, and the
    text needs 0.5% fewer tokens; IMDB's 22,500 training reviews (5.2 million
    words) give 32,000 tokens in 19 s.
    """
    ranked_counts = sorted(word_counts.values(), reverse=True)
    threshold = max(min_count, ranked_counts[min(len(ranked_counts) - 1, int(vocab_size * _THRESHOLD_RANK))])
    params = learner.Params(
        upper_thresh=None, lower_thresh=None, vocab_size=vocab_size, slack_ratio=0.0, include_joiner_token=True,
        reserved_tokens=reserved_tokens, **_LEARNER_SETTINGS,
    )
    counted = learner.get_input_words(list(word_counts.items()), reserved_tokens, params.max_token_length)
    alphabet = learner.get_allowed_chars(counted, params.max_unique_chars)
    counted = learner.filter_input_words(counted, alphabet, params.max_input_tokens)
    vocab = learner.learn_with_thresh(counted, threshold, params)
    if len(vocab) <= vocab_size:
        return vocab

    def is_character(token):
        return len(token.removeprefix(params.joiner)) == 1

    keep = {index for index, token in enumerate(vocab) if index < len(reserved_tokens) or is_character(token)}
    if len(keep) > vocab_size:
        raise ValueError(
            f"could not learn a vocabulary of at most {vocab_size} tokens: the text has {len(keep)} "
            "characters and reserved tokens, each of which needs one; ask for a larger vocab_size"
        )
    words = list(word_counts)
    pieces = text.FastWordpieceTokenizer(vocab, suffix_indicator=params.joiner, unknown_token=UNK,
                                         no_pretokenization=True, token_out_type=tf.int32).tokenize(words)
    uses = np.zeros(len(vocab), np.int64)
    word_of_piece = pieces.value_rowids().numpy()
    np.add.at(uses, pieces.flat_values.numpy(), np.array([word_counts[word] for word in words])[word_of_piece])
    for index in np.argsort(-uses, kind="stable"):
        if len(keep) == vocab_size:
            break
        keep.add(int(index))
    return [vocab[index] for index in sorted(keep)]


class _Spelling:
    """How a row of WordPiece ids is written as text: what `WordPieceTokenizer.detokenize` runs.

    Each token's spelling (a piece without its `##`, a reserved token as
    nothing) and the classes of its first and last characters are tables,
    looked up by id; whether a space goes before a token depends on it and
    its neighbours only.
    """

    def __init__(self, vocab, silent_ids):
        spelled = ["" if index in silent_ids else token.removeprefix("##") for index, token in enumerate(vocab)]
        self.vocab_size = len(vocab)
        self.spellings = tf.constant(spelled + ["", " "])
        self.silent = tf.constant([index in silent_ids for index in range(len(vocab))])
        self.nothing = silent_ids[0]
        self.is_piece = tf.constant([token.startswith("##") and len(token) > 2 for token in vocab])
        self.joining = tf.constant([len(token) == 1 and token in _JOINING for token in spelled])
        self.opens_last = tf.constant([token[-1:] != "" and token[-1:] in _OPENING for token in spelled])
        self.closes_first = tf.constant([token[:1] != "" and token[:1] in _CLOSING for token in spelled])
        self.alnum_first = tf.constant([_letter_or_digit(token[:1]) for token in spelled])
        self.alnum_last = tf.constant([_letter_or_digit(token[-1:]) for token in spelled])

    def spell(self, ids, first=None):
        """`(batch, length)` int32 ids in the vocabulary -> `(batch,)` strings, from position `first` on."""
        width = ids.shape[1]  # known when tracing for LiteRT (`join_columns`)
        positions = tf.broadcast_to(tf.range(tf.shape(ids)[1])[None, :], tf.shape(ids))
        shown = positions >= (0 if first is None else tf.cast(first, tf.int32)[:, None])
        ids, shown = left_aligned((ids, shown), tf.gather(self.silent, ids))
        real = ids >= 0
        shown &= real
        ids = tf.where(real, ids, self.nothing)
        shifted_right = lambda values: tf.pad(values[:, :-1], [[0, 0], [1, 0]])  # noqa: E731  (the token before)
        shifted_left = lambda values: tf.pad(values[:, 1:], [[0, 0], [0, 1]])  # noqa: E731  (the token after)
        table = lambda flags: tf.gather(flags, ids) & real  # noqa: E731
        word_start = real & ~table(self.is_piece)
        # A hyphen, apostrophe or slash standing as a word between a letter or digit and another: no spaces.
        joins = (table(self.joining) & word_start & shifted_left(word_start) & shifted_left(table(self.alnum_first))
                 & shifted_right(table(self.alnum_last)))
        at_start = tf.range(tf.shape(ids)[1])[None, :] == 0
        space_before = (word_start & ~at_start & ~table(self.closes_first) & ~shifted_right(table(self.opens_last))
                        & ~joins & ~shifted_right(joins) & shifted_right(shown))
        # Each token as two strings, a space or nothing, then its spelling: indices into one table, where
        # `len(vocab) + 1` is " " and `len(vocab)` is "" (LiteRT stacks integers, not strings).
        space_ids = self.vocab_size + tf.cast(space_before & shown, tf.int32)
        spelled_ids = tf.where(shown, ids, self.vocab_size)  # a token not shown: ""
        pairs = tf.reshape(tf.stack([space_ids, spelled_ids], axis=2), [tf.shape(ids)[0], -1])
        if width is not None:
            pairs = tf.reshape(pairs, [-1, 2 * width])
        pairs = tf.gather(self.spellings, pairs)
        return join_columns(pairs)


def _letter_or_digit(character):
    return bool(character) and unicodedata.category(character)[0] in "LN"
