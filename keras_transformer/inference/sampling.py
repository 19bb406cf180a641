"""Sampling continuations of prompts, for a language model: temperature, top-k, top-p.

Greedy and beam search (`search`) look for the most probable text; a
language model asked to write draws each next token at random from its
distribution instead, reshaped by three settings:

- `temperature` T: softmax(logits / T). Below 1 the likely tokens get
  likelier, above 1 the distribution flattens; 0 means greedy.
- `top_k` k: draw only among the k most probable tokens (Fan et al., 2018).
- `top_p` p: draw only among the fewest most probable tokens whose
  probabilities add up to at least p, "nucleus sampling" (Holtzman et al., 2020).

The sampler drives the same step function as the searches,
`step_fn(tokens, cache, index, context) -> (logits, cache)` (with no
context: a language model reads none): at position t it feeds
every row its token t and gets the logits of token t + 1 (the positions all
prompts share are read into the cache first, in one pass). Prompts of
different lengths come right-padded in one batch: while a row is inside its
prompt, its next token is the prompt's (the step only fills the cache); after
it, the token is drawn. So each row's text is what it would be alone, and one
loop both reads the prompts into the cache and writes. A row stops at [END]
or after `max_new_tokens`.

Each draw is seeded with `(seed, t)` at position t (the Gumbel-max trick on
hashed uniform noise, `_draw`): the same seed and batch give the same
text, in a graph or out, under XLA and in a LiteRT file.
"""

import collections

import tensorflow as tf

from keras_transformer.inference.loops import NEG_INF, loop_shapes, write_column


class SamplingSettings(collections.namedtuple(
        "SamplingSettings", ["max_new_tokens", "temperature", "top_k", "top_p", "seed"],
        defaults=(1.0, None, None, 0))):
    """How to sample a continuation; each setting a Python number or a scalar tensor (an export's request).

    max_new_tokens: tokens to add at most, [END] included.
    temperature, top_k, top_p: see `filter_logits`; temperature 0 is greedy.
    seed: an integer: the same seed, the same texts.

    Example:
    >>> SamplingSettings(max_new_tokens=30, top_p=0.9, seed=1)
    """


def filter_logits(logits, temperature=1.0, top_k=None, top_p=None):
    """`(rows, vocab)` logits reshaped for drawing: scaled by 1/temperature, outside top-k / top-p set to -inf-ish.

    Any setting may be a scalar tensor (an export takes them per request):
    top_k None or 0 and top_p None or 1 mean no limit; temperature must be
    above 0 here (`sample` turns 0 into greedy).

    Example:
    >>> filter_logits(tf.constant([[2.0, 1.0, 0.0]]), top_k=2)  # [[2.0, 1.0, -1e9]]
    """
    logits = tf.convert_to_tensor(logits, tf.float32) / tf.cast(temperature, tf.float32)
    if top_k is not None and not (isinstance(top_k, int) and top_k == 0):
        if isinstance(top_k, int) and logits.shape[-1] is not None:
            k = min(top_k, logits.shape[-1])  # known now: a fixed k
        else:
            vocab = tf.shape(logits)[-1]
            top_k = tf.cast(top_k, tf.int32)
            k = tf.where(top_k > 0, tf.minimum(top_k, vocab), vocab)
        kth_largest = tf.math.top_k(logits, k=k).values[:, -1:]
        logits = tf.where(logits < kth_largest, NEG_INF, logits)
    if top_p is not None:
        top_p = tf.cast(top_p, tf.float32)
        sorted_logits = tf.sort(logits, axis=-1, direction="DESCENDING")
        probabilities = tf.nn.softmax(sorted_logits, axis=-1)
        # A token is kept when the tokens more probable than it add up to less
        # than p: the first always is. At p = 1 all are, whatever the rounding.
        before = tf.cumsum(probabilities, axis=-1, exclusive=True)
        kept = tf.where((before < top_p) | (top_p >= 1.0), sorted_logits, tf.float32.max)
        smallest_kept = tf.reduce_min(kept, axis=-1, keepdims=True)
        logits = tf.where(logits < smallest_kept, NEG_INF, logits)
    return logits


def sample(step_fn, cache, prompts, prompt_lengths, end_id, settings, never=(0,), prefill_fn=None):
    """Continue each prompt with tokens drawn from the model.

    Args:
        step_fn: `(tokens, cache, index, context) -> (logits, cache)` (see `search`); one row per prompt,
            called with an empty context.
        cache: its initial cache, with room for
            `prompt width + max_new_tokens` positions.
        prompts: `(rows, width)` int32, each right-padded with 0; at least one token each.
        prompt_lengths: `(rows,)` int32, each prompt's tokens.
        end_id: the token that ends a text.
        settings: the `SamplingSettings` (new tokens at most, temperature,
            top-k, top-p, seed).
        never: ids never drawn (padding; a [START] token).
        prefill_fn: `(tokens, cache) -> cache`, filling the cache with a
            `(rows, n)` block of tokens in one pass (`language_model_prefill`);
            given, the tokens every prompt has (all but the shortest prompt's
            last) go through the model at once instead of one step each.

    Returns:
        `(tokens, lengths)`: `(rows, width + max_new_tokens)` int32, each
        row its prompt then what was drawn, padded with 0; and each row's length.

    Example:
    >>> step_fn, cache = language_model_step(model, batch_size=2, max_length=40)
    >>> settings = SamplingSettings(max_new_tokens=30, top_p=0.9, seed=1)
    >>> tokens, lengths = sample(step_fn, cache, prompts, prompt_lengths, end_id, settings)
    """
    max_new_tokens, temperature, top_k, top_p, seed = settings
    prompts = tf.convert_to_tensor(prompts, tf.int32)
    prompt_lengths = tf.convert_to_tensor(prompt_lengths, tf.int32)
    rows, width = tf.shape(prompts)[0], tf.shape(prompts)[1]
    total = width + max_new_tokens
    tokens = tf.pad(prompts, [[0, 0], [0, max_new_tokens]])
    limits = prompt_lengths + max_new_tokens  # each row's longest text

    def not_done(position, finished, *_):
        return (position + 1 < total) & ~tf.reduce_all(finished)

    def one_step(position, finished, cache, tokens):
        current = tf.gather(tokens, position, axis=1)
        logits, cache = step_fn(current, cache, position, ())
        for token_id in never:
            logits = write_column(logits, token_id, tf.fill([rows], NEG_INF))
        drawn = tf.argmax(logits, axis=-1, output_type=tf.int32)  # temperature 0: greedy
        if not _is_zero(temperature):
            # A tensor temperature may still be 0 at run time: divide by 1 then, and keep the argmax.
            scale = tf.where(temperature > 0, tf.cast(temperature, tf.float32), 1.0)
            filtered = filter_logits(logits, scale, top_k, top_p)
            sampled = _draw(filtered, seed, position)
            drawn = tf.where(temperature > 0, sampled, drawn)
        next_position = position + 1
        in_prompt = next_position < prompt_lengths
        prompt_token = tf.gather(tokens, next_position, axis=1)
        chosen = tf.where(in_prompt, prompt_token, tf.where(finished, 0, drawn))
        tokens = write_column(tokens, next_position, chosen)
        finished = finished | (~in_prompt & (chosen == end_id)) | (next_position + 1 >= limits)
        return next_position, finished, cache, tokens

    start = tf.constant(0)
    if prefill_fn is not None:
        # Positions before the shortest prompt's last token are prompt in every row:
        # one pass fills their keys and values, and the loop starts at that last token.
        start = tf.minimum(tf.reduce_min(prompt_lengths), width) - 1  # an empty batch's minimum is huge
        cache = tf.cond(start > 0, lambda: prefill_fn(prompts[:, :start], cache), lambda: cache)
    initial = (start, prompt_lengths + max_new_tokens <= 1, cache, tokens)
    _, _, _, tokens = tf.while_loop(
        not_done, one_step, initial, shape_invariants=loop_shapes(initial, 2, cache_grows=False)
    )
    # A row's text ends after [END] or at its limit; the rest is padding.
    positions = tf.range(total)[None, :]
    ended = tf.cumsum(tf.cast((tokens == end_id) & (positions >= prompt_lengths[:, None]), tf.int32), axis=1)
    ended_before = tf.pad(ended[:, :-1], [[0, 0], [1, 0]])
    keep = (ended_before == 0) & (positions < limits[:, None])
    tokens = tf.where(keep, tokens, 0)
    return tokens, tf.reduce_sum(tf.cast(keep & (tokens != 0), tf.int32), axis=1)


def _draw(logits, seed, position):
    """One token per row, drawn with probabilities softmax(logits): the Gumbel-max trick.

    argmax(logits + g) with g = -log(-log(u)), u uniform in (0, 1), picks
    token i with probability softmax(logits)_i. The uniform noise is a hash of
    (seed, position, token id) (`_uniform`), not a TensorFlow random op:
    the same integer arithmetic runs in a graph, eagerly, under XLA and in a
    LiteRT file (`export.litert`), which has no stateless random op. Every
    row gets the same noise (from the seed and the position alone): a
    prompt's text then does not depend on which row of a batch it came in,
    or on what else was in the batch.
    """
    uniform = _uniform(tf.cast(seed, tf.int32), tf.cast(position, tf.int32), tf.shape(logits)[-1])
    return tf.argmax(logits - tf.math.log(-tf.math.log(uniform))[None, :], axis=-1, output_type=tf.int32)


def _uniform(seed, position, size):
    """`(size,)` float32 in (0, 1): a counter-based hash (MurmurHash3's finaliser) of (seed, position, index).

    Written with int32 multiplication (which wraps), xor and shifts, which
    TensorFlow and LiteRT compute alike; a logical shift is an arithmetic
    one with the sign's bits taken away (`floormod`).
    """

    def logical_shift(value, bits):
        return tf.math.floormod(tf.bitwise.right_shift(value, bits), 1 << (32 - bits))

    def mix(value):
        value = tf.bitwise.bitwise_xor(value, logical_shift(value, 16)) * tf.constant(-2048144789, tf.int32)
        value = tf.bitwise.bitwise_xor(value, logical_shift(value, 13)) * tf.constant(-1028477387, tf.int32)
        return tf.bitwise.bitwise_xor(value, logical_shift(value, 16))

    key = mix(mix(seed * tf.constant(-1640531535, tf.int32) + position) + tf.constant(0x2545F491, tf.int32))
    hashed = mix(key + tf.range(size) * tf.constant(-1640531535, tf.int32))
    # The top 24 bits, centred in their interval: never 0 or 1.
    return (tf.cast(logical_shift(hashed, 8), tf.float32) + 0.5) / float(1 << 24)


def _is_zero(temperature):
    """Whether `temperature` is known to be 0 before the graph runs (a Python number)."""
    return isinstance(temperature, (int, float)) and temperature == 0
