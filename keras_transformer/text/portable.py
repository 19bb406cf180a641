"""Text ops that TensorFlow and LiteRT both run: what a tokenizer needs beside its own kernel.

A LiteRT file runs LiteRT's builtin ops and the few tensorflow-text kernels
registered with it (`tensorflow_text.tflite_registrar`: the fast WordPiece
and SentencePiece tokenizers, splitting a string into bytes, joining
strings). TensorFlow's string ops (`reduce_join`, `regex_replace`, `lower`,
Unicode transcoding) and its ragged-to-dense kernel are not among them. The
few things our tokenizers do with strings are written here from what both
runtimes have:

- `dense_rows`: a ragged tensor's rows as a padded matrix, from gathers;
- `join_columns`: each row of a string matrix as one string (tensorflow-text's
  n-gram join, with the n-gram as wide as the matrix);
- `left_aligned`: a row's kept tokens moved to its front (top-k, not a sort);
- `lowercase_utf8`: Unicode lowercasing from bytes and a table, the same
  mapping as `tf.strings.lower(..., encoding="utf-8")`.
"""

import numpy as np
import tensorflow as tf
import tensorflow_text as text
from tensorflow_text.python.ops.ngrams_op import gen_ngrams_op


def dense_rows(ragged, width, padding=0):
    """`(rows, width)`: each row of a ragged `(rows, None)` tensor, cut or padded with `padding` to `width`."""
    values = ragged.flat_values
    starts = tf.cast(ragged.row_starts(), tf.int32)
    lengths = tf.cast(ragged.row_lengths(), tf.int32)
    # One padding value after the last: every column past a row's end gathers it.
    values = tf.concat([values, tf.cast(tf.reshape(padding, [1]), values.dtype)], axis=0)
    columns = tf.range(width)[None, :]
    padding_index = tf.shape(values)[0] - 1
    return tf.gather(values, tf.where(columns < lengths[:, None], starts[:, None] + columns, padding_index))


def join_columns(strings):
    """`(rows,)`: each row of a `(rows, columns)` string matrix joined, in order, with nothing between.

    With the number of columns known when tracing, tensorflow-text's n-gram
    join (one n-gram as wide as the row), which LiteRT runs; else TensorFlow's
    `reduce_join`. The two give the same strings.
    """
    width = strings.shape[1]
    if width is None:
        return tf.strings.reduce_join(strings, axis=1)
    if width == 0:
        return tf.fill(tf.shape(strings)[:1], "")
    # As a ragged tensor of rows that are all `width` long: the op's dense form crashes
    # TensorFlow's kernel on a hundred rows or more.
    row_splits = tf.range(tf.shape(strings)[0] + 1, dtype=tf.int64) * width
    joined, _ = gen_ngrams_op.tf_text_ngrams_string_join(
        input_values=tf.reshape(strings, [-1]), input_row_splits=[row_splits], width=width, axis=-1,
        string_separator="",
    )
    return joined


def left_aligned(values, dropped):
    """`(ids, flags)` with the `dropped` positions taken out, the rest moved left in order; ids -1, flags False after.

    A sort by (dropped, position), as `top_k` of a key that falls with both:
    LiteRT has no sort or boolean mask among its builtins, but has top-k.
    """
    ids, flags = values
    length = tf.shape(ids)[1]
    positions = tf.range(length)[None, :]
    key = tf.where(dropped, -1 - positions, length - positions)  # kept first, each group in order
    _, order = tf.math.top_k(key, k=length)
    kept = tf.gather(~dropped, order, batch_dims=1)
    return (tf.where(kept, tf.gather(ids, order, batch_dims=1), -1),
            kept & tf.gather(flags, order, batch_dims=1))


# -- lowercasing ---------------------------------------------------------------------
#
# Lowercasing a UTF-8 string without a string op: split it into bytes, decode
# each character's code point with arithmetic, look its lowercase form up in a
# table, and join the bytes again. Every byte position gets four output slots
# (the longest character), each slot the index of a one-byte string, or of ""
# (`_NOTHING`): a character that starts at a position writes its lowercase
# bytes there, the positions inside it write nothing, and anything that is not
# a valid character passes through byte by byte, as it came.

_NOTHING = 256
_ONE_BYTE_STRINGS = [bytes([value]) for value in range(256)] + [b""]
_SLOTS = 4


def lowercase_table():
    """`(code points, 4)` int32: each code point's lowercase form as UTF-8 byte slots, `_NOTHING`-padded.

    Built by asking `tf.strings.lower` itself about every code point that has a
    lowercase form, so the mapping is the one our tokenizers' `normalize`
    uses. The table ends after the last code point that changes.
    """
    code_points = np.array([point for point in range(0x20000) if not 0xD800 <= point < 0xE000])
    characters = tf.constant([chr(point).encode("utf-8") for point in code_points])
    lowered = tf.strings.lower(characters, encoding="utf-8").numpy()
    changed = [(point, low) for point, char, low in zip(code_points, characters.numpy(), lowered) if low != char]
    table = np.full([changed[-1][0] + 1, _SLOTS], _NOTHING, np.int32)
    for point in range(len(table)):
        if not 0xD800 <= point < 0xE000:
            encoded = chr(point).encode("utf-8")
            table[point, : len(encoded)] = list(encoded)
    for point, low in changed:
        if len(low) <= _SLOTS:  # (none is longer; one that were would stay as it is)
            table[point] = list(low) + [_NOTHING] * (_SLOTS - len(low))
    return table


def lowercase_utf8(texts, table, max_bytes):
    """`(batch,)` strings lowercased with `table` (`lowercase_table`), each cut to its first `max_bytes` bytes."""
    split = text.ByteSplitter().split(texts)
    values = tf.cast(dense_rows(split, max_bytes), tf.int32)
    lengths = tf.minimum(tf.cast(split.row_lengths(), tf.int32), max_bytes)
    following = [tf.pad(values[:, shift:], [[0, 0], [0, shift]]) for shift in (1, 2, 3)]

    def continues(byte):  # 10xxxxxx
        return (byte >= 0x80) & (byte < 0xC0)

    # The length a lead byte announces, and the code point of a well-formed character starting here.
    length = tf.where(values < 0x80, 1, tf.where(values < 0xC0, 0, tf.where(values < 0xE0, 2,
                                                                              tf.where(values < 0xF0, 3, tf.where(values < 0xF8, 4, 0)))))
    lead_bits = tf.where(length == 2, values - 0xC0, tf.where(length == 3, values - 0xE0, values - 0xF0))
    point = tf.where(length == 1, values, lead_bits)
    well_formed = length >= 1
    for extra, byte in enumerate(following, start=2):
        within = length >= extra
        well_formed &= ~within | continues(byte)
        point = tf.where(within, point * 64 + (byte - 0x80), point)
    # Nor overlong (C0 AF for "/"), a surrogate, or past U+10FFFF: those pass through byte by byte too.
    shortest = tf.gather(tf.constant([0, 0, 0x80, 0x800, 0x10000]), length)
    well_formed &= (point >= shortest) & ~((point >= 0xD800) & (point < 0xE000)) & (point <= 0x10FFFF)
    columns = tf.range(max_bytes)[None, :]
    starts = well_formed & (columns + length <= lengths[:, None])

    table = tf.constant(table, tf.int16)  # half the size in the file; its values fit (0..256)
    in_table = starts & (point < tf.shape(table)[0])
    lowered = tf.cast(tf.gather(table, tf.where(in_table, point, 0)), tf.int32)  # (batch, max_bytes, 4)
    as_it_came = tf.concat([values[..., None], tf.fill(tf.concat([tf.shape(values), [_SLOTS - 1]], 0), _NOTHING)],
                           axis=-1)
    # A position inside a character (of the table's) that started 1, 2 or 3 bytes before writes nothing.
    inside = tf.zeros_like(starts)
    for back in (1, 2, 3):
        started_before = tf.pad(in_table & (length > back), [[0, 0], [back, 0]])[:, :max_bytes]
        inside |= started_before
    # Unicode's one contextual lowercase rule, as TensorFlow applies it: a capital sigma that ends a word
    # (after a letter, before none) is "ς", not "σ". A letter here: an ASCII one or any non-ASCII byte.
    def letter(byte):
        return ((byte >= 0x41) & (byte <= 0x5A)) | ((byte >= 0x61) & (byte <= 0x7A)) | (byte >= 0x80)

    before = tf.pad(values[:, :-1], [[0, 0], [1, 0]])
    final_sigma = in_table & (point == 0x3A3) & letter(before) & ~letter(following[1])
    lowered = tf.where(final_sigma[..., None], tf.constant([0xCF, 0x82, _NOTHING, _NOTHING]), lowered)
    slots = tf.where(in_table[..., None], lowered, as_it_came)
    slots = tf.where((inside | (columns >= lengths[:, None]))[..., None], _NOTHING, slots)
    strings = tf.gather(tf.constant(_ONE_BYTE_STRINGS), tf.reshape(slots, [-1, max_bytes * _SLOTS]))  # a known width
    return join_columns(strings)
