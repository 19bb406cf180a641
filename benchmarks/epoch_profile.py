"""Where one epoch of the Multi30k recipe spends its time: steps, validation, each callback, the gaps.

    python benchmarks/epoch_profile.py [--epochs 2]

Trains the recipe (`examples/translate_multi30k.py`) on a fresh run directory
for `--epochs` epochs, as `keras-transformer train` does, with every
callback's `on_epoch_begin` and `on_epoch_end` timed and two clocks around
them: one first in the list (the epoch's start, the first batch, the start
and end of validation) and one last (the epoch's end). Prints one JSON line:
for each phase, its seconds in each epoch. The first epoch holds the
tracing; the second is the steady epoch BENCHMARKS.md breaks down.
"""

import argparse
import collections
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))


def phase_clocks(seconds):
    """Two Keras callbacks, (first, last), that add each epoch's phases to `seconds` (name -> list)."""
    import keras

    marks = {}

    class First(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            marks["begin"] = time.perf_counter()

        def on_train_batch_begin(self, batch, logs=None):
            if batch == 0:
                seconds["start to first batch"].append(time.perf_counter() - marks["begin"])
                marks["first begin"] = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if batch == 0:
                seconds["first batch"].append(now - marks["first begin"])
                marks["first end"] = now
            marks["last end"], marks["batches"] = now, batch + 1

        def on_test_begin(self, logs=None):
            marks["test begin"] = time.perf_counter()
            seconds["other batches"].append(marks["last end"] - marks["first end"])
            seconds["seconds per other batch"].append(
                (marks["last end"] - marks["first end"]) / max(1, marks["batches"] - 1)
            )

        def on_test_end(self, logs=None):
            seconds["validation"].append(time.perf_counter() - marks["test begin"])

    class Last(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seconds["whole epoch"].append(time.perf_counter() - marks["begin"])

    return First(), Last()


def timed(callback, hook, seconds):
    """Wrap `callback`'s `hook` so that its seconds go to `seconds["<hook> <class name>"]`."""
    original = getattr(callback, hook)
    name = f"{hook[3:]} {type(callback).__name__}"

    def wrapper(epoch, logs=None):
        started = time.perf_counter()
        original(epoch, logs)
        seconds[name].append(time.perf_counter() - started)

    setattr(callback, hook, wrapper)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    arguments = parser.parse_args()

    from keras_transformer.runs import fitting, options, translation
    from translate_multi30k import RECIPE

    seconds = collections.defaultdict(list)
    plain_fit = fitting.fit

    def profiled_fit(model, run_dir, state, train_dataset, fit_arguments, callbacks):
        for callback in callbacks:
            for hook in ("on_epoch_begin", "on_epoch_end"):
                timed(callback, hook, seconds)
        first, last = phase_clocks(seconds)
        return plain_fit(model, run_dir, state, train_dataset, fit_arguments, [first, *callbacks, last])

    fitting.fit = profiled_fit  # the one place every task's training goes through
    config = options.merge_config(options.DEFAULTS[options.TRANSLATION], RECIPE)
    config["training"]["epochs"] = arguments.epochs
    work = tempfile.mkdtemp(prefix="epoch-profile-")
    try:
        translation.train(config, os.path.join(work, "run"), verbose=0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({name: [round(value, 3) for value in values] for name, values in seconds.items()}))


if __name__ == "__main__":
    main()
