"""What a graph traced for LiteRT does differently (`tracing_for_litert`), and why.

`export.litert` traces the searches and the model again for the LiteRT file.
Within `tracing_for_litert()` two pieces of code trace otherwise than for
TensorFlow; the translations are the same:

- a cache write is one `DYNAMIC_UPDATE_SLICE` (`layers.cached_attention.write_cache`).
  LiteRT has neither TensorFlow's strided-slice update nor its scatter
  update among its builtin operators; this one writes a block at a position
  known only at run time. It comes from XLA's op set, so TensorFlow itself
  cannot run it outside XLA: only a graph that is converted, never run, is
  traced this way. A self-attention cache in two parts, which LiteRT's searches
  decode on (`layers.cached_attention.settle_recent`), is written this way
  too, and refused outside `tracing_for_litert()`.
- the searches' candidates (`inference.search.top_log_probs`) come from the
  logits cut into blocks: a top-k over the blocks with the largest maxima,
  and a log-softmax normaliser spelled out as a maximum, an exponential, a
  sum and a logarithm, operators that LiteRT hands to XNNPACK, instead of
  LiteRT's own `LOG_SOFTMAX` kernel and a top-k over the whole vocabulary
  (a vocabulary too small for blocks to pay, or of a size with no divisor
  to cut it by, keeps the log-softmax, spelled out so, and that top-k).
  The same candidates; the scores may differ from TensorFlow's in their
  last bits.
"""

import contextlib
import contextvars

_TRACING_FOR_LITERT = contextvars.ContextVar("tracing_for_litert", default=False)


@contextlib.contextmanager
def tracing_for_litert():
    """Within it, our code traces its graphs for LiteRT (see the module's docstring)."""
    token = _TRACING_FOR_LITERT.set(True)
    try:
        yield
    finally:
        _TRACING_FOR_LITERT.reset(token)


def traced_for_litert():
    """Whether the graph being traced is for LiteRT (within `tracing_for_litert`)."""
    return _TRACING_FOR_LITERT.get()
