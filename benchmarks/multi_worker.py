"""Two workers with one core each against one process with two cores: what MultiWorkerMirroredStrategy costs.

    python benchmarks/multi_worker.py [--steps 40]

The "small" model (d_model 256, 3 + 3 layers) trains with `fit` on fixed
global batches of 64 x 32 x 32 tokens (mixed bfloat16), first in one
process using both cores, then in one process using one core, then as two
worker processes on 127.0.0.1, each
pinned to one core (`os.sched_setaffinity`) and one thread pool of one
thread, all-reducing the gradients over gRPC. Target tokens per second of
the global batch, after the first steps (tracing). The ideal ratio is 1.0:
the same cores doing the same arithmetic, plus the all-reduce. The workers
then time one step's all-reduce alone (tensors shaped like the gradients).
Prints one JSON line; BENCHMARKS.md has the figures.
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
    # Two inter-op threads at least: a worker with one cannot run the
    # all-reduce's sends and receives beside the step (half the throughput).
    tf.config.threading.set_inter_op_parallelism_threads(max(2, len(cores)))
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
    result = {
        "tokens_per_s": BATCH * LENGTH * (steps - WARMUP_STEPS) / seconds,
        "step_ms": 1000 * seconds / (steps - WARMUP_STEPS),
        "parameters": model.count_params(),
    }
    if strategy_name == "multi-worker":
        result["all_reduce_ms"] = all_reduce_milliseconds(strategy, model)
    return result


def all_reduce_milliseconds(strategy, model, repeats=10):
    """One step's all-reduce alone: tensors shaped like the gradients, summed across the workers."""
    import tensorflow as tf

    gradients = [tf.ones(variable.shape, "float32") for variable in model.trainable_variables]

    @tf.function
    def all_reduce():
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("SUM", gradients))

    all_reduce()  # tracing
    started = time.perf_counter()
    for _ in range(repeats):
        all_reduce()
    return 1000 * (time.perf_counter() - started) / repeats


def in_processes(steps):
    """The two measurements, each in fresh processes (TensorFlow fixes its threads when it starts)."""
    me = [sys.executable, __file__, "--steps", str(steps), "--role"]
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    def run_alone(role):
        return json.loads(subprocess.run([*me, role], env=environment, capture_output=True, text=True,
                                         check=True).stdout.splitlines()[-1])

    alone = run_alone("alone")
    one_core = run_alone("alone-one-core")
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
        "one_process_one_core_tokens_per_s": round(one_core["tokens_per_s"]),
        "two_workers_one_core_each_tokens_per_s": round(two["tokens_per_s"]),
        "ratio": round(two["tokens_per_s"] / alone["tokens_per_s"], 3),
        "ratio_to_twice_one_core": round(two["tokens_per_s"] / (2 * one_core["tokens_per_s"]), 3),
        "step_ms": round(two["step_ms"], 1),
        "all_reduce_ms": round(two["all_reduce_ms"], 1),
        "parameters": two["parameters"],
        "gradient_megabytes_per_step": round(gradient_megabytes, 1),
        "steps": steps,
    }))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--role", choices=["alone", "alone-one-core", "worker0", "worker1"])
    arguments = parser.parse_args()
    if arguments.role is None:
        return in_processes(arguments.steps)
    cores = {"alone": [0, 1], "alone-one-core": [0], "worker0": [0], "worker1": [1]}[arguments.role]
    strategy = "multi-worker" if arguments.role.startswith("worker") else "none"
    print(json.dumps(train(arguments.steps, cores, strategy)))


if __name__ == "__main__":
    main()
