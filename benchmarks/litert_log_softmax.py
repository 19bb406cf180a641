"""Why the LiteRT file spells its log-softmax out: LiteRT's `LOG_SOFTMAX` against the same from XNNPACK's operators.

    python benchmarks/litert_log_softmax.py [--rows 1 4 32] [--vocab 58101] [--threads 2]

Three small int8 LiteRT files, each the output projection of a decoding step
(a `(rows, 512)` by `(512, vocab)` product, dynamic-range int8, with a bias)
and what follows it in the searches:

- `projection`: the product alone;
- `LOG_SOFTMAX`: then TensorFlow's `tf.nn.log_softmax`, which the converter
  makes LiteRT's own kernel;
- `spelled out`: then `inference.search.log_softmax` as traced for LiteRT
  (a maximum, an exponential, a sum and a logarithm, which LiteRT hands to
  XNNPACK).

Prints one JSON line per file and row count: milliseconds per call (the
median of 7 alternating rounds of 50 calls, `measure.alternating_rounds`) and, for the two log-softmaxes, the
milliseconds they add to the product. A LOG_SOFTMAX kernel timed alone, on
numbers copied in, is the fourth line: it shows what the kernel costs when
XNNPACK's AVX-512 product does not run just before it.
"""

import argparse
import json
import os
import statistics
import tempfile

import numpy as np

from measure import alternating_rounds

ROUNDS, CALLS = 7, 50


def convert(function, rows, width, path, quantize=True):
    import tensorflow as tf

    traced = tf.function(function, input_signature=[tf.TensorSpec([rows, width], tf.float32)])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([traced.get_concrete_function()], traced)
    if quantize:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    with open(path, "wb") as file:
        file.write(converter.convert())


def files(directory, rows, vocab, d_model=512):
    import tensorflow as tf

    from keras_transformer.inference.search import log_softmax
    from keras_transformer.litert_tracing import tracing_for_litert

    generator = np.random.default_rng(0)
    kernel = tf.constant(generator.normal(size=(d_model, vocab)).astype(np.float32) * 0.05)
    bias = tf.constant(generator.normal(size=(vocab,)).astype(np.float32))
    paths = {name: os.path.join(directory, f"{name.replace(' ', '_')}-{rows}.tflite")
             for name in ("projection", "LOG_SOFTMAX", "spelled out", "LOG_SOFTMAX alone")}
    convert(lambda rows_in: tf.matmul(rows_in, kernel) + bias, rows, d_model, paths["projection"])
    convert(lambda rows_in: tf.nn.log_softmax(tf.matmul(rows_in, kernel) + bias), rows, d_model, paths["LOG_SOFTMAX"])
    with tracing_for_litert():
        convert(lambda rows_in: log_softmax(tf.matmul(rows_in, kernel) + bias), rows, d_model, paths["spelled out"])
    convert(tf.nn.log_softmax, rows, vocab, paths["LOG_SOFTMAX alone"], quantize=False)
    return paths


def interpreter_job(path, threads, calls):
    """`job()` that invokes the file `calls` times on fixed normal numbers (`measure.alternating_rounds`)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=path, num_threads=threads)
    interpreter.allocate_tensors()
    detail = interpreter.get_input_details()[0]
    interpreter.set_tensor(detail["index"], np.random.default_rng(1).normal(size=detail["shape"]).astype(np.float32))

    def job():
        for _ in range(calls):
            interpreter.invoke()

    return job


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 32])
    parser.add_argument("--vocab", type=int, default=58101)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        for rows in args.rows:
            paths = files(directory, rows, args.vocab)
            jobs = {name: interpreter_job(path, args.threads, CALLS) for name, path in paths.items()}
            for job in jobs.values():
                job()  # untimed: the first invocations prepare and pack
            seconds, _ = alternating_rounds(jobs, ROUNDS)
            milliseconds = {name: statistics.median(values) / CALLS * 1e3 for name, values in seconds.items()}
            for name, value in milliseconds.items():
                line = {"rows": rows, "vocab": args.vocab, "file": name, "ms_per_call": round(value, 3)}
                if name in ("LOG_SOFTMAX", "spelled out"):
                    line["ms_after_the_product"] = round(value - milliseconds["projection"], 3)
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
