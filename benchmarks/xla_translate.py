"""Does XLA make a real translation job faster? The run's validation set, end to end, with and without.

    python benchmarks/xla_translate.py RUN_DIR [--beam-size 1] [--pad-to 16]

`make bench` decodes fixed 32 x 32 batches, where XLA speeds our cached
greedy search up 1.47x. A user's job is not one shape: `evaluate` and
`translate` send batches of 64 sentences whose source lengths differ from
batch to batch, and XLA compiles the search again for every new shape. This
script translates the run's validation sources with the run's `Translator`,
in batches of 64, twice each way:

* plain: the search as the translator runs it (a TensorFlow graph);
* xla: the same search inside `tf.function(jit_compile=True)`, each batch's
  source padded to a multiple of `--pad-to` ids (padding is masked, and it
  bounds the number of shapes XLA compiles for).

It prints, per way, the first pass (tracing and compiling included: what one
`evaluate` costs), the second (steady state) and the share of translations
that agree. BENCHMARKS.md has the figures and what they decided.
"""

import argparse
import functools
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def padded(search, multiple):
    """`search` with each batch's source padded to a multiple of `multiple` ids."""
    import tensorflow as tf

    def search_padded(source_ids):
        length = tf.shape(source_ids)[1]
        return search(tf.pad(source_ids, [[0, 0], [0, (length + multiple - 1) // multiple * multiple - length]]))

    return search_padded


def timed_passes(translator, sources, batch_size):
    """`(first pass seconds, second pass seconds, translations)`."""
    started = time.perf_counter()
    translator.translate(sources, batch_size=batch_size)
    first = time.perf_counter() - started
    started = time.perf_counter()
    translations = translator.translate(sources, batch_size=batch_size)
    return first, time.perf_counter() - started, translations


def main():
    import tensorflow as tf

    from keras_transformer.runs import translation

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--beam-size", type=int, default=1)
    parser.add_argument("--pad-to", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=64)
    arguments = parser.parse_args()

    config = translation.load_config(arguments.run_dir)
    sources = [source for source, _ in translation.load_pairs(config["data"], splits=("val",))["val"]]
    results = {"sentences": len(sources), "beam_size": arguments.beam_size, "batch_size": arguments.batch_size}
    outputs = {}
    for way in ("plain", "xla"):
        translator = translation.load_translator(arguments.run_dir, beam_size=arguments.beam_size)
        if way == "xla":
            # XLA needs fixed shapes: the cache gets all its room at once and finished sentences stay.
            fixed_room_search = functools.partial(translator.search, static_shapes=True)
            translator.search = padded(tf.function(fixed_room_search, jit_compile=True), arguments.pad_to)
        first, second, outputs[way] = timed_passes(translator, sources, arguments.batch_size)
        results[way] = {"first_pass_s": round(first, 1), "second_pass_s": round(second, 1),
                        "sentences_per_s": round(len(sources) / second, 1)}
    results["xla_over_plain"] = round(results["xla"]["sentences_per_s"] / results["plain"]["sentences_per_s"], 2)
    results["same_translation"] = round(sum(a == b for a, b in zip(outputs["plain"], outputs["xla"])) / len(sources), 3)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
