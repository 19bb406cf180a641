"""The fused attention kernel against the explicit path, on this machine's backend.

    python benchmarks/fused_attention.py [--rounds 5] [--seconds 8] [--precision float32]

`MultiHeadAttention` computes attention with `keras.ops.dot_product_attention`
when no one reads the weights, on the backends listed in
`FUSED_ATTENTION_BACKENDS`. This script measures, in one process and in
alternating rounds (so that both paths see the same stretches of a shared
machine), the benchmark's "small" model (benchmarks/config.py):

* training: target tokens/s of a compiled training step (Adam, cross-entropy);
* decoding: sentences/s of cached greedy search on the TensorFlow backend
  (`transformer_search` in a `tf.function`, as the translator runs it).

It prints one JSON line: each path's median rate and fused/explicit ratios.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).parent))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from config import SMALL  # noqa: E402
from contenders import build_keras_model  # noqa: E402
from keras_transformer.layers import MultiHeadAttention  # noqa: E402


def set_fused(model, fused):
    for layer in model._flatten_layers():
        if isinstance(layer, MultiHeadAttention):
            layer.fused_attention = fused


def batches(config, count, seed=0):
    rng = np.random.default_rng(seed)
    shape = (config["batch_size"], config["target_length"] + 1)
    for _ in range(count):
        source = rng.integers(3, config["vocab_size"], (config["batch_size"], config["source_length"]), dtype="int32")
        target = rng.integers(3, config["vocab_size"], shape, dtype="int32")
        yield (source, target[:, :-1]), target[:, 1:]


def timed_rate(step, units, seconds):
    """Units/s of `step()` over at least `seconds` (after one untimed call)."""
    step()
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        done += 1
    return done * units / (time.perf_counter() - start)


def training_step(model, config):
    model.compile(optimizer=keras.optimizers.Adam(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = list(batches(config, 4))
    index = [0]

    def step():
        inputs, labels = data[index[0] % len(data)]
        index[0] += 1
        model.train_on_batch(inputs, labels)

    return step


def decoding_step(model, config, sentences=32):
    import tensorflow as tf

    from keras_transformer.inference import DecodingSettings, transformer_search

    (source, _), _ = next(batches(config, 1, seed=1))
    source = tf.constant(source[:sentences])
    settings = DecodingSettings(beam_size=1, max_extra_length=0,
                                max_output_length=config["target_length"]).for_output(start_id=1, end_id=2)
    search = tf.function(lambda ids: transformer_search(model, ids, settings))
    return lambda: search(source)[0].numpy()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--precision", default="float32")
    arguments = parser.parse_args()
    keras.config.set_dtype_policy(arguments.precision)
    config = dict(SMALL)
    # One model per path: each compiles its own step once.
    models = {}
    for fused in (False, True):
        keras.utils.set_random_seed(0)
        models[fused] = build_keras_model("keras_transformer", config)
        set_fused(models[fused], fused)
    steps = {("train", fused): training_step(model, config) for fused, model in models.items()}
    if keras.backend.backend() == "tensorflow":
        steps.update({("decode", fused): decoding_step(model, config) for fused, model in models.items()})
    units = {"train": config["batch_size"] * config["target_length"], "decode": 32}
    rates = {key: [] for key in steps}
    for _ in range(arguments.rounds):
        for key, step in steps.items():
            rates[key].append(timed_rate(step, units[key[0]], arguments.seconds))
    medians = {f"{task} {'fused' if fused else 'explicit'}": statistics.median(values)
               for (task, fused), values in rates.items()}
    ratios = {task: statistics.median(np.divide(rates[(task, True)], rates[(task, False)]))
              for task in units if (task, True) in rates}
    print(json.dumps({"backend": keras.backend.backend(), "precision": arguments.precision,
                      "rates": medians, "fused_over_explicit": ratios, "rounds": arguments.rounds}))


if __name__ == "__main__":
    main()
