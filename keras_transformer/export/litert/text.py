"""A run's tokenizer in LiteRT's ops: the text a LiteRT file reads, framed as the model was trained to read it.

WordPiece runs on tensorflow-text's `FastWordpieceTokenizer` kernel (its
lowercasing from a table, `text.portable`); a checkpoint's SentencePiece
model on `FastSentencepieceTokenizer`, with a BPE model's merges in the graph
(`text.bpe_merges`). Both are checked against the run's own tokenizer before
anything is exported.
"""

import tensorflow as tf

from keras_transformer.text import SentencePieceTokenizer, WordPieceTokenizer
from keras_transformer.text.bpe_merges import BPEMerges, is_bpe
from keras_transformer.text.portable import dense_rows, left_aligned, lowercase_table, lowercase_utf8

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
        self.framing = Framing(tokenizer, max_length)
        self.max_bytes = BYTES_PER_POSITION * max_length
        self.lower_case = isinstance(tokenizer, WordPieceTokenizer) and tokenizer.lower_case
        self.lowercase = lowercase_table() if self.lower_case else None
        if isinstance(tokenizer, WordPieceTokenizer):
            self._segment = tokenizer.wordpiece.tokenize
        else:
            self._segment = _sentencepiece_segmenter(tokenizer, max_length)

    def pieces(self, texts):
        """Ragged `(batch, None)` ids of the texts' pieces, unframed (a BPE model's: the first `max_length`)."""
        if self.lowercase is not None:
            texts = lowercase_utf8(texts, self.lowercase, self.max_bytes)
        return self._segment(texts)

    @property
    def leading(self):
        return self.framing.leading

    def framed(self, texts, language_ids=None):
        """`(batch, width)` int32: the leading ids, pieces and [END], cut to `max_length` keeping [END], 0 after.

        `language_ids`: `(batch,)` each text's language token, in place of
        the one prefix token (M2M100's, NLLB's source language).
        """
        return self.framed_and_truncated(texts, language_ids)[0]

    def framed_and_truncated(self, texts, language_ids=None):
        """`(framed(texts), truncated)`: `truncated` `(batch,)` bool, the texts that did not fit `max_length`."""
        pieces = self.pieces(texts)
        return self.framing.framed_and_truncated(lambda width: dense_rows(pieces, width),
                                                 tf.cast(pieces.row_lengths(), tf.int32), language_ids)


class Framing:
    """How a text's pieces become the model's input: the leading ids, the pieces, [END], cut keeping [END].

    The text file frames what its tokenizer kernel segments; a builtin
    file frames the pieces the host's tokenizer gives it
    (`keras_transformer.device_tokenizers`), as the run's `tokenize` does.

    Args:
        tokenizer: the run's `text.WordPieceTokenizer` or `text.SentencePieceTokenizer`.
        max_length: ids per text at most.
    """

    def __init__(self, tokenizer, max_length):
        self.tokenizer, self.max_length = tokenizer, max_length
        if isinstance(tokenizer, WordPieceTokenizer):
            self.leading = [tokenizer.start_id]
        elif isinstance(tokenizer, SentencePieceTokenizer):
            self.leading = ([] if tokenizer.start_id is None else [tokenizer.start_id]) + tokenizer.prefix_ids
        else:
            raise ValueError(f"the LiteRT export has no kernel for a {type(tokenizer).__name__}")

    def framed_and_truncated(self, columns_of, counts, language_ids=None):
        """`(framed, truncated)` of texts of `counts` pieces; `columns_of(width)`: their first `width`, 0 after.

        `framed`: `(batch, <= max_length)` int32, 0 after each text;
        `truncated`: `(batch,)` bool, the texts that did not fit.
        `language_ids`: `(batch,)` each text's language token, in place of
        the one prefix token (M2M100's, NLLB's source language).
        """
        leading = len(self.leading)
        full_lengths = counts + leading + 1
        lengths = tf.minimum(full_lengths, self.max_length)
        width = tf.reduce_max(tf.concat([lengths, [0]], axis=0))
        inside = tf.pad(columns_of(width), [[0, 0], [leading, 0]])[:, :width]  # column j: piece j - leading
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
    table = _our_ids(tokenizer)
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

    _check_segmentation(tokenizer, fast if bpe is None else None, segment)
    return segment


def _our_ids(tokenizer):
    """`(model's vocabulary,)` int32: each of the SentencePiece model's ids as ours, through the piece it names.

    A control piece (<s>, </s>), which segmentation never yields but the
    fast kernel gives for characters it does not know, is <unk>.
    """
    import tensorflow_text as text

    slow = text.SentencepieceTokenizer(tokenizer.model)
    spm_ids = tf.range(slow.vocab_size())
    pieces = [piece.decode("utf-8") for piece in slow.id_to_string(spm_ids).numpy()]
    alone = slow.detokenize(tf.reshape(spm_ids, [-1, 1])).numpy()
    known = {piece: index for index, piece in enumerate(tokenizer.vocab) if index > 0}
    ours = [tokenizer.unk_id if (not decoded and piece.strip("\u2581") and spm_id > 0) else
            known.get(piece, tokenizer.unk_id) for spm_id, (piece, decoded) in enumerate(zip(pieces, alone))]
    return tf.constant(ours, tf.int32)


def _check_segmentation(tokenizer, fast, segment):
    """A ValueError unless `PROBE_SENTENCES` come out as the checkpoint's tokenizer segments them.

    The kernel (`fast`, a unigram model's; None for a BPE model, merged in
    the graph by `segment`) must segment as the checkpoint's tokenizer does.
    One thing it cannot do is name a character the model does not know:
    such a piece is <unk> on device, where the SavedModel looks its text up
    in the checkpoint's vocabulary (which may list it; docs/on-device.md).
    """
    import tensorflow_text as text

    probes = tf.constant(PROBE_SENTENCES)
    if fast is not None:
        expected = text.SentencepieceTokenizer(tokenizer.model, out_type=tf.int32).tokenize(probes)
        same = fast.tokenize(probes).to_list() == expected.to_list()
    else:
        same = segment(probes).to_list() == tokenizer.tokenize(probes, add_start_end=False).to_list()
    if not same:
        raise ValueError("LiteRT's SentencePiece kernel segments text otherwise than this checkpoint's tokenizer: "
                         "export a SavedModel or a CTranslate2 model instead")


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
