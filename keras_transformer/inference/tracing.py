"""Tracing our TensorFlow functions into graphs, without AutoGraph.

By default `tf.function` first runs AutoGraph, which rewrites the Python
source of the function and of everything it calls (Keras' layers included),
so that `if` and `for` over tensors become graph control flow. Our code has
nothing for it to rewrite: the searches loop with `tf.while_loop` and branch
with `tf.where`/`tf.cond`, and the layers, which also run on JAX and PyTorch,
branch on Python values only. The rewrite is then pure cost, paid once per
process: 8 of the 21 seconds `keras-transformer export` took on the demo run.
"""

import functools

import tensorflow as tf

# Use as `tf.function`: `@graph_function(input_signature=[...])` or `graph_function(fn)`.
graph_function = functools.partial(tf.function, autograph=False)
