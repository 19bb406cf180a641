"""Autoregressive decoding: greedy and beam search, for any model.

Section 6.1: "We used beam search with a beam size of 4 and length penalty
alpha = 0.6 ... maximum output length during inference to input length + 50,
but terminate early when possible."

The searches know nothing about the model. They drive a step function

    step_fn(tokens, cache, index, context) -> (logits, cache)

that, given the newest token of every row (`tokens`, `(rows,)` int32, the
token at output position `index`; [START] at index 0) and the model's state,
returns the logits of the token that follows (`(rows, vocab)`) and the
updated cache. Only the model knows what its state holds and how a step uses
it; `inference.steps.transformer_step` builds the step function of the
encoder-decoder Transformer (encode the source once, then one decoder step
on the key/value cache), and a decoder-only model builds its own. This is
how keras-hub's samplers are written (against `next(prompt, cache, index)`).

The state comes in two parts, nested structures (lists, tuples, dicts) of
tensors with a row of each tensor per row of the search:

- `cache`: what every step updates (the self-attention keys and values so
  far), rows on axis 0. The step function returns it with
  the same structure; it may grow a tensor along any other axis (the
  Transformer's step doubles its room as positions fill). One that keeps
  every shape fixed (writing in place at `index`, as the language model's
  does, and the Transformer's with `growing_cache=False`) keeps the searches
  XLA friendly (with `drop_finished=False`, below). Beam search runs `beam_size` rows a sentence (one more with
  `keep_greedy`), a sentence's rows next to each other, and after every step
  gathers the cache rows of the hypotheses that survive (or has the
  runtime's `loops.Chunks` reorder them: `decoding.Decoding`).
- `context`: what no step changes (the encoded source), one row per
  sentence on axis 0, whatever the rows per sentence: every row of a
  sentence reads the same, so the searches never reorder it; they only drop
  the sentences that have finished.

Sentences end at different steps: a short one is done long before the
longest in its batch. With `drop_finished` the searches set a finished
sentence's result aside and drop its rows from the cache and its row of the context,
so that every later step computes only for the sentences still searching,
as CTranslate2 does. That changes the rows' count from step to step; XLA,
which needs fixed shapes, takes `drop_finished=False`. The loop itself, the
same for both searches, is `loops.run_search`; this module holds what each
search does at a step (its strategy) and how it reads the model's logits.

Everything is TensorFlow ops, so the searches run inside `tf.function` and in
an exported SavedModel. What to search for comes as one `DecodingSettings`
(`settings.py`): the beam size, the length penalty, the stopping rule and
the token rules, the [START] and [END] ids among them. Each sentence stops
at [END] or at its own limit (`max_lengths`), so a sentence's output does
not depend on what else is in the batch. Id 0 is padding: neither it nor
[START] is ever generated. A pretrained checkpoint brings rules of its own
for single tokens (`TokenRules`: the ids it never generates, a forced first
token such as NLLB's target language, [END] forced at the length limit).
A forced first token may also differ from sentence to sentence
(`first_ids`: each request's own target language).

Returned tokens exclude [START], include [END] when generated, and are
padded with 0; scores are length-normalised log-probabilities (the
settings' `LengthPenalty`), the quantity beam search maximises.
"""

import collections

import tensorflow as tf

from keras_transformer.inference.loops import (  # noqa: F401 (NEG_INF, num_steps, write_column: the searches' API)
    NEG_INF,
    all_true,
    any_true,
    count_true,
    num_steps,
    run_search,
    write_column,
)
from keras_transformer.inference.settings import STOP_RULES

def forbidden_row(vocab_size, never):
    """`(vocab_size,)` float32: -inf (`NEG_INF`) at the `never` ids, 0 elsewhere.

    The vocabulary size is static for a model's logits, so this row is a
    constant once the graph is optimised.
    """
    ids = tf.range(vocab_size)
    forbidden = tf.reduce_any(ids[:, None] == tf.constant(list(never), tf.int32)[None, :], axis=1)
    return tf.where(forbidden, tf.constant(NEG_INF, tf.float32), tf.constant(0.0, tf.float32))


def top_log_probs(logits, k, rules, log_softmax=tf.nn.log_softmax):
    """Each row's `k` most probable next tokens, the `rules`' forbidden ids left out.

    A search reads no more than a few of a row's `vocab` log-probabilities
    (greedy search its best; beam search, whose `beam_size` best extensions
    of a sentence lie among its rows' `2 * beam_size` best), so this is all
    it asks of the model's logits.

    Args:
        logits: `(rows, vocab)` float32.
        k: candidates per row.
        rules: the `TokenRules`: `never` (forbidden: log-probability -inf)
            and `renormalize` (normalise again without them).
        log_softmax: the normaliser (a runtime may spell it out in the
            operators it runs fastest).

    Returns:
        `(log_probs (rows, k), ids (rows, k) int32)`, best first; equal
        log-probabilities in id order, as `tf.math.top_k` gives them; `k`
        at most the vocabulary's size.
    """
    vocab_size = logits.shape[-1] or tf.shape(logits)[-1]
    if logits.shape[-1] is not None:
        k = min(k, logits.shape[-1])  # a vocabulary smaller than k has that many candidates
    forbidden = forbidden_row(vocab_size, rules.never)
    # Added, not selected: an addition of a constant row is one pass over the logits that every
    # runtime vectorises. A forbidden id scores about -1e9 either way.
    log_probs = log_softmax(logits) + forbidden
    if rules.renormalize:
        log_probs = log_softmax(log_probs)
    return tf.math.top_k(log_probs, k)


def _apply_rules(candidates, rules, step, row_limits, first_ids):
    """A search's `(log_probs, ids)` candidates (`top_log_probs`) with the `rules` for positions applied.

    At output position `step`: a forced first token at 0 (`first_ids`: one
    for all rows or one a row, or None: nothing forced), [END] at a row's
    limit (`row_limits`, with `end_at_limit`). A forced token becomes its
    row's only candidate, certain (log-probability 0); the others are -inf.
    """
    log_probs, ids = candidates
    k = log_probs.shape[-1]

    def certain(token_ids):  # `token_ids` (one, or one a row) the only candidate
        only = tf.constant([0.0] + [NEG_INF] * (k - 1), log_probs.dtype)[None, :]
        return only, tf.pad(tf.reshape(tf.cast(token_ids, tf.int32), [-1, 1]), [[0, 0], [0, k - 1]])

    def forced_where(condition, token_ids, candidates):
        forced = certain(token_ids)
        return tuple(tf.where(condition, when_forced, otherwise) for when_forced, otherwise in zip(forced, candidates))

    if first_ids is not None:
        log_probs, ids = forced_where(tf.equal(step, 0), first_ids, (log_probs, ids))
    if rules.end_at_limit:
        log_probs, ids = forced_where((step + 1 >= row_limits)[:, None], rules.end_id, (log_probs, ids))
    return log_probs, ids


# -- one loop, two strategies ----------------------------------------------------------
#
# A strategy says what one step does with the model's log-probabilities
# (OpenNMT-tf's decoding strategies, keras-hub's samplers): the token `rules`
# it searches under, how many rows it searches per sentence
# (`rows_per_source`), its `initial` state, `advance` (the next tokens, and
# for beam search which rows they extend, so that the cache is reordered:
# `reorders_rows`), `finished` sentences and their `answers`.
# `loops.run_search` is the loop around it (the same for both); `_search`
# hands it the model step under the token rules.


def _search(strategy, step_fn, cache, max_lengths, context, drop_finished, first_ids, decoding):
    """Run `strategy` against `step_fn` under its token rules (`loops.run_search`): `(tokens, scores)`.

    `decoding`: the runtime's `inference.decoding.Decoding` (its candidates'
    arithmetic, its chunks of steps), or None: `top_log_probs`, one loop.
    """
    rules, k = strategy.rules, strategy.candidates_per_row
    best = top_log_probs if decoding is None else decoding.top_log_probs

    def candidates(last, cache, step, context, row_limits, first_ids):
        """One model step: each row's `k` best next tokens under `rules`, `(log_probs, ids)`, and the updated cache."""
        logits, cache = step_fn(last, cache, step, context)
        return _apply_rules(best(logits, k, rules), rules, step, row_limits, first_ids), cache

    chunks = None if decoding is None else decoding.chunks(strategy.rows_per_source)
    return run_search(strategy, candidates, cache, max_lengths, context, drop_finished, first_ids, chunks)


# -- greedy search --------------------------------------------------------------------

GreedyState = collections.namedtuple("GreedyState", ["finished", "tokens", "log_prob_sum", "lengths"])


class GreedySearch:
    """The strategy of greedy search: each sentence's most probable token, one row per sentence.

    Beam search with `keep_greedy` follows this path beside its beams, in
    the same model steps (`pick`).
    """

    rows_per_source = 1
    reorders_rows = False
    candidates_per_row = 1  # its best next token

    def __init__(self, settings):
        self.rules = _token_rules(settings)
        self.end_id = self.rules.end_id
        self.penalty = settings.length_penalty

    @staticmethod
    def initial(batch, steps):
        return GreedyState(
            finished=tf.zeros([batch], tf.bool),
            tokens=tf.zeros([batch, steps], tf.int32),
            log_prob_sum=tf.zeros([batch], tf.float32),
            lengths=tf.zeros([batch], tf.int32),
        )

    def pick(self, state, candidates, position, max_lengths):
        """Pick each sentence's most probable token at output `position`: `(chosen, state)`, [PAD] once finished.

        `candidates`: `(log_probs, ids)`, each row's best first (`top_log_probs`).
        """
        log_probs, ids = candidates
        chosen = tf.where(state.finished, 0, ids[:, 0])
        chosen_log_prob = log_probs[:, 0]
        return chosen, GreedyState(
            finished=state.finished | (chosen == self.end_id) | (position + 1 >= max_lengths),
            tokens=write_column(state.tokens, position, chosen),
            log_prob_sum=state.log_prob_sum + tf.where(state.finished, 0.0, chosen_log_prob),
            lengths=state.lengths + tf.where(state.finished, 0, 1),
        )

    def advance(self, state, candidates, position, max_lengths):
        chosen, state = self.pick(state, candidates, position, max_lengths)
        return chosen, (), state

    @staticmethod
    def finished(state):
        return state.finished

    def answers(self, state):
        """`(tokens, length-normalised scores)`."""
        return state.tokens, state.log_prob_sum / self.penalty(state.lengths)


def _token_rules(settings):
    """The settings' token rules, refused in one line where they name no [START] or [END]."""
    rules = settings.token_rules
    if rules is None or rules.start_id is None or rules.end_id is None:
        raise ValueError("the decoding settings name no [START] and [END] ids: "
                         "use settings.for_output(start_id, end_id)")
    return rules


def greedy_search(step_fn, cache, max_lengths, settings, context=(), drop_finished=True, first_ids=None, decoding=None):
    """Pick the most probable token at every step.

    Args:
        step_fn: `(tokens, cache, index, context) -> (logits, cache)`, see
            the module docstring; one row per sentence.
        cache: its initial cache, rows on axis 0.
        max_lengths: `(batch,)` int32, each sentence's longest output.
        settings: the `DecodingSettings`, their token rules with the
            output's [START] and [END] (`for_output`); greedy search reads
            the token rules and the length penalty (for the returned score).
        context: what the step function reads but never changes, one row
            per sentence on axis 0 (default: nothing).
        drop_finished: drop a sentence's rows once it has finished (False:
            fixed shapes, for XLA; the same result, up to rounding where a
            kernel sums differently for another number of rows).
        first_ids: `(batch,)` int32, the token each sentence's output starts
            with (a request's target language), in place of the rules'
            `forced_first`; default: `forced_first` for all.
        decoding: the runtime's `inference.decoding.Decoding`: how the
            candidates are computed and whether the loop runs in chunks of
            steps (`loops.Chunks`: a cache that settles every few steps,
            where with `drop_finished` the search drops its finished
            sentences); default: `top_log_probs`, one loop.

    Returns:
        `(tokens (batch, steps) int32, scores (batch,) float32)`, `steps =
        num_steps(max_lengths)`.

    Example:
    >>> step_fn, cache, context = transformer_step(model, source_ids, num_steps(max_lengths))
    >>> settings = DecodingSettings(beam_size=1).for_output(start_id, end_id)
    >>> tokens, scores = greedy_search(step_fn, cache, max_lengths, settings, context=context)
    """
    return _search(GreedySearch(settings), step_fn, cache, max_lengths, context, drop_finished, first_ids, decoding)


# -- beam search -----------------------------------------------------------------------


# A beam search's hypotheses, per sentence: `done` (the beams; the greedy path),
# the live ones with their log-probabilities, the final ones with their scores
# and count, and the greedy path's state (with `keep_greedy`).
BeamState = collections.namedtuple(
    "BeamState", ["done", "live", "live_log_probs", "final", "final_scores", "final_count", "greedy"]
)


def beam_rows_per_source(beam_size, keep_greedy):
    """A beam search's rows per sentence: its beams, and with `keep_greedy` the greedy path beside them."""
    return beam_size + 1 if keep_greedy else beam_size


class BeamSearch:
    """The strategy of beam search (see `beam_search`): `rows_per_source` rows a sentence, next to each other."""

    reorders_rows = True

    def __init__(self, settings):
        self.rules = _token_rules(settings)
        self.end_id, self.beam_size = self.rules.end_id, settings.beam_size
        self.penalty = settings.length_penalty
        self.stop = STOP_RULES[settings.stop_rule]
        self.greedy = GreedySearch(settings) if settings.keep_greedy else None
        self.rows_per_source = beam_rows_per_source(settings.beam_size, settings.keep_greedy)
        # A sentence's `beam_size` best extensions that do not end lie among its rows' `2 * beam_size` best.
        self.candidates_per_row = 2 * settings.beam_size

    def initial(self, batch, steps):
        # Only the first beam is live at the start, or every beam would be the same.
        first_beam_only = tf.concat([[0.0], tf.fill([self.beam_size - 1], NEG_INF)], axis=0)
        no_sequences = tf.zeros([batch, self.beam_size, steps], tf.int32)
        return BeamState(
            done=tf.zeros([batch, 2 if self.greedy else 1], tf.bool),  # the beams done; the greedy path finished
            live=no_sequences,
            live_log_probs=tf.tile(first_beam_only[None], [batch, 1]),
            final=no_sequences,
            final_scores=tf.fill([batch, self.beam_size], NEG_INF),
            final_count=tf.zeros([batch], tf.int32),
            greedy=self.greedy.initial(batch, steps) if self.greedy else (),
        )

    @staticmethod
    def finished(state):
        return all_true(state.done, axis=1)

    def answers(self, state):
        """Each sentence's answer so far: its best final hypothesis, or its greedy path where that scores higher."""
        best = state.final[:, 0], state.final_scores[:, 0]  # top_k keeps them sorted
        return higher_scoring(best, self.greedy.answers(state.greedy)) if self.greedy else best

    def advance(self, state, candidates, position, max_lengths):
        """One step: `(next tokens, parents, state)`, tokens and parents `(sentences, rows_per_source)`.

        `candidates`: `(log_probs, ids)`, each row's best `candidates_per_row`
        (`top_log_probs`). A parent is the row (of this step's) whose cache
        the next token's row continues.
        """
        searching = tf.shape(max_lengths)[0]
        state, beam_done, parents, next_tokens = self._extend_beams(state, candidates, position, max_lengths)
        sentence_offsets = tf.range(searching)[:, None] * self.rows_per_source
        parents = sentence_offsets + parents
        if not self.greedy:
            return next_tokens, parents, state._replace(done=beam_done[:, None])
        # The greedy row keeps its own cache. It stops once it cannot beat the
        # best final hypothesis (the same bound as the beams'): then the beams
        # win whatever it does, and the batch need not wait for it.
        greedy_rows = tuple(tf.gather(part, sentence_offsets[:, 0] + self.beam_size) for part in candidates)
        chosen, greedy_state = self.greedy.pick(state.greedy, greedy_rows, position, max_lengths)
        hopeless = _cannot_be_beaten(state.final_scores[:, 0], state.final_count,
                                     greedy_state.log_prob_sum[:, None], position, max_lengths, self.penalty)
        greedy_state = greedy_state._replace(finished=greedy_state.finished | hopeless)
        parents = tf.concat([parents, sentence_offsets + self.beam_size], axis=1)
        next_tokens = tf.concat([next_tokens, chosen[:, None]], axis=1)
        done = tf.stack([beam_done, greedy_state.finished], axis=1)
        return next_tokens, parents, state._replace(done=done, greedy=greedy_state)

    def _extend_beams(self, state, candidates, position, max_lengths):
        """Extend the live hypotheses by their best tokens; set the ended ones aside; keep the best `beam_size` live.

        `candidates`: `(log_probs, ids)`, each `(rows, 2 * beam_size)` (or
        the vocabulary's size, where that is smaller), a
        sentence's `rows_per_source` rows next to each other, its beams
        first. Returns `(state, beams done (sentences,), parents, next
        tokens)`, parents the beam each next token extends, `(sentences,
        beam_size)`.
        """
        beam_size, rows_per_source = self.beam_size, self.rows_per_source
        candidates_kept = 2 * beam_size  # enough that beam_size of them did not end
        log_probs, ids = candidates
        per_row = log_probs.shape[-1]  # candidates_kept, or fewer in a smaller vocabulary
        # Every row's hypothesis' log-probability added to its candidates (0 to the greedy row's), then
        # a sentence's rows as one, cut to its beams' candidates. Reshaped with -1 for the sentences:
        # LiteRT then knows every size when it prepares the loop, not only when it runs a step (which
        # would make it copy the loop's state).
        row_log_probs = tf.pad(state.live_log_probs, [[0, 0], [0, rows_per_source - beam_size]])

        def per_sentence(values):  # (rows, candidates) -> (sentences, its beams' candidates)
            values = tf.reshape(values, [-1, rows_per_source * per_row])
            return values[:, :beam_size * per_row] if rows_per_source > beam_size else values

        extensions = per_sentence(log_probs + tf.reshape(row_log_probs, [-1, 1]))
        top_log_probs, top = tf.math.top_k(extensions, k=candidates_kept)
        beam_index, tokens = top // per_row, tf.gather(per_sentence(ids), top, batch_dims=1)
        top_sequences = write_column(tf.gather(state.live, beam_index, batch_dims=1), position, tokens)
        ends = (tokens == self.end_id) | (position + 1 >= max_lengths[:, None])

        # Set the ended ones among the first beam_size aside, scored.
        beam_done = state.done[:, 0]
        within_beam = tf.range(candidates_kept)[None, :] < beam_size
        new_final = ends & within_beam & ~beam_done[:, None] & (top_log_probs > NEG_INF / 2)
        new_scores = tf.where(new_final, top_log_probs / self.penalty(position + 1), NEG_INF)
        final_count = state.final_count + count_true(new_final, axis=1)
        final_scores, best = tf.math.top_k(tf.concat([state.final_scores, new_scores], axis=1), k=beam_size)
        final = tf.gather(tf.concat([state.final, top_sequences], axis=1), best, batch_dims=1)

        # The best beam_size that did not end carry on, each with its parent's cache.
        live_log_probs, best = tf.math.top_k(tf.where(ends, NEG_INF, top_log_probs), k=beam_size)
        beam_done |= _cannot_be_beaten(final_scores[:, 0], final_count, live_log_probs, position, max_lengths,
                                       self.penalty)
        beam_done |= position + 1 >= max_lengths
        beam_done |= self.stop(final_scores, final_count, live_log_probs, position, self.penalty)
        state = state._replace(live=tf.gather(top_sequences, best, batch_dims=1), live_log_probs=live_log_probs,
                               final=final, final_scores=final_scores, final_count=final_count)
        return state, beam_done, tf.gather(beam_index, best, batch_dims=1), tf.gather(tokens, best, batch_dims=1)


def beam_search(step_fn, cache, max_lengths, settings, context=(), drop_finished=True, first_ids=None, decoding=None):
    """Keep the `beam_size` most probable hypotheses at every step; return the best.

    At each step the live hypotheses are extended by every token and the
    `2 * beam_size` most probable extensions are kept (they lie among each
    row's `2 * beam_size` most probable tokens, `top_log_probs`). Those that end
    ([END], or the sentence's length limit) among the first `beam_size` are
    final: they are set aside, where longer hypotheses can no longer push
    them out. The best `beam_size` that did not end stay live. A sentence is
    done when the settings' stop rule says so (`inference.STOP_RULES`: by
    default once it has `beam_size` final hypotheses), or as soon as no live
    hypothesis can score above its best final one (`_cannot_be_beaten`:
    the same result, fewer steps); the one with the best length-normalised
    score is returned. With `beam_size=1` this is exactly
    greedy search.

    Pruning can drop the greedy path early and end on a worse hypothesis:
    with the settings' `keep_greedy`, one more row per sentence follows the greedy path
    in the same model steps (until it ends, or provably cannot beat the
    beams), and the better of the two is returned, so beam search never
    scores worse than greedy search.

    Args:
        step_fn: as for `greedy_search`, on `batch * rows` rows, `rows =
            beam_size` (plus 1 with `keep_greedy`): row `b * rows + j` is
            beam j of sentence b, and row `b * rows + beam_size` its greedy
            path.
        cache: its initial cache for those rows, every row of a sentence
            holding the same (`tf.repeat(..., rows, axis=0)` lays a
            sentence's cache out so). Rows are reordered by a gather on axis
            0 as beams survive and die (by the decoding's chunks' `reorder`, in chunks).
        context: as for `greedy_search`: one row per sentence, which all
            its rows read.
        max_lengths: `(batch,)` int32, one limit per sentence.
        settings: the `DecodingSettings` (`beam_size`, `keep_greedy`,
            `stop_rule`, the length penalty and the token rules). With
            `keep_greedy` (the settings' default) a sentence has
            `beam_size + 1` rows: lay the cache out for them.
        drop_finished, first_ids, decoding: as for `greedy_search`.

    Returns:
        `(tokens (batch, steps) int32, scores (batch,) float32)`.
    """
    return _search(BeamSearch(settings), step_fn, cache, max_lengths, context, drop_finished, first_ids, decoding)


def _cannot_be_beaten(best_final, final_count, live_log_probs, step, max_lengths, penalty):
    """`(batch,)`: sentences whose best final hypothesis no live one can overtake, so the search may stop.

    A live hypothesis' log-probability L only falls as it grows, and it can
    still end at any length from the next one to its sentence's limit, so
    its score can be at most L divided by the length penalty of one of those
    two lengths (the penalty is monotonic in the length). Once that bound is
    below the best final score for every live hypothesis, nothing later can
    change what the search returns: stopping there returns exactly what
    running on would, in fewer steps. The margin keeps rounding on the
    safe side.
    """
    next_length = step + 2  # the live ones hold step + 1 tokens
    bound = tf.maximum(
        live_log_probs / penalty(next_length),
        live_log_probs / penalty(max_lengths)[:, None],
    )
    margin = 1e-5 * tf.abs(best_final)[:, None] + 1e-6
    can_win = (live_log_probs > NEG_INF / 2) & (bound + margin >= best_final[:, None])
    return (final_count > 0) & ~any_true(can_win, axis=1)


def higher_scoring(first, second):
    """Per sentence, the better of two searches' `(tokens, scores)`: `second` where it scores higher.

    Tokens are padded with 0 to the wider of the two.
    """
    (tokens, scores), (other_tokens, other_scores) = first, second
    width = tf.maximum(tf.shape(tokens)[1], tf.shape(other_tokens)[1])
    pad = lambda values: tf.pad(values, [[0, 0], [0, width - tf.shape(values)[1]]])  # noqa: E731
    other_wins = other_scores > scores
    return tf.where(other_wins[:, None], pad(other_tokens), pad(tokens)), tf.where(other_wins, other_scores, scores)
