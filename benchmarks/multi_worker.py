"""Two workers with one core each against one process with two cores: what MultiWorkerMirroredStrategy costs.

    python benchmarks/multi_worker.py [--steps 40]

The "small" model (d_model 256, 3 + 3 layers) trains with `fit` on fixed
global batches of 64 x 32 x 32 tokens (mixed bfloat16), first in one
process using both cores, then as two worker processes on 127.0.0.1, each
pinned to one core (`os.sched_setaffinity`) and one thread pool of one
thread, all-reducing the gradients over gRPC. Target tokens per second of
the global batch, after the first steps (tracing). The ideal ratio is 1.0:
the same cores doing the same arithmetic, plus the all-reduce. Prints one
JSON line; BENCHMARKS.md has the figures.
"""

import argparse
import json
import os
import subprocess
import sys
import time

BATCH, LENGTH, WARMUP_STEPS = 64, 32, 8


def train(steps, cores, strategy_name):
    """Runs in a fresh process: fit for `steps` and return target tokens/s after the warm-up steps."""
    os.sched_setaffinity(0, cores)
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(len(cores))
    tf.config.threading.set_inter_op_parallelism_threads(len(cores))
    import keras
    import numpy as np

    import keras_transformer as kt

    strategy = kt.training.make_strategy(strategy_name, cluster_timeout=120)
    keras.config.set_dtype_policy("mixed_bfloat16")
    rng = np.random.default_rng(0)
    source = rng.integers(4, 8000, size=(BATCH, LENGTH)).astype("int32")
    target = rng.integers(4, 8000, size=(BATCH, LENGTH + 1)).astype("int32")
    data = tf.data.Dataset.from_tensors(((source, target[:, :-1]), target[:, 1:])).repeat()
    with strategy.scope():
        model = kt.models.Transformer.from_preset("small", src_vocab_size=8000, tgt_vocab_size=8000)
        model.compile(optimizer=keras.optimizers.Adam(1e-4), loss=kt.training.MaskedSparseCrossEntropy())

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == WARMUP_STEPS - 1:
                self.started = time.perf_counter()

    clock = Clock()
    model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[clock])
    seconds = time.perf_counter() - clock.started
    return BATCH * LENGTH * (steps - WARMUP_STEPS) / seconds, model.count_params()


def in_processes(steps):
    """The two measurements, each in fresh processes (TensorFlow fixes its threads when it starts)."""
    me = [sys.executable, __file__, "--steps", str(steps), "--role"]
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    alone = json.loads(subprocess.run([*me, "alone"], env=environment, capture_output=True, text=True,
                                      check=True).stdout.splitlines()[-1])
    from keras_transformer.training.distribution import local_cluster

    workers = [
        subprocess.Popen([*me, f"worker{index}"], env={**environment, "TF_CONFIG": config}, stdout=subprocess.PIPE,
                         text=True)
        for index, config in enumerate(local_cluster(2))
    ]
    results = [json.loads(worker.communicate()[0].splitlines()[-1]) for worker in workers]
    two = results[0]
    gradient_megabytes = two["parameters"] * 4 / 1e6
    print(json.dumps({
        "one_process_two_cores_tokens_per_s": round(alone["tokens_per_s"]),
        "two_workers_one_core_each_tokens_per_s": round(two["tokens_per_s"]),
        "ratio": round(two["tokens_per_s"] / alone["tokens_per_s"], 3),
        "parameters": two["parameters"],
        "gradient_megabytes_per_step": round(gradient_megabytes, 1),
        "steps": steps,
    }))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--role", choices=["alone", "worker0", "worker1"])
    arguments = parser.parse_args()
    if arguments.role is None:
        return in_processes(arguments.steps)
    cores = [0, 1] if arguments.role == "alone" else [int(arguments.role[-1])]
    tokens_per_s, parameters = train(arguments.steps, cores, "none" if arguments.role == "alone" else "multi-worker")
    print(json.dumps({"tokens_per_s": tokens_per_s, "parameters": parameters}))


if __name__ == "__main__":
    main()
