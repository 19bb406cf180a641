"""Training on real Multi30k batches against fixed-shape batches: what the real job costs over the benchmark.

    python benchmarks/real_data.py [--steps 100] [--skip-epoch]

The Multi30k recipe's model (`examples/translate_multi30k.py`: the "small"
preset, one shared 10,000-token vocabulary, tied embeddings, dropout 0.3,
mixed bfloat16), compiled as `keras-transformer train` compiles it (the
paper's Adam and schedule, label-smoothed loss, accuracy and perplexity),
trains three ways, each in this one process, one after the other:

1. fixed: random ids in fixed 64 x 32 x 32 batches (the `make bench` row's
   shapes), target tokens per second in steady state;
2. real: the recipe's own batches (`data.make_translation_batches`: length
   buckets under a 3,072-token budget, shuffled per epoch), real target
   tokens per second (padding not counted) in steady state;
3. epoch: `keras-transformer train` for two epochs on a fresh run
   directory, timed from the first epoch's row in `history.csv` to the
   second's: one whole epoch in steady state (its steps, validation, the
   best checkpoint, and the end-of-epoch work of the epoch before: the
   backup, the attention and BLEU callbacks), real target tokens of the
   epoch over that time. The first epoch's tracing and the end of training
   (the heatmap grids) are one-off costs outside it.

Steady state: `--steps` steps after 20 warm-up steps (tracing). Prints one
JSON line with the rates, the ratios the issue's goals are stated in
(real / fixed >= 0.85, epoch / fixed >= 0.75) and what the real batches
are made of (distinct shapes, padding share). BENCHMARKS.md has the figures.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

WARMUP_STEPS = 20


def step_clock():
    """A Keras callback timing the steps after the first `WARMUP_STEPS` (its `seconds`)."""
    import keras

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == WARMUP_STEPS - 1:
                self.started = time.perf_counter()

        def on_train_end(self, logs=None):
            self.seconds = time.perf_counter() - self.started

    return Clock()


def recipe_config():
    from keras_transformer.runs import options
    from translate_multi30k import RECIPE

    return options.merge_config(options.DEFAULTS[options.TRANSLATION], RECIPE)


def build(config, vocab_size):
    from keras_transformer import training
    from keras_transformer.runs import translation

    training.set_precision(config["training"]["precision"])
    model = translation.build_model(config, vocab_size, vocab_size)
    translation.compile_model(model, config["training"])
    return model


def fixed_rate(config, vocab_size, steps):
    import tensorflow as tf

    model = build(config, vocab_size)
    rng = np.random.default_rng(0)
    batch, length = 64, 32
    source = rng.integers(4, vocab_size, (batch, length)).astype("int32")
    target = rng.integers(4, vocab_size, (batch, length + 1)).astype("int32")
    dataset = tf.data.Dataset.from_tensors(((source, target[:, :-1]), target[:, 1:])).repeat()
    clock = step_clock()
    model.fit(dataset, steps_per_epoch=WARMUP_STEPS + steps, epochs=1, verbose=0, callbacks=[clock])
    return batch * length * steps / clock.seconds


def real_rate(config, pairs, tokenizer, steps):
    from keras_transformer import data

    settings = config["training"]
    batches = data.make_translation_batches(
        pairs, tokenizer, tokenizer, data.Batching(settings["max_length"], tokens_per_batch=settings["tokens_per_batch"]),
        shuffle=True, seed=settings["seed"],
    )
    # The batches fit will see (the order is the epoch's: epoch 0), counted first.
    shapes, real_tokens, padded_tokens = set(), [], []
    for (source, target_in), target_out in batches.dataset.take(WARMUP_STEPS + steps):
        shapes.add((tuple(source.shape), tuple(target_out.shape)))
        real_tokens.append(int(np.count_nonzero(target_out.numpy())))
        padded_tokens.append(int(np.prod(target_out.shape)))
    batches.epoch.assign(0)
    model = build(config, tokenizer.vocab_size)
    clock = step_clock()
    model.fit(batches.dataset.repeat(), steps_per_epoch=WARMUP_STEPS + steps, epochs=1, verbose=0, callbacks=[clock])
    measured = real_tokens[WARMUP_STEPS:]
    return {
        "rate": sum(measured) / clock.seconds,
        "distinct_shapes": len(shapes),
        "padding_share": 1 - sum(real_tokens) / sum(padded_tokens),
        "batches_per_epoch": batches.num_batches,
    }


def steady_epoch_seconds(config, run_dir):
    """Seconds from the first epoch's history row to the second's, in a two-epoch `train`."""
    from keras_transformer.runs import run_dir as runs
    from keras_transformer.runs import translation

    two_epochs = json.loads(json.dumps(config))
    two_epochs["training"]["epochs"] = 2
    history, rows_seen_at, done = runs.path(run_dir, runs.HISTORY), {}, threading.Event()

    def watch():  # the row is written (CSVLogger) when the epoch's end reaches it
        while not done.is_set():
            if os.path.exists(history):
                with open(history, encoding="utf-8") as file:
                    rows = max(0, sum(1 for _ in file) - 1)
                rows_seen_at.setdefault(rows, time.perf_counter())
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        translation.train(two_epochs, run_dir, verbose=0)
    finally:
        done.set()
        watcher.join()
    return rows_seen_at[2] - rows_seen_at[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--skip-epoch", action="store_true", help="only the steady-state rows")
    arguments = parser.parse_args()

    from keras_transformer.runs import translation

    work = tempfile.mkdtemp(prefix="real-data-bench-")
    try:
        config, run_dir = recipe_config(), os.path.join(work, "run")
        result = {"steps": arguments.steps}
        if not arguments.skip_epoch:
            epoch_seconds = steady_epoch_seconds(config, run_dir)
        pairs = translation.load_pairs(config["data"], ("train",))["train"]
        tokenizer, _ = translation.tokenizers(run_dir, config["tokenizer"], pairs)
        result["fixed_tokens_per_s"] = fixed_rate(config, tokenizer.vocab_size, arguments.steps)
        real = real_rate(config, pairs, tokenizer, arguments.steps)
        result.update(
            real_tokens_per_s=real["rate"],
            real_over_fixed=real["rate"] / result["fixed_tokens_per_s"],
            distinct_batch_shapes=real["distinct_shapes"],
            padding_share=real["padding_share"],
            batches_per_epoch=real["batches_per_epoch"],
        )
        if not arguments.skip_epoch:
            target_tokens = _epoch_target_tokens(config, pairs, tokenizer)
            result.update(
                epoch_seconds=epoch_seconds,
                epoch_tokens_per_s=target_tokens / epoch_seconds,
                epoch_over_fixed=target_tokens / epoch_seconds / result["fixed_tokens_per_s"],
                epoch_target_tokens=target_tokens,
            )
        print(json.dumps({key: round(value, 3) if isinstance(value, float) else value for key, value in result.items()}))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _epoch_target_tokens(config, pairs, tokenizer):
    from keras_transformer import data

    settings = config["training"]
    batches = data.make_translation_batches(
        pairs, tokenizer, tokenizer, data.Batching(settings["max_length"], tokens_per_batch=settings["tokens_per_batch"]),
        shuffle=False,
    )
    return sum(int(np.count_nonzero(labels.numpy())) for _, labels in batches.dataset)


if __name__ == "__main__":
    main()
