"""LiteRT's way to run the searches: chunks of steps on a cache in two parts, candidates from blocks of logits.

`LiteRTDecoding` is the `inference.decoding.Decoding` that a LiteRT
translation file's searches are traced with (`signatures.LiteRTTranslation`):

- the self-attention cache is kept in two parts, settled every
  `CHUNK_STEPS` steps, when it grows by a chunk (`cache.TwoPartCache`): a
  LiteRT loop (`WHILE`) copies every value it carries at every step, except
  one the step hands on untouched, so the settled part goes through a
  chunk's steps uncopied, and only the chunk's own positions are written;
- the searches run a loop per chunk (`inference.loops.Chunks`), and their
  finished sentences leave between chunks, so that every shape holds within
  a chunk and LiteRT plans each chunk's loop once;
- the candidates come from the vocabulary cut into blocks, and the
  log-softmax is spelled out in operators XNNPACK runs (below).

The translations are the same as TensorFlow's searches give.
"""

import functools

import tensorflow as tf

from keras_transformer.export.litert.cache import TwoPartCache, reorder_chunk, settle_chunk, two_part_cache
from keras_transformer.inference.decoding import Decoding
from keras_transformer.inference.loops import Chunks
from keras_transformer.inference.search import forbidden_row, top_log_probs

# The searches settle their self-attention cache once every this many steps: between settles
# LiteRT's loop copies only the chunk's positions from step to step, and a settle appends the
# chunk to the settled part. The searches drop their finished sentences there too.
CHUNK_STEPS = 8


class LiteRTDecoding(Decoding):
    """The searches as a LiteRT file runs them (the module docstring).

    Args:
        chunk_steps: the steps between two settles of the cache.
    """

    def __init__(self, chunk_steps=CHUNK_STEPS):
        super().__init__(in_place=False)
        self.chunk_steps = chunk_steps

    def cache_policy(self, rows_per_source):
        return TwoPartCache(rows_per_source)

    def cache_room(self, max_length, growing):
        # The recent part's room: the cache grows as it settles (a chunk at a time), not at a step.
        return self.chunk_steps, False

    def initial_cache(self, cache, rows_per_source):
        return two_part_cache(cache, self.chunk_steps, rows_per_source)

    def chunks(self, rows_per_source):
        return Chunks(self.chunk_steps, functools.partial(settle_chunk, rows_per_source=rows_per_source),
                      functools.partial(reorder_chunk, rows_per_source=rows_per_source))

    def top_log_probs(self, logits, k, rules):
        """`search.top_log_probs`'s candidates, from blocks of logits where the vocabulary is large enough to pay."""
        vocab_size = logits.shape[-1] or tf.shape(logits)[-1]
        if logits.shape[-1] is not None:
            k = min(k, logits.shape[-1])  # a vocabulary smaller than k has that many candidates
        never = len(set(rules.never))
        block = _block_size(logits.shape[-1], k + never)
        if block is None:
            return top_log_probs(logits, k, rules, log_softmax=spelled_out_log_softmax)
        forbidden = forbidden_row(vocab_size, rules.never)
        return _top_log_probs_in_blocks(logits, k, block, forbidden, never, rules.renormalize)


def _block_size(vocab_size, k):
    """The block `_top_log_probs_in_blocks` cuts a row of `vocab_size` logits into, or None (too few to pay).

    A divisor of the vocabulary size (a reshape into blocks moves no
    number), near `sqrt(vocab_size / k)`, which makes the two top-k's after
    the blocks' maxima, over `vocab_size / block` maxima and over `k`
    blocks, cheapest together.
    """
    if vocab_size is None or vocab_size < 64 * k:
        return None
    best = (vocab_size / k) ** 0.5
    divisors = [size for size in range(8, min(vocab_size // k, 4096) + 1) if vocab_size % size == 0]
    block = min(divisors, key=lambda size: abs(size - best), default=None)
    # A vocabulary with no useful divisor (a prime size) keeps the plain top-k.
    return block if block is not None and vocab_size // block + k * block < vocab_size // 4 else None


def _top_log_probs_in_blocks(logits, k, block, forbidden, never, renormalize):
    """`search.top_log_probs` as LiteRT runs it fastest: the fewest passes over the logits, a top-k over a few.

    LiteRT's `TOPK_V2` is a scalar loop over every number it is given, and
    at a large vocabulary each pass over the `(rows, vocab)` numbers (a
    log-softmax spelled out, an added row, a selection) costs a good part of
    what the model's int8 products do. So the logits are cut into blocks
    (a reshape, which moves nothing): one `max` pass gives each block's
    largest logit and, from those, the row's largest for the normaliser
    (`m + log(sum(exp(logits - m)))`, as in `spelled_out_log_softmax`); the `k` largest
    logits lie in the `k` blocks with the largest maxima, and a top-k over
    those blocks' logits finds them. Only these candidates are normalised.
    The forbidden ids are taken out among the candidates (`never` more of
    them, one for each forbidden id, in case they are the largest), unless
    `renormalize` takes them out of the normaliser too.
    """
    if renormalize:
        logits, never = logits + forbidden, 0
    wanted = k + never
    blocks = tf.reshape(logits, [-1, logits.shape[-1] // block, block])  # -1: LiteRT knows every size in its loop
    block_largest = tf.reduce_max(blocks, axis=-1)
    largest = tf.reduce_max(block_largest, axis=-1, keepdims=True)
    log_total = largest + tf.math.log(tf.reduce_sum(tf.exp(blocks - largest[:, :, None]), axis=[1, 2])[:, None])
    _, best_blocks = tf.math.top_k(block_largest, wanted)
    best_blocks = -tf.math.top_k(-best_blocks, wanted).values  # in id order: ties go to the lower id, as top_k's do
    values, within = tf.math.top_k(tf.reshape(tf.gather(blocks, best_blocks, batch_dims=1), [-1, wanted * block]),
                                   wanted)
    ids = tf.gather(best_blocks, within // block, batch_dims=1) * block + within % block
    if never:
        values, best = tf.math.top_k(values + tf.gather(forbidden, ids), k)
        ids = tf.gather(ids, best, batch_dims=1)
    return values - log_total, ids


def spelled_out_log_softmax(logits):
    """log(softmax(logits)) over the last axis, as LiteRT runs it fastest.

    Spelled out as
    `logits - (m + log(sum(exp(logits - m))))` with `m` each row's largest
    logit (so that no exponential overflows). LiteRT hands those operators to
    XNNPACK, whose kernels use the CPU's widest vectors; its own `LOG_SOFTMAX`
    kernel is compiled for 128-bit SSE, and runs about three times slower
    still right after XNNPACK's int8 matrix products, which leave the AVX-512
    registers' upper halves in use (the CPU then makes every SSE instruction
    wait on them). Over a batch of 32 rows of 58,101 logits the spelled-out
    form took a fraction of `LOG_SOFTMAX`'s time (`benchmarks/litert_log_softmax.py`, retired at 85b63ac).
    LiteRT's searches use it where their vocabulary is not cut into blocks
    (`LiteRTDecoding.top_log_probs`).
    The converter recognises `(logits - m) - log(sum(exp(logits - m)))` as
    `LOG_SOFTMAX` and fuses it back; this order of operations it leaves.
    """
    largest = tf.reduce_max(logits, axis=-1, keepdims=True)
    log_total = largest + tf.math.log(tf.reduce_sum(tf.exp(logits - largest), axis=-1, keepdims=True))
    return logits - log_total
