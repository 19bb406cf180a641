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

import os

import tensorflow as tf
import tensorflow_text as text
from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset

from keras_transformer.saving import DamagedFileError, read_json, replace_whole, write_json

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

# Vocabulary learning searches for a count threshold that yields the asked-for
# size. The library's defaults search up to 10^7 and need 10 occurrences;
# these bounds make it several times faster and let rarer pieces in.
DEFAULT_LEARN_PARAMS = {"lower_thresh": 2, "upper_thresh": 2000, "num_iterations": 3}

# Detokenized text has a space around every punctuation mark ("Ein Mann ( mit
# Hut ) , oder ?"); these rules glue the marks back the way text is written.
_SPACING_RULES = (
    (r" ([.,!?;:%)\]}])", r"\1"),  # no space before closing punctuation
    (r"([(\[{]) ", r"\1"),  # nor after opening brackets
    (r"([\pL\pN]) ([-'’/]) ([\pL\pN])", r"\1\2\3"),  # T - shirt, dog ' s
    (r"([\pL\pN]) ' (s|t|re|ve|ll|d|m)\b", r"\1'\2"),
)


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

    @property
    def vocab_size(self):
        return len(self.vocab)

    # -- learning, saving, loading -----------------------------------------

    @classmethod
    def learn(cls, texts, vocab_size=8000, lower_case=False, reserved_tokens=RESERVED_TOKENS, learn_params=None):
        """Learn a vocabulary of at most `vocab_size` tokens from `texts` (strings)."""
        if vocab_size <= len(reserved_tokens):
            raise ValueError(f"vocab_size must exceed the {len(reserved_tokens)} reserved tokens, got {vocab_size}")
        texts = list(texts)
        if not texts:
            raise ValueError("cannot learn a vocabulary from no text")
        dataset = tf.data.Dataset.from_tensor_slices(tf.constant(texts, tf.string))
        dataset = dataset.batch(1024).map(lambda batch: normalize(batch, lower_case))
        params = {**DEFAULT_LEARN_PARAMS, **(learn_params or {})}
        vocab = None
        for _ in range(8):
            previous = vocab
            vocab = bert_vocab_from_dataset.bert_vocab_from_dataset(
                dataset,
                vocab_size=vocab_size,
                reserved_tokens=list(reserved_tokens),
                bert_tokenizer_params={"lower_case": False},  # normalize() did the casing
                learn_params=params,
            )
            # The library's threshold search can end just above the target
            # size; demanding one more occurrence per piece brings it under.
            if len(vocab) <= vocab_size or (previous is not None and len(vocab) >= len(previous)):
                break
            params = {**params, "lower_thresh": params["lower_thresh"] + 1}
        if len(vocab) > vocab_size:
            raise ValueError(
                f"could not learn a vocabulary of at most {vocab_size} tokens: the smallest found has "
                f"{len(vocab)} (every character of the text needs a token); ask for a larger vocab_size"
            )
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

    def _content_ids(self, ids):
        """Drop padding and the start/end markers: what remains is text."""
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(tf.convert_to_tensor(ids))
        ids = tf.cast(ids, tf.int32)
        # An id outside the vocabulary (a model of another size) reads as [UNK].
        ids = tf.where((ids >= 0) & (ids < self.vocab_size), ids, self.unk_id)
        keep = (ids != self.pad_id) & (ids != self.start_id) & (ids != self.end_id)
        return tf.ragged.boolean_mask(ids, keep)

    def detokenize(self, ids):
        """Ids (dense or ragged, `(batch, length)`) -> `(batch,)` readable strings."""
        strings = self._wordpiece.detokenize(self._content_ids(ids))
        for pattern, replacement in _SPACING_RULES:
            strings = tf.strings.regex_replace(strings, pattern, replacement)
        return strings

    def id_to_token(self, ids):
        """Ids -> their token strings (same shape), for labelling attention maps."""
        if isinstance(ids, tf.RaggedTensor):
            return tf.ragged.map_flat_values(tf.gather, self._tokens, ids)
        return tf.gather(self._tokens, ids)
