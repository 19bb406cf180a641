"""Beam search's reads of the settled cache in LiteRT: matrix products per sentence against a gather, multiply, sum.

    python benchmarks/litert_settled_attention.py [--positions 24 40 56] [--sentences 16] [--beams 4]
        [--heads 8] [--head-dim 64] [--layers 6] [--threads 2]

At a step of the LiteRT file's beam search, each row attends to the settled
keys and values of its own history, which its sentence's rows hold
(`layers.cached_attention`, "a cache in two parts"). Four small float32
LiteRT files compute that part of a step for every layer (the settled
positions only, on numbers copied in once), each in one form:

- `gather, multiply, sum`: the file's form until 0f723a8. The rows are
  gathered by their offsets (`GATHER`, which runs on one core), then each
  query multiplies its keys and the weights its values (`MUL` and `SUM`, in
  XNNPACK).
- `a product per sentence and head, cache on the right`: a sentence's
  beams' queries against all of its rows' keys in one `BATCH_MATMUL`, the
  other rows' positions masked: no gather, four times the products, and
  XNNPACK packs the cache as a matrix first. Keys and values are kept as
  `(sentences, heads, beams x positions, head_dim)`.
- `the same, values with their positions last`: the file's form (its
  values keep the layout of the chunk's part, which sums over positions
  last).
- `a product per sentence and head, cache on the left`: the same products
  with the cache as the left operand (nothing to pack), the few queries on
  the right (a kernel made for wide matrices, mostly idle).

Prints one JSON line per form and position count: milliseconds per step
(the median of 7 alternating rounds of 30 calls, `measure.alternating_rounds`),
the ratio to the gather's form, and the largest difference from its outputs.
"""

import argparse
import json
import os
import statistics
import tempfile

import numpy as np

from measure import alternating_rounds

ROUNDS, CALLS = 7, 30
FORMS = ("gather, multiply, sum", "a product per sentence and head, cache on the right",
         "the same, values with their positions last", "a product per sentence and head, cache on the left")


def step_functions(sentences, beams, positions, layers):
    """`{form: function(offsets, queries, *keys_then_values) -> (rows, heads, head_dim)}`."""
    import tensorflow as tf

    rows = sentences * beams

    def by_gather(offsets, queries, *cache):
        keys, values = cache[:layers], cache[layers:]  # (rows, heads, positions, head_dim), (rows, heads, head_dim, positions)
        read = tf.range(rows) + offsets
        attended = []
        for layer in range(layers):
            layer_keys, layer_values = tf.gather(keys[layer], read), tf.gather(values[layer], read)
            weights = tf.nn.softmax(tf.reduce_sum(layer_keys * queries[layer], -1)[:, :, None, :], -1)
            attended.append(tf.reduce_sum(layer_values * weights, -1))
        return tf.add_n(attended)

    def masked_logit_bias(offsets):
        """0 where a beam's query meets its own settled row's positions, -1e9 at its sentence's other rows'."""
        continued = tf.reshape(tf.range(rows) + offsets, (sentences, beams)) % beams
        row_of_position = tf.range(beams * positions) // positions
        return tf.where(row_of_position[None, None, :] == continued[:, :, None], 0.0, -1e9)[:, None]

    def per_sentence_queries(queries):  # (rows, heads, 1, head_dim) -> (sentences, heads, beams, head_dim)
        return tf.transpose(tf.reshape(queries, (sentences, beams, -1, queries.shape[-1])), (0, 2, 1, 3))

    def per_row(attended):  # (sentences, heads, beams, head_dim) -> (rows, heads, head_dim)
        return tf.reshape(tf.transpose(attended, (0, 2, 1, 3)), (rows, attended.shape[1], attended.shape[3]))

    def cache_on_the_right(offsets, queries, *cache):
        keys, values = cache[:layers], cache[layers:]  # each (sentences, heads, beams x positions, head_dim)
        bias = masked_logit_bias(offsets)
        attended = []
        for layer in range(layers):
            logits = tf.matmul(per_sentence_queries(queries[layer]), keys[layer], transpose_b=True) + bias
            attended.append(per_row(tf.matmul(tf.nn.softmax(logits, -1), values[layer])))
        return tf.add_n(attended)

    def values_positions_last(offsets, queries, *cache):
        keys, values = cache[:layers], cache[layers:]  # values (…, head_dim, beams x positions)
        bias = masked_logit_bias(offsets)
        attended = []
        for layer in range(layers):
            logits = tf.matmul(per_sentence_queries(queries[layer]), keys[layer], transpose_b=True) + bias
            attended.append(per_row(tf.matmul(tf.nn.softmax(logits, -1), values[layer], transpose_b=True)))
        return tf.add_n(attended)

    def cache_on_the_left(offsets, queries, *cache):
        keys, values = cache[:layers], cache[layers:]  # (…, beams x positions, head_dim), (…, head_dim, beams x positions)
        bias = masked_logit_bias(offsets)
        attended = []
        for layer in range(layers):
            logits = tf.matmul(keys[layer], per_sentence_queries(queries[layer]), transpose_b=True)
            weights = tf.nn.softmax(tf.transpose(logits, (0, 1, 3, 2)) + bias, -1)
            attended.append(per_row(tf.transpose(tf.matmul(values[layer], weights, transpose_b=True), (0, 1, 3, 2))))
        return tf.add_n(attended)

    return dict(zip(FORMS, (by_gather, cache_on_the_right, values_positions_last, cache_on_the_left)))


def inputs(sentences, beams, positions, heads, head_dim, layers):
    """`{form: [offsets, queries, *keys, *values]}`: the same numbers in each form's layout."""
    generator = np.random.default_rng(0)
    rows = sentences * beams
    continued = generator.integers(0, beams, size=(sentences, beams))  # the row each beam continues
    offsets = (continued - np.arange(beams)).reshape(rows).astype(np.int32)
    queries = generator.normal(size=(layers, rows, heads, 1, head_dim)).astype(np.float32) * 0.1
    keys = generator.normal(size=(layers, rows, heads, positions, head_dim)).astype(np.float32)
    values = generator.normal(size=(layers, rows, heads, positions, head_dim)).astype(np.float32)

    def per_sentence(cache):  # (rows, heads, positions, head_dim) -> (sentences, heads, beams x positions, head_dim)
        return (cache.reshape(sentences, beams, heads, positions, head_dim).transpose(0, 2, 1, 3, 4)
                .reshape(sentences, heads, beams * positions, head_dim))

    positions_last = lambda cache: np.ascontiguousarray(np.swapaxes(cache, -1, -2))  # noqa: E731
    return {
        FORMS[0]: [offsets, queries, *keys, *(positions_last(layer) for layer in values)],
        FORMS[1]: [offsets, queries, *(per_sentence(layer) for layer in keys),
                   *(per_sentence(layer) for layer in values)],
        FORMS[2]: [offsets, queries, *(per_sentence(layer) for layer in keys),
                   *(positions_last(per_sentence(layer)) for layer in values)],
        FORMS[3]: [offsets, queries, *(per_sentence(layer) for layer in keys),
                   *(positions_last(per_sentence(layer)) for layer in values)],
    }


def input_names(layers):
    """The files' inputs, in the functions' order: each named, so that the interpreter's are matched by name."""
    return ["offsets", "queries", *(f"keys_{layer}" for layer in range(layers)),
            *(f"values_{layer}" for layer in range(layers))]


def convert(function, arrays, names, path):
    import tensorflow as tf

    signature = [tf.TensorSpec(array.shape, tf.as_dtype(array.dtype), name=name) for array, name in zip(arrays, names)]
    traced = tf.function(function, input_signature=signature)
    converter = tf.lite.TFLiteConverter.from_concrete_functions([traced.get_concrete_function()], traced)
    with open(path, "wb") as file:
        file.write(converter.convert())


def interpreter_job(path, arrays, names, threads, calls):
    """`job()` that invokes the file `calls` times on `arrays`, copied in once, and returns its output."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=path, num_threads=threads)
    interpreter.allocate_tensors()
    # The converter names an input after its argument, with a prefix and a ":0" at most.
    by_name = {detail["name"].split(":")[0].rsplit("serving_default_", 1)[-1]: detail
               for detail in interpreter.get_input_details()}
    for name, array in zip(names, arrays):
        if name not in by_name:
            raise SystemExit(f"{path}: no input named {name} (it has {sorted(by_name)})")
        interpreter.set_tensor(by_name[name]["index"], array)
    output = interpreter.get_output_details()[0]["index"]

    def job():
        for _ in range(calls):
            interpreter.invoke()
        return interpreter.get_tensor(output)

    return job


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, nargs="+", default=[24, 40, 56])
    parser.add_argument("--sentences", type=int, default=16)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        for positions in args.positions:
            functions = step_functions(args.sentences, args.beams, positions, args.layers)
            arrays = inputs(args.sentences, args.beams, positions, args.heads, args.head_dim, args.layers)
            names, jobs = input_names(args.layers), {}
            for index, form in enumerate(FORMS):
                path = os.path.join(directory, f"form{index}-{positions}.tflite")
                convert(functions[form], arrays[form], names, path)
                jobs[form] = interpreter_job(path, arrays[form], names, args.threads, CALLS)
            first = {form: job() for form, job in jobs.items()}  # untimed: the first invocations prepare
            seconds, _ = alternating_rounds(jobs, ROUNDS)
            milliseconds = {form: statistics.median(values) / CALLS * 1e3 for form, values in seconds.items()}
            for form in FORMS:
                print(json.dumps({
                    "positions": positions, "rows": args.sentences * args.beams, "layers": args.layers,
                    "form": form, "ms_per_step": round(milliseconds[form], 3),
                    "ratio_to_the_gather": round(milliseconds[form] / milliseconds[FORMS[0]], 3),
                    "largest_difference": float(np.abs(first[form] - first[FORMS[0]]).max()),
                }), flush=True)


if __name__ == "__main__":
    main()
