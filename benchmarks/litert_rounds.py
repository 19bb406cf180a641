"""LiteRT translation files alternating in one process: sentences/s per round, and whether they translate alike.

    python benchmarks/litert_rounds.py BEFORE_DIR AFTER_DIR [--batch-size 32] [--per-run N] [--sentences 64]
        [--rounds 4] [--texts FILE] [--threads 2]

Two exports of the same run, one change apart, are best compared here: each
round times every file on the same sentences one after the other, so that a
machine that slows down or speeds up between runs moves them alike. The
first file's translations are the reference the others are counted against
(a change that should translate alike must give all of them).

`--batch-size` is the batch each `LiteRTModel.translate` call gets; the
runner gives the file at most the export's `sentences_per_run` of them at
once, or `--per-run`'s; `--texts` a file of one sentence a line (default:
Multi30k's English validation side, from the shared data).
"""

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exports", nargs="+", help="LiteRT export directories")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--per-run", type=int, help="sentences a run of the file (default: the export's)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--texts", help="one sentence a line (default: Multi30k's English validation side)")
    arguments = parser.parse_args()

    sys.argv = ["keras-transformer"]  # as the command starts: no TensorFlow
    from keras_transformer.on_device import LiteRTModel

    path = arguments.texts
    if path is None:
        data = os.environ.get("KERAS_TRANSFORMER_DATA", os.path.join(HERE, "..", "..", "shared", "data"))
        path = os.path.join(data, "multi30k", "val.en")
    with open(path, encoding="utf-8") as file:
        texts = [line.rstrip("\n") for line in file][:arguments.sentences]
    models = [LiteRTModel(directory, num_threads=arguments.threads) for directory in arguments.exports]
    for model in models:
        model.translate(texts[:1])
    rates = {directory: [] for directory in arguments.exports}
    translations = {}
    for _ in range(arguments.rounds):
        for directory, model in zip(arguments.exports, models):
            start = time.perf_counter()
            translations[directory] = [text for first in range(0, len(texts), arguments.batch_size)
                                       for text in model.translate(texts[first:first + arguments.batch_size],
                                                                   batch_size=arguments.per_run)]
            rates[directory].append(len(texts) / (time.perf_counter() - start))
    reference = translations[arguments.exports[0]]
    for directory in arguments.exports:
        same = sum(a == b for a, b in zip(reference, translations[directory]))
        print(f"{directory}: median {statistics.median(rates[directory]):.2f} sentences/s "
              f"({', '.join(f'{rate:.2f}' for rate in rates[directory])}); "
              f"{same}/{len(texts)} translations as the first")


if __name__ == "__main__":
    main()
