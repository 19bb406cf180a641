"""The Transformer's side of decoding: the step function the searches drive.

`search.py` decodes any model that can say, from the newest token and a
cache, how likely every next token is. This module says it for the
encoder-decoder `Transformer`, and is the only place in decoding that uses
the Transformer's API:

1. encode the source once (`model.encode`);
2. project the encoder output to every layer's cross-attention keys and
   values once (`model.build_cache`'s source): the same for every step, and
   for every beam of a sentence, they are the searches' `context`, one row
   per sentence, which the searches only cut down as sentences finish
   (every beam of a sentence reads its row: `rows_per_source` in
   `layers.decoder`);
3. each step runs the decoder on the newest token alone, reading the
   earlier positions' keys and values from the self-attention cache and
   writing the new position's in place at the step's index
   (`model.decode_step(tokens, cache, index, source)`). The cache starts
   with room for `INITIAL_CACHE_ROOM` positions and doubles when full
   (`grow_cache`): most translations are far shorter than the longest
   allowed, and every step copies its cache (beam search reorders it) and
   attends over all of it.

XLA needs fixed shapes: `transformer_search(..., static_shapes=True)` gives
the cache all its room at once and keeps finished sentences in the batch.
LiteRT, which copies a loop's state at every step and re-plans a loop whose
shapes change, decodes in chunks of steps (`chunk_steps`) on a cache kept in
two parts: most of it untouched for a chunk, settled once a chunk, when it
grows by a chunk (and finished sentences leave).

`transformer_search` puts the pieces together: the per-sentence output
limits, the step function, and greedy or beam search.
"""

import functools

import tensorflow as tf

from keras_transformer.inference.search import (Chunks, beam_rows_per_source, beam_search, greedy_search, num_steps,
                                                write_column)
from keras_transformer.inference.settings import LengthPenalty
from keras_transformer.layers.attention import MASKED_LOGIT
from keras_transformer.layers.cached_attention import PLACEHOLDER_SLOTS, settle_bias, settle_recent
from keras_transformer.layers.masks import padding_mask

# Output positions a translation's self-attention cache has room for at first.
INITIAL_CACHE_ROOM = 16


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


def output_limits(model, source_ids, settings):
    """`(batch,)` int32: each sentence's longest output, `min(source length + max_extra_length, cap)`.

    `settings`: the `DecodingSettings` whose `max_extra_length` and
    `max_output_length` (the cap; default: the model's `max_length`) apply.
    """
    source_lengths = tf.reduce_sum(tf.cast(padding_mask(source_ids), tf.int32), axis=1)
    return tf.minimum(source_lengths + settings.max_extra_length, output_length_cap(model, settings.max_output_length))


def grow_cache(cache, index, max_length):
    """A self-attention cache with room for output position `index`: doubled (to at most `max_length`) when full.

    `cache` is `(keys, values)`, each `(rows, heads, room, head_dim)`
    (`CachedMultiHeadAttention`'s layout), positions below `index` filled.
    While `index < room` it is returned as it is; else with as many new zero
    slots as it has (fewer where `max_length` is nearer), so that the copies
    made while growing add up to less than the final room.
    """
    room = tf.shape(cache[0])[2]

    def doubled():
        rows, heads, _, head_dim = tf.unstack(tf.shape(cache[0]))
        new_slots = tf.zeros([rows, heads, tf.minimum(room, max_length - room), head_dim], cache[0].dtype)
        return tuple(tf.concat([cached, new_slots], axis=2) for cached in cache)

    return tf.cond(index < room, lambda: tuple(cache), doubled)


def two_part_cache(cache, chunk_steps, rows_per_source=1):
    """Empty self-attention caches in two parts (`cached_attention.settle_recent`), `rows_per_source` rows a sentence.

    `cache`: the model's caches, a layer's `(keys, values)`, one row a
    sentence (they give the sizes and dtype). The settled part starts
    empty (`settle_recent` appends a chunk at a time; with several rows a
    sentence it is laid out by sentence and starts with its masked
    placeholder slot), the recent part has room for `chunk_steps`
    positions of every row; values with their positions last.
    """
    def zeros(like, shape):
        return tf.zeros(tf.stack(shape), like.dtype)

    layers = []
    for keys, values in cache:
        sentences, heads, _, head_dim = tf.unstack(tf.shape(keys))
        rows = sentences * rows_per_source
        recent = (zeros(keys, [rows, heads, chunk_steps, head_dim]),
                  zeros(values, [rows, heads, head_dim, chunk_steps]))
        if rows_per_source == 1:
            layers.append((zeros(keys, [rows, heads, 0, head_dim]), zeros(values, [rows, heads, head_dim, 0]), *recent))
            continue
        bias = tf.fill(tf.stack([sentences, 1, rows_per_source, PLACEHOLDER_SLOTS]), MASKED_LOGIT)
        layers.append((zeros(keys, [sentences, heads, PLACEHOLDER_SLOTS, head_dim]),
                       zeros(values, [sentences, heads, head_dim, PLACEHOLDER_SLOTS]), *recent, bias))
    return layers


def settle_chunk(cache, rows=None, rows_per_source=1):
    """Every layer's two-part cache settled after a chunk of steps.

    `rows`: the rows to keep, in this order (the others leave: a search's
    finished sentences, whose rows leave together); default: all.
    `rows_per_source`: the rows each sentence has (`two_part_cache`).
    """
    by_sentence = len(cache[0]) == 5
    if rows is not None:
        if not by_sentence:  # one row a sentence: every part is cut by rows
            cache = [tuple(tf.gather(part, rows) for part in layer) for layer in cache]
        else:  # the settled part and its bias by sentence, the recent part by rows
            kept_sentences = tf.reshape(rows, [-1, rows_per_source])[:, 0] // rows_per_source
            cache = [(tf.gather(keys, kept_sentences), tf.gather(values, kept_sentences), tf.gather(recent_keys, rows),
                      tf.gather(recent_values, rows), bias)
                     for keys, values, recent_keys, recent_values, bias in cache]
    settled = [settle_recent(layer, rows_per_source) for layer in cache]
    if not by_sentence:
        return settled
    # The bias is every layer's: settled once, from the first layer's.
    bias = cache[0][4] if rows is None else tf.gather(cache[0][4], kept_sentences)
    bias = settle_bias(bias, rows_per_source, chunk=tf.shape(cache[0][2])[2])
    return [layer[:4] + (bias,) for layer in settled]


def reorder_chunk(cache, parents, rows_per_source=1):
    """Beam search's reorder of two-part caches within a chunk: row `i` continues row `parents[i]`.

    The recent part's rows are gathered; the settled part stays as it is, so
    that LiteRT's loop hands it from step to step without copying it: its
    bias (the last part of a layer's cache,
    `layers.cached_attention.settle_recent`), the same for every layer, is
    reordered instead, each beam's row of it now the parent's.
    """
    if len(cache[0]) == 4:  # one row a sentence: the settled part is reordered too
        return [tuple(tf.gather(part, parents) for part in layer) for layer in cache]
    # Each row's parent's place among its sentence's rows (a beam search's parents are its sentence's).
    parent_beams = tf.reshape(parents % rows_per_source, [-1, rows_per_source])
    bias = tf.gather(cache[0][4], parent_beams, axis=2, batch_dims=1)
    return [(keys, values, tf.gather(recent_keys, parents), tf.gather(recent_values, parents), bias)
            for keys, values, recent_keys, recent_values, _ in cache]


def transformer_step(model, source_ids, max_length, rows_per_source=1, use_cache=True, growing_cache=True,
                     chunk_steps=None):
    """Encode `source_ids` once; return the searches' step function, its initial cache and its context.

    Args:
        model: a `keras_transformer.models.Transformer`.
        source_ids: `(batch, source_length)` int32, 0 = padding.
        max_length: the most output positions the cache will hold
            (`search.num_steps` of the searches' `max_lengths`).
        rows_per_source: rows per source sentence: the step function and the
            cache serve `batch * rows_per_source` rows, a sentence's rows next to each other, as
            `beam_search` expects (`beam_size`, plus 1 with `keep_greedy`);
            the context holds one row per sentence.
        use_cache: decode on the key/value cache; else every step re-runs
            the decoder on the whole prefix (the plain reference the cached
            path is tested and benchmarked against).
        growing_cache: start the cache with room for `INITIAL_CACHE_ROOM`
            positions and double it when full; False: `max_length` from the
            start (fixed shapes, for XLA).
        chunk_steps: keep each layer's self-attention cache in two parts, the
            positions of earlier chunks of `chunk_steps` steps and the
            current chunk's (`two_part_cache`), for a search that settles it
            after every chunk (`search.Chunks(chunk_steps, settle_chunk,
            reorder_chunk)`), growing it by a chunk: in LiteRT, a loop that
            copies only the recent part from step to step. With more than one
            row a sentence (beam search) the settled part is kept by
            sentence, and each layer's cache also says which of its slots
            hold each row's history (`reorder_chunk`). In a graph traced for
            LiteRT; `growing_cache` does not apply.

    Returns:
        `(step_fn, cache, context)`. `step_fn(tokens, cache, index, context)
        -> (logits, cache)`: `tokens` `(rows,)` are the tokens at output
        position `index` ([START] at 0), `logits` `(rows, target_vocab)`
        float32 those of the next token. With `use_cache` the cache and the
        context are the decoder's state as `layers.decoder` describes it:
        the self-attention cache, a `(keys, values)` pair of `(rows, heads,
        room, head_dim)` a layer (with `chunk_steps`, the two parts of
        `layers.cached_attention.settle_recent`, the settled part one row
        per sentence), and the source, `{"keys_values", "mask"}`,
        one row per sentence. Without, the cache is the decoder's inputs so
        far, `(rows, max_length)`, and the context the encoder output and
        the mask. Either way the cache's rows and the context's sentences
        are on axis 0.

    Example:
    >>> settings = DecodingSettings(beam_size=1).for_output(start_id, end_id)
    >>> max_lengths = output_limits(model, source_ids, settings)
    >>> step_fn, cache, context = transformer_step(model, source_ids, num_steps(max_lengths))
    >>> greedy_search(step_fn, cache, max_lengths, settings, context=context)
    """
    if chunk_steps and not use_cache:
        raise ValueError("a cache settled in chunks is a key/value cache: use_cache=True")
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    memory = model.encode(source_ids)
    source_mask = padding_mask(source_ids)
    # A sentence's rows (its beams), next to each other: the self-attention cache is repeated
    # once here; the recomputing reference repeats the context at every step.
    repeat = lambda value, axis=0: tf.repeat(value, rows_per_source, axis=axis) if rows_per_source > 1 else value  # noqa: E731

    if not use_cache:

        def recomputing_step(tokens, prefix, index, context):
            prefix = write_column(prefix, index, tokens)
            logits = model.decode(prefix[:, : index + 1], repeat(context["memory"]),
                                  encoder_padding_mask=repeat(context["mask"]))
            return logits[:, -1], prefix

        context = {"memory": memory, "mask": source_mask}
        return recomputing_step, tf.zeros([tf.shape(source_ids)[0] * rows_per_source, max_length], tf.int32), context

    # A cache in chunks grows as it settles (the search's `Chunks`), not at a step.
    doubles_when_full = growing_cache and not chunk_steps
    if chunk_steps:
        room = chunk_steps
    else:
        room = tf.minimum(INITIAL_CACHE_ROOM, max_length) if growing_cache else max_length
    cache, source = model.build_cache(memory, room, source_mask)
    if chunk_steps:
        cache = two_part_cache(cache, chunk_steps, rows_per_source)
    else:
        cache = [tuple(repeat(cached) for cached in layer) for layer in cache]

    # Tied embeddings: the output projection's kernel, transposed once here, not at every step.
    output_kernel = model.tied_output_kernel() if model.tie_output else None

    def cached_step(tokens, cache, index, source):
        if doubles_when_full:
            cache = [grow_cache(own, index, max_length) for own in cache]
        # The beams' count, known now, goes with the source (not through the loop: `layers.decoder`).
        source = {**source, "rows_per_source": rows_per_source}
        logits, cache = model.decode_step(tokens[:, None], cache, index, source, output_kernel)
        # Squeezed, not indexed: LiteRT copies an indexed slice element by element (`layers.cached_attention`).
        return tf.squeeze(logits, 1), cache

    return cached_step, cache, source


def language_model_step(model, batch_size, max_length, use_cache=True):
    """A decoder-only model's step function and its initial cache, for `sampling.sample` or the searches.

    Args:
        model: a `keras_transformer.models.LanguageModel`.
        batch_size: rows.
        max_length: positions the cache has room for (prompt width + new tokens).
        use_cache: decode on the key/value cache; else every step re-runs the
            model on the whole prefix (the reference the cache is tested against).

    Returns:
        `(step_fn, cache)`, like `transformer_step`'s without a context, with
        the rows on axis 0. A language model reads no context: its step
        function takes one, as every step function does, and ignores it
        (the sampler passes `()`).
    """
    if not use_cache:

        def recomputing_step(tokens, prefix, index, context):
            prefix = write_column(prefix, index, tokens)
            return model.decode(prefix[:, : index + 1])[:, -1], prefix

        return recomputing_step, tf.zeros([batch_size, max_length], tf.int32)

    def cached_step(tokens, cache, index, context):
        logits, cache = model.decode_step(tokens[:, None], cache, index)
        return tf.squeeze(logits, 1), cache

    return cached_step, model.build_cache(batch_size, max_length)


def language_model_prefill(model):
    """`prefill_fn(tokens, cache) -> cache` for `sampling.sample`: a block of prompt tokens into the cache at once.

    The decoder writes the keys and values of all `(rows, n)` tokens at
    positions 0..n-1 in one pass (its causal mask keeps each position to
    the ones before it), which is what a prompt costs once rather than n
    steps of one token each.
    """

    def prefill(tokens, cache):
        return model.decode_step(tokens, cache, 0)[1]

    return prefill


def transformer_search(model, source_ids, settings, use_cache=True, static_shapes=False, first_ids=None,
                       chunk_steps=None):
    """Translate source ids with a `Transformer`: greedy search for `beam_size=1`, else beam search.

    Args:
        model: a `keras_transformer.models.Transformer`.
        source_ids: `(batch, source_length)` int32, 0 = padding.
        settings: the `DecodingSettings` (beam size, length penalty and
            limits, stop rule, `keep_greedy`: see `inference.settings`),
            their token rules with the target vocabulary's [START] and [END]
            (`settings.for_output(start_id, end_id)`).
        use_cache: decode on the key/value cache (else recompute the prefix).
        static_shapes: keep every tensor's shape through the search, as XLA
            needs: the cache has all its room from the start (no
            `growing_cache`) and finished sentences stay in the batch (no
            `drop_finished`). The same translations, more work.
        first_ids: `(batch,)` int32, each sentence's forced first token (a
            request's target language; see `inference.greedy_search`).
        chunk_steps: in a graph traced for LiteRT, without `static_shapes`:
            the self-attention cache in two parts, settled every
            `chunk_steps` steps, when the cache grows and finished sentences
            leave (see `transformer_step`). The same translations.

    Returns:
        `(tokens (batch, steps) int32, scores (batch,) float32)`, as the searches.

    Example:
    >>> settings = DecodingSettings(beam_size=4).for_output(start_id=2, end_id=3)
    >>> tokens, scores = transformer_search(model, source_ids, settings)
    """
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    max_lengths = output_limits(model, source_ids, settings)
    greedy = settings.beam_size == 1
    rows_per_source = 1 if greedy else beam_rows_per_source(settings.beam_size, settings.keep_greedy)
    if chunk_steps and static_shapes:
        raise ValueError("a cache settled in chunks grows between chunks: static_shapes=False")
    step_fn, cache, context = transformer_step(model, source_ids, num_steps(max_lengths),
                                               rows_per_source=rows_per_source, use_cache=use_cache,
                                               growing_cache=not static_shapes, chunk_steps=chunk_steps)
    search = greedy_search if greedy else beam_search
    return search(step_fn, cache, max_lengths, settings, context=context, drop_finished=not static_shapes,
                  first_ids=first_ids,
                  chunks=Chunks(chunk_steps, functools.partial(settle_chunk, rows_per_source=rows_per_source),
                                functools.partial(reorder_chunk, rows_per_source=rows_per_source))
                  if chunk_steps else None)


def score_sequences(model, source_ids, target_ids, start_id, length_penalty=LengthPenalty()):
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
    return tf.reduce_sum(token_log_probs * real, axis=1) / length_penalty(lengths)
