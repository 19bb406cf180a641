"""Batches for the encoder tasks: labelled texts for a classifier, masked texts for pre-training (BERT's recipe).

Both read their texts into memory, tokenize them once, and reshuffle every
epoch (`pipeline.shuffle_each_epoch`); translation's batches, streamed from
token shards and bucketed by length, are `pipeline`'s.
"""

import tensorflow as tf

from keras_transformer.data.pipeline import batches_of, shuffle_each_epoch


def make_classification_batches(examples, tokenizer, max_length, batch_size, shuffle=False, seed=0, drop_remainder=False):
    """Labelled texts -> a tf.data pipeline of `(ids, label)` batches for an encoder-only classifier.

        (text, label) pairs -> shuffle each epoch -> batch -> [CLS] + pieces -> prefetch

    The text is tokenized inside the pipeline (`tokenizer.tokenize_with_cls`),
    each batch padded to its longest text, at most `max_length` ids.

    Args:
        examples: `[(text, label), ...]` with integer labels.
        tokenizer: a `WordPieceTokenizer` with the [CLS] token.
        max_length: ids per text, [CLS] included; longer texts are cut.
        batch_size: texts per batch.
        shuffle: reshuffle every epoch (see `shuffle_each_epoch`) with `seed`.
        drop_remainder: drop a last, smaller batch (every replica of a
            distributed run then gets a share of every batch).

    Returns:
        `(dataset, epoch)`: `epoch` is the variable that sets each pass's
        order (for an exact resume), None without `shuffle`.
    """
    texts = tf.constant([text for text, _ in examples], tf.string)
    labels = tf.constant([label for _, label in examples], tf.int32)
    dataset = tf.data.Dataset.from_tensor_slices((texts, labels))
    epoch = None
    if shuffle:
        dataset, epoch = shuffle_each_epoch(dataset, len(examples), seed)
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    # Shuffling each epoch hides the count from tf.data; Keras shows it.
    num_batches = batches_of(len(examples), batch_size, drop_remainder=drop_remainder)
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(num_batches))
    dataset = dataset.map(
        lambda batch, batch_labels: (tokenizer.tokenize_with_cls(batch, max_length), batch_labels),
        num_parallel_calls=tf.data.AUTOTUNE,
    )
    return dataset.prefetch(tf.data.AUTOTUNE), epoch


def mask_tokens(token_ids, seed, mask_id, vocab_size, first_word_id, rate=0.15):
    """BERT's masked-language-model corruption (Devlin et al. 2019, Section 3.1, "Task #1").

    Of each batch's real tokens (not padding, not the reserved tokens below
    `first_word_id`), `rate` are chosen at random. A chosen token becomes
    `[MASK]` 80% of the time, a random word 10% of the time, and stays as it
    is 10% of the time: the model cannot tell which tokens are real, so it
    must build a good representation of every one. The labels are the
    original ids at the chosen positions and 0 elsewhere (the masked loss
    ignores 0, as it ignores padding).

    Args:
        token_ids: `(batch, length)` int32 ids.
        seed: a stateless seed `(2,)` int32/int64: the same seed, the same masks.
        mask_id: the id of `[MASK]`.
        vocab_size: random replacements are drawn from `first_word_id..vocab_size-1`.
        first_word_id: ids below it are reserved tokens, never chosen.
        rate: the share of tokens to predict.

    Returns:
        `(inputs, labels)`, both `(batch, length)` int32.

    Example:
    >>> inputs, labels = mask_tokens(tf.constant([[4, 9, 12, 30, 0]]), [0, 1], mask_id=5, vocab_size=40, first_word_id=6)
    """
    token_ids = tf.convert_to_tensor(token_ids, tf.int32)
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), num=3)
    choose, how, replacement = (tf.random.stateless_uniform(tf.shape(token_ids), seed=seeds[i]) for i in range(3))
    chosen = (token_ids >= first_word_id) & (choose < rate)
    random_words = tf.cast(
        tf.cast(first_word_id, tf.float32) + replacement * tf.cast(vocab_size - first_word_id, tf.float32), tf.int32
    )
    corrupted = tf.where(how < 0.8, tf.fill(tf.shape(token_ids), mask_id), tf.where(how < 0.9, random_words, token_ids))
    inputs = tf.where(chosen, corrupted, token_ids)
    labels = tf.where(chosen, token_ids, tf.zeros_like(token_ids))
    return inputs, labels


def hidden_positions(labels):
    """Where `mask_tokens` hid tokens: `(positions, labels)`, both `(batch, most hidden in one row)` int32.

    The output layer of a masked language model is as wide as the vocabulary,
    and most positions have nothing to predict: scoring only the hidden ones
    (BERT's `masked_lm_positions`) makes it about 1 / rate times cheaper.
    Each row lists its hidden positions in order, then positions with label 0
    (nothing to predict: the loss skips them) to fill the row.

    Example:
    >>> hidden_positions(tf.constant([[0, 7, 0, 9], [3, 0, 0, 0]]))  # ([[1, 3], [0, 1]], [[7, 9], [3, 0]])
    """
    labels = tf.convert_to_tensor(labels, tf.int32)
    hidden = tf.cast(labels != 0, tf.int32)
    width = tf.reduce_max(tf.reduce_sum(hidden, axis=1))
    # A stable sort on "not hidden" puts each row's hidden positions first, in order.
    positions = tf.argsort(1 - hidden, axis=1, stable=True)[:, :width]
    return positions, tf.gather(labels, positions, batch_dims=1)


def make_pretraining_batches(
    texts, tokenizer, max_length, batch_size, shuffle=False, seed=0, rate=0.15, drop_remainder=False
):
    """Unlabelled texts -> `((corrupted ids, hidden positions), labels)` batches for masked-language-model pre-training.

        texts -> shuffle each epoch -> batch -> [CLS] + pieces -> mask_tokens -> hidden_positions -> prefetch

    The masks are drawn anew every epoch (RoBERTa's dynamic masking: the
    model sees each sentence with different holes) from the seed, the epoch
    number and the batch's index, so a resumed run masks as an uninterrupted
    one would.

    Args:
        texts: strings.
        tokenizer: a `WordPieceTokenizer` whose vocabulary has `PRETRAINING_TOKENS`.
        max_length, batch_size, shuffle, seed, drop_remainder: as for
            `make_classification_batches`.
        rate: the share of tokens to predict (0.15 in BERT).

    Returns:
        `(dataset, epoch)` as `make_classification_batches` returns them; the
        dataset's elements are `((token_ids, positions), labels)`: the ids
        `(batch, length)` with tokens hidden, and the hidden tokens' positions and
        original ids `(batch, hidden)` (`hidden_positions`), what
        `MaskedLanguageModel` takes and its loss reads.
    """
    from keras_transformer.text import MASK, PRETRAINING_TOKENS

    if tokenizer.vocab[: len(PRETRAINING_TOKENS)] != list(PRETRAINING_TOKENS):
        raise ValueError(f"pre-training needs a vocabulary that starts with {list(PRETRAINING_TOKENS)}")
    dataset, epoch = make_classification_batches(
        [(text, 0) for text in texts], tokenizer, max_length, batch_size, shuffle=shuffle, seed=seed,
        drop_remainder=drop_remainder,
    )
    mask_id, vocab_size = tokenizer.vocab.index(MASK), tokenizer.vocab_size

    def corrupt(index, batch):
        token_ids, _ = batch
        # Validation (no shuffle) is masked the same way every epoch.
        this_epoch = epoch.read_value() if epoch is not None else tf.constant(0, tf.int64)
        batch_seed = tf.stack([tf.cast(seed, tf.int64) * 1_000_003 + this_epoch, index])
        inputs, labels = mask_tokens(token_ids, batch_seed, mask_id, vocab_size, len(PRETRAINING_TOKENS), rate)
        positions, hidden_labels = hidden_positions(labels)
        return (inputs, positions), hidden_labels

    dataset = dataset.enumerate().map(corrupt, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.apply(tf.data.experimental.assert_cardinality(dataset.cardinality())).prefetch(
        tf.data.AUTOTUNE
    ), epoch
