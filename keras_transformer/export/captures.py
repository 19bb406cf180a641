"""Naming what an export's functions read from outside: the weights, by their paths.

A traced function takes what it reads from outside (the model's weights,
the tokenizers' WordPiece models) as captured inputs, which a SavedModel
keeps by name. `call_naming_captures` gives them readable names before
TensorFlow invents some (see its docstring); every export with a decoding
loop uses it.
"""

import re

import tensorflow as tf


def capture_names(model):
    """`{id(weight tensor): name}` for `call_naming_captures`: each weight under its Keras path."""
    return {id(variable.value.handle): identifier(variable.path) for variable in model.variables}


def call_naming_captures(function, names, *args):
    """`function(*args)` (a `tf.function`) from the function being traced, after naming what it reads.

    A traced function takes what it reads from outside (the model's weights,
    the tokenizers' WordPiece models) as extra, captured inputs. Saving a
    signature renames each captured input whose name is not already its
    argument name in the graph (a lowercase identifier at the top of the
    graph), and logs every one it renamed. Left alone, the inputs `function`
    captured come in under running numbers ("4935, 4937, ...": two screens
    of log for this model), and a weight read inside a layer as "resource"
    in the layer's name scope. Captured here first, at the top of the graph,
    under the weights' paths (`names`, by the tensor's `id`) or
    "captured_<n>", they are saved under those names, and the call below
    reuses these captures.
    """
    concrete = function.get_concrete_function(*args)
    graph = tf.compat.v1.get_default_graph()  # the FuncGraph of the function being traced
    for tensor in concrete.captured_inputs:
        graph.capture(tensor, name=names.get(id(tensor)) or f"captured_{len(graph.inputs)}")
    return concrete(*args)


def identifier(path):
    """`path` as a SavedModel keeps an input name: lowercase letters, digits and "_", a letter first."""
    name = re.sub(r"[^a-z0-9_]", "_", path.lower())
    return name if name[:1].isalpha() else f"v_{name}"
