"""How a runtime runs the searches: its cache, its cache writes, its candidates' arithmetic, its loop.

The searches (`search.py`) are the paper's wherever they run; how they run
fastest is the runtime's business. `Decoding` says it, and is handed
explicitly to `steps.transformer_search` (and from there to the searches
and to every decoding step of the model); nothing reads it from anywhere
else. This one is TensorFlow's, and the default:

- the self-attention cache is the layers' `(keys, values)` pair, with room
  for `INITIAL_CACHE_ROOM` positions at first, doubled when full
  (`steps.grow_cache`);
- a step writes its keys and values with TensorFlow's in-place slice update
  (`write_in_place`) in a graph, or with the layers' scatter under XLA
  (`Decoding(in_place=False)`: XLA compiles a slice update only for bounds
  it knows when compiling, and the step's index is data);
- the candidates are `search.top_log_probs`'s, one loop runs every step.

Another runtime brings its own subclass: LiteRT's decodes in chunks of
steps on a cache in two parts, with a top-k cut into blocks
(`export.litert.decoding`).
"""

import tensorflow as tf

from keras_transformer.inference.search import top_log_probs
from keras_transformer.layers.cached_attention import KeyValueCache, write_as_scatter

# Output positions a translation's self-attention cache has room for at first.
INITIAL_CACHE_ROOM = 16


def write_in_place(cached, new, cache_index):
    """One cache tensor with `new` written at `cache_index`: one slice update, in place where nothing else holds it.

    TensorFlow's scatter (`TensorScatterUpdate`) copies its whole input
    before writing, even where nothing else reads it: every layer's cache,
    at every decoding step. Its strided-slice update writes into its input
    whenever it holds the only reference, as a decoding step's cache inside
    a `tf.function` does (eagerly the caller still holds it, and it is
    copied as before).
    """
    rows, heads, length, head_dim = tf.unstack(tf.shape(cached))
    new_length = tf.shape(new)[2]
    cache_index = tf.cast(cache_index, head_dim.dtype)
    # Seen as one line of length * head_dim values per (row, head), the
    # new positions are one block of columns: a two-axis slice, the cheapest
    # for TensorFlow's slice kernel to address.
    lines = rows * heads
    new_columns = tf.reshape(new, tf.stack([lines, new_length * head_dim]))
    written = tf.raw_ops.TensorStridedSliceUpdate(
        input=tf.reshape(cached, tf.stack([lines, length * head_dim])),
        begin=tf.stack([0, cache_index * head_dim]),
        end=tf.stack([lines, (cache_index + new_length) * head_dim]),
        strides=[1, 1],
        value=new_columns,
    )
    return tf.reshape(written, tf.shape(cached))


class Decoding:
    """TensorFlow's way to run the searches (the module docstring); a runtime's own subclasses it.

    Args:
        in_place: write the cache with `write_in_place` (a graph without
            XLA); False: the layers' scatter (XLA's `jit_compile`).
    """

    def __init__(self, in_place=True):
        self.in_place = in_place

    def cache_policy(self, rows_per_source):
        """The `KeyValueCache` every decoding step is handed, for a search of `rows_per_source` rows a sentence."""
        return KeyValueCache(write_in_place if self.in_place else write_as_scatter)

    def cache_room(self, max_length, growing):
        """The positions the cache has room for at first, and whether a step doubles it when full (`growing`)."""
        if not growing:
            return max_length, False
        return tf.minimum(INITIAL_CACHE_ROOM, max_length), True

    def initial_cache(self, cache, rows_per_source):
        """The search's cache from the model's (one row a sentence): each row repeated for the sentence's rows."""
        if rows_per_source == 1:
            return cache
        return [tuple(tf.repeat(cached, rows_per_source, axis=0) for cached in layer) for layer in cache]

    def chunks(self, rows_per_source):
        """A `loops.Chunks` where the searches run in chunks of steps; None: one loop over every step."""
        return None

    def top_log_probs(self, logits, k, rules):
        """Each row's `k` best next tokens (`search.top_log_probs`)."""
        return top_log_probs(logits, k, rules)


# Where the searches run on XLA: fixed shapes, scattered writes.
FIXED_SHAPES = Decoding(in_place=False)
