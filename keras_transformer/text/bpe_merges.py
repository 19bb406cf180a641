"""SentencePiece's BPE segmentation from ops LiteRT runs: M2M100's and NLLB's tokenizers on device.

A BPE model (SentencePiece's `model_type: BPE`: M2M100's and NLLB's
`sentencepiece.bpe.model`) segments a text by merging. The normalized text
("▁" for each space and in front) starts as its characters; then, again and
again, of all adjacent pairs whose concatenation is a piece, the pair whose
piece scores highest (on a tie, the leftmost) becomes that piece, until no
pair is a piece.

LiteRT's SentencePiece kernel (tensorflow-text's `FastSentencepieceTokenizer`)
runs a unigram model's search instead: the split whose pieces' scores add up
highest, which for a BPE model's scores is another segmentation. So on
device a BPE model runs in two parts:

1. `character_model`: the kernel, on a copy of the model whose longer
   pieces are scored out of reach. It still does everything SentencePiece
   does before merging (normalization, the "▁"s), and returns the text's
   characters as the BPE model's own ids; a character the model lacks is
   its unknown piece.
2. `merge`: the merges, one per text per turn of a loop (LiteRT's `WHILE`).
   Every pair of pieces that concatenates to a piece is in one table sorted
   by `left * vocabulary + right`; each turn looks every adjacent pair up at
   once, by binary search (gathers and comparisons).

With `word_by_word` (NLLB's pipeline splits the text at spaces before BPE,
`text.sentencepiece`), a piece that starts with "▁" starts a word, and
never merges with the piece before it.

Example:
>>> merges = BPEMerges(open("sentencepiece.bpe.model", "rb").read())
>>> characters = text.FastSentencepieceTokenizer(merges.character_model).tokenize(["Hello"])
>>> merges.merge(characters.to_tensor(-1))  # [[ids of "▁H", "ello"], ...], -1 after each text's pieces
"""

import math

import numpy as np
import tensorflow as tf

# SentencePiece's enums (sentencepiece_model.proto).
NORMAL = 1
UNIGRAM, BPE = 1, 2
WORD_START = "\u2581"
# A longer piece's score in the character model: no split of a text would choose it.
_OUT_OF_REACH = -1e9


def _model_proto(model):
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    return proto


def is_bpe(model):
    """Whether a SentencePiece model (bytes) segments by BPE merges."""
    return _model_proto(model).trainer_spec.model_type == BPE


class BPEMerges:
    """A SentencePiece BPE model as a character model for LiteRT's kernel and a merge loop (module docstring).

    Args:
        model: the SentencePiece BPE model's bytes.
        word_by_word: merges stop at every piece that starts with "▁".
    """

    def __init__(self, model, word_by_word=False):
        proto = _model_proto(model)
        if proto.trainer_spec.model_type != BPE:
            raise ValueError("not a BPE model")
        pieces = [(piece.piece, piece.score) for piece in proto.pieces if piece.type == NORMAL]
        ids = {piece.piece: index for index, piece in enumerate(proto.pieces) if piece.type == NORMAL}
        self.vocabulary_size = len(proto.pieces)
        self.word_by_word = word_by_word
        # Every (left, right) -> (piece, score) whose halves are both pieces: the only merges BPE makes.
        merges = sorted(
            (ids[left] * self.vocabulary_size + ids[right], ids[piece], score)
            for piece, score in pieces
            for left, right in ((piece[:cut], piece[cut:]) for cut in range(1, len(piece)))
            if left in ids and right in ids
        )
        self.pair_keys = np.array([key for key, _, _ in merges] or [-1], np.int64)
        self.merged_ids = np.array([merged for _, merged, _ in merges] or [0], np.int32)
        self.scores = np.array([score for _, _, score in merges] or [0.0], np.float32)
        self.starts_word = np.array([piece.piece.startswith(WORD_START) for piece in proto.pieces])
        self.word_start_id = ids.get(WORD_START, -1)
        self.longest_piece = max([len(piece) for piece, _ in pieces] or [1])  # in characters
        # SentencePiece's BPE (split_by_whitespace) keeps "▁" at a piece's start: words never merge.
        self.pieces_within_words = not any(WORD_START in piece[1:] for piece, _ in pieces)
        for piece in proto.pieces:
            if piece.type == NORMAL:
                piece.score = 0.0 if len(piece.piece) == 1 else _OUT_OF_REACH
        proto.trainer_spec.model_type = UNIGRAM
        if word_by_word:
            # Each space is a "▁" of its own: the split at spaces comes from the merges' word starts.
            proto.normalizer_spec.remove_extra_whitespaces = False
        self.character_model = proto.SerializeToString()

    def _pair_lookup(self, left, right):
        """For each `(left, right)` pair of ids: `(found, merged id, score)`, by binary search in the sorted keys."""
        keys = tf.constant(self.pair_keys)
        last = len(self.pair_keys) - 1
        wanted = tf.cast(left, tf.int64) * self.vocabulary_size + tf.cast(right, tf.int64)
        low, high = tf.zeros_like(left), tf.fill(tf.shape(left), last + 1)
        for _ in range(math.ceil(math.log2(last + 2))):
            middle = (low + high) // 2
            below = tf.gather(keys, tf.minimum(middle, last)) < wanted
            low, high = tf.where(below, middle + 1, low), tf.where(below, high, middle)
        index = tf.minimum(low, last)
        found = (tf.gather(keys, index) == wanted) & (left >= 0) & (right >= 0)
        if self.word_by_word:
            found &= ~tf.gather(tf.constant(self.starts_word), tf.maximum(right, 0))
        return found, tf.gather(tf.constant(self.merged_ids), index), tf.gather(tf.constant(self.scores), index)

    def first_pieces_only(self, symbols, count):
        """`symbols` cut to the characters that make the first `count` pieces: a turn's cost grows with the width.

        A piece never spans two words, so the first `count` words hold the
        first `count` pieces: the characters after them go. A word longer
        than `count` of the longest pieces is cut there too (a text of one
        such word would otherwise merge for as many turns as it has
        characters); its first `count` pieces are then the same unless a
        merge across the cut would have changed them.
        """
        if not self.pieces_within_words:
            return symbols
        starts = tf.gather(tf.constant(self.starts_word), tf.maximum(symbols, 0)) & (symbols >= 0)
        words_so_far = tf.cumsum(tf.cast(starts, tf.int32), axis=1)  # a word's first character counts it
        kept = tf.where(words_so_far <= count, symbols, -1)  # a prefix of each row
        width = tf.reduce_max(tf.concat([tf.reduce_sum(tf.cast(kept >= 0, tf.int32), axis=1), [0]], axis=0))
        return kept[:, :tf.minimum(width, count * self.longest_piece)]

    def merge(self, symbols):
        """`(rows, width)` int32 ids, -1 after each row's -> each row's BPE pieces, left-aligned, -1 after.

        Each turn merges, in every row that still can, its best pair: the
        highest score, the leftmost of equals (`argmax` returns the first).
        """
        # Two columns of -1 more: every row has a pair to look at, even an empty batch's.
        symbols = tf.pad(tf.cast(symbols, tf.int32), [[0, 0], [0, 2]], constant_values=-1)
        columns = tf.range(tf.shape(symbols)[1])[None, :]

        def merge_best_pairs(symbols, _):
            found, merged, scores = self._pair_lookup(symbols[:, :-1], symbols[:, 1:])
            best = tf.argmax(tf.where(found, scores, -np.inf), axis=1, output_type=tf.int32)[:, None]
            can_merge = tf.reduce_any(found, axis=1)
            merged_at_best = tf.gather(merged, best, batch_dims=1)
            # Left of the pair as it was, the pair as its piece, right of it one column to the left.
            following = tf.pad(symbols[:, 1:], [[0, 0], [0, 1]], constant_values=-1)
            merged_row = tf.where(columns < best, symbols, tf.where(columns == best, merged_at_best, following))
            return tf.where(can_merge[:, None], merged_row, symbols), tf.reduce_any(can_merge)

        symbols, _ = tf.while_loop(lambda symbols, more: more, merge_best_pairs, (symbols, tf.constant(True)))
        return symbols[:, :-2]
