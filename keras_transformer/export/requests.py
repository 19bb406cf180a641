"""What an export accepts: each signature's inputs, checked in the graph before anything reads them.

A loaded SavedModel does not enforce the shapes its signatures declare, and
TensorFlow Serving checks none either, so a scalar string or a matrix of
them would otherwise reach tensorflow-text's tokenizer, which crashes the
whole process on them. The signatures therefore declare their inputs with
no shape at all (nothing downstream may assume one), check the rank and
shape first, and answer anything else with an `InvalidArgument` error that
names the input and the shape it must have.
"""

import tensorflow as tf

# No declared shape: a declared one would let TensorFlow's graph optimiser
# take it as a fact and fold the run-time checks below away.
TEXT = tf.TensorSpec(None, tf.string, name="text")
SOURCE_IDS = tf.TensorSpec(None, tf.int32, name="source_ids")
TARGET_IDS = tf.TensorSpec(None, tf.int32, name="target_ids")
SOURCE_LANGUAGE = tf.TensorSpec(None, tf.string, name="source_language")
TARGET_LANGUAGE = tf.TensorSpec(None, tf.string, name="target_language")


def checked_sentences(text):
    """`text` as a `[batch]` string vector, or an InvalidArgument error naming it."""
    return checked_rank(text, "text", 1, "a string vector of shape [batch]")


def checked_id_batches(source_ids, target_ids):
    """Both inputs as `[batch, length]` matrices of one batch size, or an InvalidArgument error."""
    expected = "an int32 matrix of shape [batch, length]"
    source_ids = checked_rank(source_ids, "source_ids", 2, expected)
    target_ids = checked_rank(target_ids, "target_ids", 2, expected)
    # Their shapes may be read only now that both ranks are known to be 2.
    source_shape, target_shape = tf.shape(source_ids), tf.shape(target_ids)
    same_batch = tf.debugging.Assert(
        tf.equal(source_shape[0], target_shape[0]),
        ["source_ids and target_ids must hold the same number of rows; got shapes", source_shape, target_shape],
    )
    with tf.control_dependencies([same_batch]):
        return tf.identity(source_ids), tf.identity(target_ids)


def checked_rank(tensor, name, rank, expected):
    """`tensor`, once a run-time check has found it of rank `rank`; its static shape says so."""
    shape = tf.shape(tensor)
    check = tf.debugging.Assert(tf.equal(tf.size(shape), rank), [f"{name} must be {expected}; got shape", shape])
    with tf.control_dependencies([check]):
        # A reshape to its own shape, padded to `rank` dimensions: it runs
        # after the check, and its output has a rank the graph can rely on.
        checked = tf.reshape(tensor, tf.concat([shape, tf.ones([rank], tf.int32)], axis=0)[:rank])
    checked.set_shape([None] * rank)
    return checked


def check_ids(ids, vocab_size, name):
    """An assertion (for `tf.control_dependencies`) that every id of `ids` is in `[0, vocab_size)`."""
    return tf.debugging.assert_equal(
        tf.reduce_all((ids >= 0) & (ids < vocab_size)),
        True,
        message=f"{name} must be ids in [0, {vocab_size})",
    )
