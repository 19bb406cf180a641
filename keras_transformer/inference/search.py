"""Autoregressive decoding: greedy and beam search on the key/value cache.

Section 6.1: "We used beam search with a beam size of 4 and length penalty
alpha = 0.6 ... maximum output length during inference to input length + 50,
but terminate early when possible."

Both searches run one decoder step per generated token. With the cache
(`use_cache=True`, the default) a step feeds only the newest token and reads
earlier keys and values from the cache; without it, a step re-runs the
decoder on the whole prefix (kept as the plain reference the cached path is
tested and benchmarked against). Everything is TensorFlow ops, so the
functions run inside `tf.function` and in an exported SavedModel.

Each sentence stops at [END] or at its own limit, `min(source length +
max_extra_length, model.max_length)` generated tokens, so a sentence's
translation does not depend on what else is in the batch.

Returned tokens exclude [START], include [END] when generated, and are
padded with 0; scores are length-normalised log-probabilities (GNMT length
penalty ((5 + length) / 6) ** alpha), the quantity beam search maximises.
"""

import tensorflow as tf

from keras_transformer.layers.masks import padding_mask

# Stands in for log(0): finite, so that arithmetic on it never makes NaN.
NEG_INF = -1e9


def length_penalty(lengths, alpha):
    """GNMT's lp(Y) = ((5 + |Y|) / 6) ** alpha."""
    return tf.pow((5.0 + tf.cast(lengths, tf.float32)) / 6.0, alpha)


def output_length_cap(model, max_output_length=None):
    """The longest output allowed: `max_output_length`, at most the model's `max_length`."""
    if max_output_length is None:
        return model.max_length
    if not 1 <= max_output_length <= model.max_length:
        raise ValueError(
            f"max_output_length must be between 1 and the model's max_length ({model.max_length}), "
            f"got {max_output_length}"
        )
    return max_output_length


def _limits(model, source_ids, max_extra_length, max_output_length=None):
    """Each sentence's output limit, and the number of steps the batch needs (at least 1)."""
    source_lengths = tf.reduce_sum(tf.cast(padding_mask(source_ids), tf.int32), axis=1)
    limits = tf.minimum(source_lengths + max_extra_length, output_length_cap(model, max_output_length))
    return limits, tf.maximum(tf.reduce_max(limits), 1)


class _CachedSteps:
    """One decoder step per call, reading and writing the key/value cache."""

    def __init__(self, model, memory, source_mask, num_steps):
        self.model = model
        self.source_mask = source_mask
        self.state = model.build_cache(memory, num_steps)

    def log_probs(self, state, tokens, step):
        logits, state = self.model.decode(
            tokens[:, None], encoder_padding_mask=self.source_mask, cache=state, cache_index=step
        )
        return tf.nn.log_softmax(logits[:, 0]), state

    @staticmethod
    def reorder(state, rows):
        # Cross-attention caches are the same for every beam of a sentence;
        # only the self-attention caches follow the chosen beams. Caches
        # hold keys and values on axis 0, the batch on axis 1.
        return [
            {name: tf.gather(value, rows, axis=1) if name == "self_attention" else value for name, value in layer.items()}
            for layer in state
        ]

    @staticmethod
    def shape_invariants(state):
        # Only the batch axis (axis 1 of a cache) may change size.
        return tf.nest.map_structure(lambda cache: tf.TensorShape([cache.shape[0], None]).concatenate(cache.shape[2:]), state)


class _RecomputedSteps:
    """The reference: every step re-runs the decoder over the whole prefix."""

    def __init__(self, model, memory, source_mask, num_steps):
        self.model = model
        self.memory = memory
        self.source_mask = source_mask
        self.state = tf.zeros([tf.shape(memory)[0], 0], tf.int32)  # decoder inputs so far

    def log_probs(self, state, tokens, step):
        state = tf.concat([state, tokens[:, None]], axis=1)
        logits = self.model.decode(state, self.memory, encoder_padding_mask=self.source_mask)
        return tf.nn.log_softmax(logits[:, -1]), state

    @staticmethod
    def reorder(state, rows):
        return tf.gather(state, rows)

    @staticmethod
    def shape_invariants(state):
        return tf.TensorShape([None, None])


def _steps(use_cache):
    return _CachedSteps if use_cache else _RecomputedSteps


def _invariants(loop_vars, state_index, steps):
    """Loop-variable shapes: the batch axis left open, and a recomputed prefix may grow."""

    def open_batch(value):
        shape = value.shape
        return shape if shape.rank in (None, 0) else tf.TensorShape([None]).concatenate(shape[1:])

    shapes = [tf.nest.map_structure(open_batch, var) for var in loop_vars]
    shapes[state_index] = steps.shape_invariants(loop_vars[state_index])
    return tuple(shapes)


def _never_generated(model, start_id):
    """`(vocab_size,)` bool, True at [PAD] and [START]: ids that are never outputs.

    Built once per search, outside the step loop.
    """
    ids = tf.range(model.tgt_vocab_size)
    return (ids == 0) | (ids == tf.cast(start_id, tf.int32))


def _never_generate(log_probs, forbidden):
    """Give the `forbidden` ids no chance (probabilities unchanged otherwise)."""
    return tf.where(forbidden, tf.cast(NEG_INF, log_probs.dtype), log_probs)


def _write_column(buffer, column, values):
    """buffer[..., column] = values, with core ops only (graph and Serving friendly)."""
    positions = tf.range(tf.shape(buffer)[-1])
    return tf.where(positions == column, values[..., None], buffer)


def greedy_search(
    model, source_ids, start_id, end_id, max_extra_length=50, length_alpha=0.6, use_cache=True, max_output_length=None
):
    """Pick the most probable token at every step.

    Args:
        model: a `keras_transformer.models.Transformer`.
        source_ids: `(batch, source_length)` int32, 0 = padding.
        start_id, end_id: the target vocabulary's [START] and [END] ids.
        max_extra_length: a sentence may be this much longer than its source.
        length_alpha: alpha of the length penalty used for the returned score.
        use_cache: decode on the key/value cache (else recompute the prefix).
        max_output_length: no output is longer than this (default: the
            model's `max_length`).

    Returns:
        `(tokens (batch, steps) int32, scores (batch,) float32)`.
    """
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    batch = tf.shape(source_ids)[0]
    limits, num_steps = _limits(model, source_ids, max_extra_length, max_output_length)
    memory = model.encode(source_ids)
    steps = _steps(use_cache)(model, memory, padding_mask(source_ids), num_steps)
    forbidden = _never_generated(model, start_id)

    def not_done(step, finished, *_):
        return (step < num_steps) & ~tf.reduce_all(finished)

    def one_step(step, finished, state, last, tokens, log_prob_sum, lengths):
        log_probs, state = steps.log_probs(state, last, step)
        log_probs = _never_generate(log_probs, forbidden)
        chosen = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
        chosen = tf.where(finished, 0, chosen)
        chosen_log_prob = tf.gather(log_probs, chosen, batch_dims=1)
        log_prob_sum += tf.where(finished, 0.0, chosen_log_prob)
        lengths += tf.where(finished, 0, 1)
        tokens = _write_column(tokens, step, chosen)
        finished = finished | (chosen == end_id) | (step + 1 >= limits)
        return step + 1, finished, state, chosen, tokens, log_prob_sum, lengths

    initial = (
        tf.constant(0),
        tf.zeros([batch], tf.bool),
        steps.state,
        tf.fill([batch], tf.cast(start_id, tf.int32)),
        tf.zeros([batch, num_steps], tf.int32),
        tf.zeros([batch], tf.float32),
        tf.zeros([batch], tf.int32),
    )
    _, _, _, _, tokens, log_prob_sum, lengths = tf.while_loop(
        not_done, one_step, initial, shape_invariants=_invariants(initial, state_index=2, steps=steps)
    )
    return tokens, log_prob_sum / length_penalty(lengths, length_alpha)


def beam_search(
    model,
    source_ids,
    start_id,
    end_id,
    beam_size=4,
    length_alpha=0.6,
    max_extra_length=50,
    use_cache=True,
    max_output_length=None,
    keep_greedy=True,
):
    """Keep the `beam_size` most probable hypotheses at every step; return the best.

    At each step the live hypotheses are extended by every token and the
    `2 * beam_size` most probable extensions are kept. Those that end
    ([END], or the sentence's length limit) among the first `beam_size` are
    final: they are set aside, where longer hypotheses can no longer push
    them out. The best `beam_size` that did not end stay live. A sentence is
    done when it has `beam_size` final hypotheses; the one with the best
    length-normalised score is returned, or the greedy translation when
    that scores better (`keep_greedy`, see below). With `beam_size=1` this
    is exactly greedy search. Other arguments as `greedy_search`.

    Returns:
        `(tokens (batch, steps) int32, scores (batch,) float32)`.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    batch = tf.shape(source_ids)[0]
    limits, num_steps = _limits(model, source_ids, max_extra_length, max_output_length)
    memory = model.encode(source_ids)
    source_mask = padding_mask(source_ids)
    # Encode once, then give every beam its own copy of the sentence's context.
    steps = _steps(use_cache)(model, memory, source_mask, num_steps)
    forbidden = _never_generated(model, start_id)
    repeat = lambda value: tf.repeat(value, beam_size, axis=0)  # noqa: E731
    steps.source_mask = repeat(source_mask)
    if use_cache:
        state = tf.nest.map_structure(lambda cache: tf.repeat(cache, beam_size, axis=1), steps.state)
    else:
        steps.memory = repeat(memory)
        state = repeat(steps.state)

    vocab_size = model.tgt_vocab_size
    candidates_kept = 2 * beam_size  # enough that beam_size of them did not end
    within_beam = tf.range(candidates_kept)[None, :] < beam_size
    batch_offsets = tf.range(batch)[:, None] * beam_size

    def not_done(step, done, *_):
        return (step < num_steps) & ~tf.reduce_all(done)

    def one_step(step, done, state, last, live, live_log_probs, final, final_scores, final_count):
        log_probs, state = steps.log_probs(state, last, step)
        log_probs = tf.reshape(_never_generate(log_probs, forbidden), [batch, beam_size, vocab_size])
        extensions = tf.reshape(live_log_probs[:, :, None] + log_probs, [batch, -1])
        top_log_probs, top = tf.math.top_k(extensions, k=candidates_kept)
        beam_index, tokens = top // vocab_size, top % vocab_size
        top_sequences = _write_column(tf.gather(live, beam_index, batch_dims=1), step, tokens)
        ends = (tokens == end_id) | (step + 1 >= limits[:, None])

        # Set the ended ones among the first beam_size aside, scored.
        new_final = ends & within_beam & ~done[:, None] & (top_log_probs > NEG_INF / 2)
        new_scores = tf.where(new_final, top_log_probs / length_penalty(step + 1, length_alpha), NEG_INF)
        final_count += tf.reduce_sum(tf.cast(new_final, tf.int32), axis=1)
        final_scores, best = tf.math.top_k(tf.concat([final_scores, new_scores], axis=1), k=beam_size)
        final = tf.gather(tf.concat([final, top_sequences], axis=1), best, batch_dims=1)

        # The best beam_size that did not end carry on.
        live_log_probs, best = tf.math.top_k(tf.where(ends, NEG_INF, top_log_probs), k=beam_size)
        live = tf.gather(top_sequences, best, batch_dims=1)
        state = steps.reorder(state, tf.reshape(batch_offsets + tf.gather(beam_index, best, batch_dims=1), [-1]))
        next_tokens = tf.reshape(tf.gather(tokens, best, batch_dims=1), [-1])
        done = done | (final_count >= beam_size) | (step + 1 >= limits)
        return step + 1, done, state, next_tokens, live, live_log_probs, final, final_scores, final_count

    # Only the first beam is live at the start, or every beam would be the same.
    first_beam_only = tf.concat([[0.0], tf.fill([beam_size - 1], NEG_INF)], axis=0)
    no_sequences = tf.zeros([batch, beam_size, num_steps], tf.int32)
    initial = (
        tf.constant(0),
        tf.zeros([batch], tf.bool),
        state,
        tf.fill([batch * beam_size], tf.cast(start_id, tf.int32)),
        no_sequences,
        tf.tile(first_beam_only[None], [batch, 1]),
        no_sequences,
        tf.fill([batch, beam_size], NEG_INF),
        tf.zeros([batch], tf.int32),
    )
    results = tf.while_loop(
        not_done, one_step, initial, shape_invariants=_invariants(initial, state_index=2, steps=steps)
    )
    # top_k keeps the final hypotheses sorted: the first is the best.
    tokens, scores = results[6][:, 0], results[7][:, 0]
    if beam_size == 1 or not keep_greedy:
        return tokens, scores
    # Pruning can drop the greedy path early and end on a worse hypothesis.
    # Following that one path too (about 1/beam_size more decoding) means
    # beam search never returns a worse score than greedy search.
    greedy_tokens, greedy_scores = greedy_search(
        model, source_ids, start_id, end_id, max_extra_length=max_extra_length, length_alpha=length_alpha,
        use_cache=use_cache, max_output_length=max_output_length,
    )
    width = tf.maximum(tf.shape(tokens)[1], tf.shape(greedy_tokens)[1])
    pad = lambda values: tf.pad(values, [[0, 0], [0, width - tf.shape(values)[1]]])  # noqa: E731
    greedy_wins = greedy_scores > scores
    return tf.where(greedy_wins[:, None], pad(greedy_tokens), pad(tokens)), tf.where(greedy_wins, greedy_scores, scores)


def score_sequences(model, source_ids, target_ids, start_id, length_alpha=0.6):
    """Length-normalised log-probability of given outputs (tokens as the searches return them).

    Teacher-forced, independent of either search: for checking them.
    """
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    target_ids = tf.convert_to_tensor(target_ids, tf.int32)
    batch = tf.shape(target_ids)[0]
    inputs = tf.concat([tf.fill([batch, 1], tf.cast(start_id, tf.int32)), target_ids[:, :-1]], axis=1)
    log_probs = tf.nn.log_softmax(model((source_ids, inputs)))
    token_log_probs = tf.gather(log_probs, target_ids, batch_dims=2)
    real = tf.cast(target_ids != 0, tf.float32)
    lengths = tf.reduce_sum(tf.cast(target_ids != 0, tf.int32), axis=1)
    return tf.reduce_sum(token_log_probs * real, axis=1) / length_penalty(lengths, length_alpha)
