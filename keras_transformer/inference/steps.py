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
   (every beam of a sentence reads its row: `"queries_per_source"` in
   `layers.decoder`);
3. each step runs the decoder on the newest token alone, reading the
   earlier positions' keys and values from the self-attention cache and
   writing the new position's in place at the step's index
   (`model.decode_step(tokens, cache, index, source)`). The cache starts
   with room for `decoding.INITIAL_CACHE_ROOM` positions and doubles when
   full (`grow_cache`): most translations are far shorter than the longest
   allowed, and every step copies its cache (beam search reorders it) and
   attends over all of it.

XLA needs fixed shapes: `transformer_search(..., static_shapes=True)` gives
the cache all its room at once and keeps finished sentences in the batch.
How the cache is kept and written, and how the search's loop runs, is the
runtime's `decoding.Decoding`, handed in (LiteRT's decodes in chunks of
steps on a cache in two parts: `export.litert.decoding`).

`transformer_search` puts the pieces together: the per-sentence output
limits, the step function, and greedy or beam search.
"""

import tensorflow as tf

from keras_transformer.inference.decoding import FIXED_SHAPES, Decoding
from keras_transformer.inference.search import beam_rows_per_source, beam_search, greedy_search, num_steps, write_column
from keras_transformer.inference.settings import LengthPenalty
from keras_transformer.layers.masks import padding_mask


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


def transformer_step(model, source_ids, max_length, rows_per_source=1, use_cache=True, growing_cache=True,
                     decoding=None):
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
        growing_cache: start the cache with room for `decoding.INITIAL_CACHE_ROOM`
            positions and double it when full; False: `max_length` from the
            start (fixed shapes, for XLA).
        decoding: the runtime's `decoding.Decoding`: how the cache is kept
            and written (default TensorFlow's: in place, room doubled as it
            fills); a runtime's own may keep it otherwise (LiteRT's, in two
            parts), and `growing_cache` is its to read.

    Returns:
        `(step_fn, cache, context)`. `step_fn(tokens, cache, index, context)
        -> (logits, cache)`: `tokens` `(rows,)` are the tokens at output
        position `index` ([START] at 0), `logits` `(rows, target_vocab)`
        float32 those of the next token. With `use_cache` the cache and the
        context are the decoder's state as `layers.decoder` describes it:
        the self-attention cache, a `(keys, values)` pair of `(rows, heads,
        room, head_dim)` a layer (or the `decoding`'s own), and the
        source, `{"keys_values", "mask"}`,
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
    # All the room from the start is XLA's case: the scatter, which XLA writes in place.
    decoding = decoding or (Decoding() if growing_cache else FIXED_SHAPES)
    if decoding.chunks(rows_per_source) and not use_cache:
        raise ValueError("a cache settled in chunks is a key/value cache: use_cache=True")
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    memory = model.encode(source_ids)
    source_mask = padding_mask(source_ids)
    if not use_cache:
        return _recomputing_step(model, memory, source_mask, max_length, rows_per_source)

    room, doubles_when_full = decoding.cache_room(max_length, growing_cache)
    cache, source = model.build_cache(memory, room, source_mask)
    cache = decoding.initial_cache(cache, rows_per_source)  # a sentence's rows next to each other
    cache_policy = decoding.cache_policy(rows_per_source)
    # Tied embeddings: the output projection's kernel, transposed once here, not at every step.
    output_kernel = model.tied_output_kernel() if model.tie_output else None

    def cached_step(tokens, cache, index, source):
        if doubles_when_full:
            cache = [grow_cache(own, index, max_length) for own in cache]
        # The rows' count, known now, goes with the source (not through the loop: `layers.decoder`).
        source = {**source, "queries_per_source": rows_per_source}
        logits, cache = model.decode_step(tokens[:, None], cache, index, source, output_kernel, cache_policy)
        # Squeezed, not indexed: an interpreter may copy an indexed slice element by element.
        return tf.squeeze(logits, 1), cache

    return cached_step, cache, source


def _recomputing_step(model, memory, source_mask, max_length, rows_per_source):
    """`transformer_step`'s without a cache: every step runs the decoder on the whole prefix (the reference)."""
    # The context is repeated for a sentence's rows at every step.
    repeat = lambda value: tf.repeat(value, rows_per_source, axis=0) if rows_per_source > 1 else value  # noqa: E731

    def recomputing_step(tokens, prefix, index, context):
        prefix = write_column(prefix, index, tokens)
        logits = model.decode(prefix[:, : index + 1], repeat(context["memory"]),
                              encoder_padding_mask=repeat(context["mask"]))
        return logits[:, -1], prefix

    context = {"memory": memory, "mask": source_mask}
    return recomputing_step, tf.zeros([tf.shape(memory)[0] * rows_per_source, max_length], tf.int32), context


def language_model_step(model, batch_size, max_length, use_cache=True, cache_policy=None):
    """A decoder-only model's step function and its initial cache, for `sampling.sample` or the searches.

    Args:
        model: a `keras_transformer.models.LanguageModel`.
        batch_size: rows.
        max_length: positions the cache has room for (prompt width + new tokens).
        use_cache: decode on the key/value cache; else every step re-runs the
            model on the whole prefix (the reference the cache is tested against).
        cache_policy: how every step writes the cache (a
            `layers.cached_attention.KeyValueCache`; `Decoding().cache_policy`
            for TensorFlow's in-place writes).

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
        logits, cache = model.decode_step(tokens[:, None], cache, index, cache_policy)
        return tf.squeeze(logits, 1), cache

    return cached_step, model.build_cache(batch_size, max_length)


def language_model_prefill(model, cache_policy=None):
    """`prefill_fn(tokens, cache) -> cache` for `sampling.sample`: a block of prompt tokens into the cache at once.

    The decoder writes the keys and values of all `(rows, n)` tokens at
    positions 0..n-1 in one pass (its causal mask keeps each position to
    the ones before it), which is what a prompt costs once rather than n
    steps of one token each.
    """

    def prefill(tokens, cache):
        return model.decode_step(tokens, cache, 0, cache_policy)[1]

    return prefill


def transformer_search(model, source_ids, settings, use_cache=True, static_shapes=False, first_ids=None,
                       decoding=None):
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
        decoding: the runtime's `decoding.Decoding` (default TensorFlow's,
            or its XLA form with `static_shapes`); LiteRT's decodes in
            chunks of steps (`export.litert.decoding`). The same translations.

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
    decoding = decoding or (FIXED_SHAPES if static_shapes else Decoding())
    if decoding.chunks(rows_per_source) and static_shapes:
        raise ValueError("a cache settled in chunks grows between chunks: static_shapes=False")
    step_fn, cache, context = transformer_step(model, source_ids, num_steps(max_lengths),
                                               rows_per_source=rows_per_source, use_cache=use_cache,
                                               growing_cache=not static_shapes, decoding=decoding)
    search = greedy_search if greedy else beam_search
    return search(step_fn, cache, max_lengths, settings, context=context, drop_finished=not static_shapes,
                  first_ids=first_ids, decoding=decoding)


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
