"""The loop the searches run, written once: one model step after another until every sentence is finished.

A search (`search.py`) is a strategy, what one step does with the model's
candidates; this module is the loop around it, which any strategy runs on
any step function:

1. each step asks for every row's candidates (`candidates`: the model step
   under the token rules) and hands them to the strategy (`advance`);
2. with `drop_finished`, the sentences that finished set their answers
   aside and leave the batch (`drop_finished`), so that later steps compute
   only for the sentences still searching, as CTranslate2 does;
3. a strategy that reorders its rows (beam search) has the cache's rows
   gathered by their parents (`take`).

A runtime may run the loop in chunks of steps (`Chunks`):
the finished sentences then leave between chunks, where the cache settles.
"""

import collections

import tensorflow as tf

# Stands in for log(0): finite, so that arithmetic on it never makes NaN.
NEG_INF = -1e9


def num_steps(max_lengths):
    """The most steps a search with these per-sentence limits runs (at least 1): the room its cache needs."""
    return tf.maximum(tf.reduce_max(tf.convert_to_tensor(max_lengths, tf.int32)), 1)


def _open_axis(shape, axis):
    """`shape` with `axis` left unknown."""
    if shape.rank in (None, 0):
        return shape
    dims = shape.as_list()
    dims[axis] = None
    return tf.TensorShape(dims)


def loop_shapes(loop_vars, cache_position, cache_grows=True):
    """Loop-variable shapes with the rows' axis left open (sentences leave the batch; gathers lose its static size),
    and, where a step function may grow its cache, every axis of the cache."""
    shapes = [tf.nest.map_structure(lambda value: _open_axis(value.shape, 0), var) for var in loop_vars]
    open_all = lambda value: tf.TensorShape([None] * value.shape.rank)  # noqa: E731
    shapes[cache_position] = tf.nest.map_structure(
        open_all if cache_grows else lambda value: value.shape, loop_vars[cache_position]
    )
    return tuple(shapes)



def count_true(values, axis):
    """`(values).sum(axis)` of a boolean tensor, int32, as a float32 sum.

    A float sum, not an integer one: LiteRT hands float sums to XNNPACK,
    while its own integer and boolean reductions size a scratch tensor at
    every run, and a loop holding one such tensor copies its whole state
    from step to step (`WHILE`'s dynamic path). Exact for counts below 2**24.
    """
    return tf.cast(tf.reduce_sum(tf.cast(values, tf.float32), axis=axis), tf.int32)


def any_true(values, axis):
    """`tf.reduce_any(values, axis)`, counted (`count_true`)."""
    return count_true(values, axis) > 0


def all_true(values, axis):
    """`tf.reduce_all(values, axis)`, counted (`count_true`)."""
    return ~any_true(~values, axis)


def write_column(buffer, column, values):
    """buffer[..., column] = values, with core ops only (graph and Serving friendly)."""
    positions = tf.range(tf.shape(buffer)[-1])
    return tf.where(positions == column, values[..., None], buffer)



# -- the sentences still searching -----------------------------------------------

# The sentences a search still works on: their places in the batch, their limits and their forced
# first tokens (each sentence's own, when the search was given some; else unread zeros).
Sentences = collections.namedtuple("Sentences", ["places", "max_lengths", "first_ids"])


def take(structure, indices):
    """Every tensor of `structure`, cut down to `indices` on axis 0."""
    return tf.nest.map_structure(lambda value: tf.gather(value, indices), structure)


def unfinished(finished, rows_per_source):
    """`(sentences, rows)`: the indices of the unfinished sentences, and of their rows, in the search's state."""
    sentences = tf.cast(tf.where(~finished)[:, 0], tf.int32)
    rows = sentences[:, None] * rows_per_source + tf.range(rows_per_source)[None, :]
    return sentences, tf.reshape(rows, [-1])


def set_aside(results, places, answers):
    """`results` (the whole batch's `(tokens, scores)`) with the sentences at `places` set to `answers`."""
    return tuple(tf.tensor_scatter_nd_update(whole, places[:, None], part) for whole, part in zip(results, answers))


def no_results(batch, steps):
    """The whole batch's `(tokens, scores)` before any sentence has finished."""
    return tf.zeros([batch, steps], tf.int32), tf.zeros([batch], tf.float32)


def drop_finished(finished, sentences, answers, results, per_sentence, per_row, rows_per_source):
    """Set the finished sentences' answers aside and drop them from the search.

    Args:
        finished: `(sentences,)` bool, the sentences done (this step, or this chunk).
        sentences: the `Sentences` searched.
        answers: `() -> (tokens, scores)`, every searched sentence's answer.
        results: the whole batch's `(tokens, scores)` so far.
        per_sentence: the search's state and the context, sentences on axis 0.
        per_row: `[structure, ...]`, `rows_per_source` rows a sentence on
            axis 0: greedy search's cache (beam search gathers its own), and
            between chunks the last tokens.
        rows_per_source: the rows of a sentence.

    Returns:
        `(results, (sentences, per_sentence), [structure, ...])`, all cut
        down to the unfinished sentences.
    """

    def drop():
        results_now, kept, kept_rows = leave(finished, sentences, answers, results, per_sentence, rows_per_source)
        return results_now, kept, [take(structure, kept_rows) for structure in per_row]

    def keep_all():
        return results, (sentences, per_sentence), list(per_row)

    # Most steps finish no sentence: the gathers run only on those that do.
    return tf.cond(tf.reduce_any(finished), drop, keep_all)


def leave(finished, sentences, answers, results, per_sentence, rows_per_source):
    """`drop_finished` without a conditional, for per-row values cut elsewhere: `(results, (sentences,
    per_sentence), kept rows)`, the kept rows' indices for the caller to cut its own by."""
    places = tf.boolean_mask(sentences.places, finished)
    found = take(answers(), tf.where(finished)[:, 0])
    kept, kept_rows = unfinished(finished, rows_per_source)
    return set_aside(results, places, found), take((sentences, per_sentence), kept), kept_rows




# -- the loop ----------------------------------------------------------------------------

# A cache that settles in chunks of steps (a runtime's, `decoding.Decoding.chunks`): the search
# runs `steps` steps in a loop of their own, then calls `settle(cache[, rows])` once, `rows` being
# those to keep (only a search's last chunk is cut short, and what it settles is never read). Within
# a chunk the step functions leave the settled part as they got it, and a search that reorders its
# rows reorders the cache with `reorder(cache, parents)`, which leaves it too.
# The searches drop their finished sentences between chunks, so that every shape stays as it is
# within one: a runtime that plans a loop's memory then plans the chunk's loop once (once a chunk,
# as the cache grows and the batch shrinks, not at every step).
Chunks = collections.namedtuple("Chunks", ["steps", "settle", "reorder"])

# What the loop carries from step to step.
LoopState = collections.namedtuple("LoopState", ["step", "sentences", "cache", "context", "last", "state", "results"])


def run_search(strategy, candidates, cache, max_lengths, context, drop_finished, first_ids, chunks=None):
    """Run `strategy` until every sentence is finished: `(tokens, scores)` of the whole batch.

    Args:
        strategy: a search's strategy (`search.GreedySearch`, `search.BeamSearch`).
        candidates: `(last, cache, step, context, row_limits, first_ids) -> ((log_probs, ids), cache)`:
            one model step, each row's best next tokens under the token rules.
        cache, context, max_lengths, drop_finished, first_ids: as the searches take them.
        chunks: a `Chunks`, to run in chunks of steps; None: one loop.
    """
    max_lengths = tf.convert_to_tensor(max_lengths, tf.int32)
    batch = tf.shape(max_lengths)[0]
    steps = num_steps(max_lengths)
    # Each sentence's own first token rides with the sentence; one for all is a constant.
    first_per_sentence = first_ids is not None
    if not first_per_sentence:
        first_ids = tf.zeros([batch], tf.int32)

    def not_done(*carry):
        return (carry[0] < steps) & ~tf.reduce_all(strategy.finished(LoopState(*carry).state))

    one_step = _step_of(strategy, candidates, first_per_sentence, drop_finished and chunks is None, chunks)
    initial = LoopState(
        tf.constant(0),
        Sentences(tf.range(batch), max_lengths, tf.convert_to_tensor(first_ids, tf.int32)),
        cache,
        context,
        tf.fill([batch * strategy.rows_per_source], tf.cast(strategy.rules.start_id, tf.int32)),
        strategy.initial(batch, steps),
        no_results(batch, steps),
    )
    shapes = loop_shapes(tuple(initial), 2)
    body = one_step if chunks is None else _chunk_of(one_step, not_done, strategy, chunks, drop_finished, shapes)
    final = LoopState(*tf.while_loop(not_done, body, tuple(initial), shape_invariants=shapes))
    # Without drop_finished every sentence is still here; with it, none is.
    return set_aside(final.results, final.sentences.places, strategy.answers(final.state))


def _step_of(strategy, candidates, first_per_sentence, drop_each_step, chunks):
    """The loop's body for one step: the model's candidates, the strategy's choice, then the rows' bookkeeping."""
    rows_per_source = strategy.rows_per_source

    def one_step(*carry):
        step, sentences, cache, context, last, state, results = carry
        row_limits, row_first_ids = sentences.max_lengths, sentences.first_ids
        if rows_per_source > 1:  # each sentence's, for each of its rows (tf.repeat, as a reshape to known sizes)
            row_limits, row_first_ids = (tf.reshape(tf.tile(value[:, None], [1, rows_per_source]), [-1])
                                         for value in (row_limits, row_first_ids))
        best, cache = candidates(last, cache, step, context, row_limits,
                                 row_first_ids if first_per_sentence else strategy.rules.forced_first)
        tokens, parents, state = strategy.advance(state, best, step, sentences.max_lengths)
        if drop_each_step:
            # A strategy that reorders its rows gathers its cache by `parents` below, which drops the
            # finished sentences' rows at no extra cost; one that keeps its rows in place drops them here.
            own_rows = [] if strategy.reorders_rows else [cache]
            results, (sentences, (state, parents, tokens, context)), own_rows = drop_finished(
                strategy.finished(state), sentences, lambda: strategy.answers(state), results,
                (state, parents, tokens, context), own_rows, rows_per_source)
            cache = own_rows[0] if own_rows else cache
        if strategy.reorders_rows:
            cache = (chunks.reorder if chunks else take)(cache, tf.reshape(parents, [-1]))
        return step + 1, sentences, cache, context, tf.reshape(tokens, [-1]), state, results

    return one_step


def _chunk_of(one_step, not_done, strategy, chunks, drop_each_chunk, shapes):
    """The loop's body for a chunk of steps: `chunks.steps` steps, then the cache settles and finished sentences leave."""
    rows_per_source = strategy.rows_per_source

    def one_chunk(step, *carry):
        start = step
        step, sentences, cache, context, last, state, results = tf.while_loop(
            lambda step, *carry: (step < start + chunks.steps) & not_done(step, *carry), one_step,
            (step, *carry), shape_invariants=shapes)
        if drop_each_chunk and strategy.reorders_rows:
            # The finished sentences' rows leave in the settle's gathers, with no conditional
            # (a runtime's conditional may copy what it is given).
            results, (sentences, (state, context)), kept_rows = leave(
                strategy.finished(state), sentences, lambda: strategy.answers(state), results, (state, context),
                rows_per_source)
            return step, sentences, chunks.settle(cache, kept_rows), context, take(last, kept_rows), state, results
        if drop_each_chunk:  # first: the settle then copies fewer rows
            results, (sentences, (state, context)), (cache, last) = drop_finished(
                strategy.finished(state), sentences, lambda: strategy.answers(state), results, (state, context),
                [cache, last], rows_per_source)
        return step, sentences, chunks.settle(cache), context, last, state, results

    return one_chunk
