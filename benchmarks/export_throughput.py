"""Translation throughput: the exported SavedModel against the in-process translator.

    python benchmarks/export_throughput.py RUN_DIR [--sentences 256] [--batch-size 32] [--beam-size 4]

Exports the run (same beam settings as the in-process `Translator`), loads the
export the way a server does, and translates the first N validation sentences
in batches through both, alternating the two in each round so that machine
noise hits both alike. Prints sentences/s for each (median of the rounds) and
their ratio, as a Markdown table row, and checks that both give the same
translations.
"""

import argparse
import functools
import os
import platform
import statistics
import tempfile

import tensorflow as tf

from keras_transformer.runs import translation
from keras_transformer.export import export_translator, load_export
from measure import alternating_rounds


def translate_all(translate, sentences, batch_size):
    translations = []
    for start in range(0, len(sentences), batch_size):
        batch = tf.constant(sentences[start : start + batch_size], tf.string)
        translations.extend(translate(batch)["translation"].numpy())
    return translations


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()

    config = translation.load_config(arguments.run_dir)
    sources = [source for source, _ in translation.load_pairs(config["data"], splits=("val",))["val"]]
    sentences = sources[: arguments.sentences]
    translator = translation.load_translator(arguments.run_dir, beam_size=arguments.beam_size)
    with tempfile.TemporaryDirectory() as directory:
        served = load_export(export_translator(translator, os.path.join(directory, "export")))
        serve = served.signatures["serving_default"]
        contenders = {"in-process Translator": translator, "exported SavedModel": lambda text: serve(text=text)}
        # One batch each first: tracing and loading are not throughput.
        for translate in contenders.values():
            translate_all(translate, sentences[: arguments.batch_size], arguments.batch_size)
        jobs = {name: functools.partial(translate_all, translate, sentences, arguments.batch_size)
                for name, translate in contenders.items()}
        seconds, outputs = alternating_rounds(jobs, arguments.rounds)

    same = outputs["in-process Translator"] == outputs["exported SavedModel"]
    rates = {name: len(sentences) / statistics.median(values) for name, values in seconds.items()}
    ratio = rates["exported SavedModel"] / rates["in-process Translator"]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, TensorFlow {tf.__version__}")
    print("| what | sentences/s (median of rounds) | rounds (s) |")
    print("|---|---|---|")
    for name, rate in rates.items():
        print(f"| {name} | {rate:.1f} | {', '.join(f'{value:.1f}' for value in seconds[name])} |")
    print(
        f"\n{len(sentences)} validation sentences, batches of {arguments.batch_size}, beam {arguments.beam_size}: "
        f"export / in-process = {ratio:.2f}; identical translations: {same}"
    )


if __name__ == "__main__":
    main()
