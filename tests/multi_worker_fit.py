"""`model.fit` of a small Transformer, in this process or as one worker of a cluster (TF_CONFIG).

    python tests/multi_worker_fit.py OUT.npz [--strategy none|multi-worker] [--shards RUN_DIR OUT.json]

Trains a fixed number of steps on fixed global batches (no dropout) and
saves the weights and the history: trained alone (`train`, in the test's
process) and as two workers, the results must agree. With `--shards`, a
worker then writes the pairs its batches held (`multi_worker_shards.py`),
so that one cluster start serves both checks. Used by
tests/test_multi_worker.py.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras  # noqa: E402
import keras_transformer as kt  # noqa: E402
from multi_worker_shards import write_pairs_seen  # noqa: E402  (this folder is the script's)

GLOBAL_BATCH, STEPS = 16, 6


def batches():
    rng = np.random.default_rng(0)
    source = rng.integers(3, 30, size=(GLOBAL_BATCH * STEPS, 9)).astype("int32")
    source[:, 7:] = 0  # padding, so the loss's token count matters
    target = np.concatenate([np.full((len(source), 1), 2, "int32"), source[:, ::-1]], axis=1)
    return tf.data.Dataset.from_tensor_slices(((source, target[:, :-1]), target[:, 1:])).batch(GLOBAL_BATCH)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--strategy", default="none")
    parser.add_argument("--shards", nargs=2, metavar=("RUN_DIR", "OUT"))
    arguments = parser.parse_args()
    strategy = kt.training.make_strategy(arguments.strategy, cluster_timeout=120)
    weights, history = train(strategy)
    np.savez(arguments.out, history=json.dumps(history), **weights)
    if arguments.shards:
        write_pairs_seen(strategy, *arguments.shards)


def train(strategy):
    """`({variable path without the model's name: trained value}, fit's history)`, under `strategy`."""
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = kt.models.Transformer(
            src_vocab_size=30, tgt_vocab_size=30, num_layers=1, d_model=16, num_heads=2, d_ff=32,
            max_length=16, dropout=0.0,
        )
        model.compile(
            optimizer=keras.optimizers.Adam(1e-2),
            loss=kt.training.MaskedSparseCrossEntropy(),
            metrics=[kt.training.MaskedAccuracy()],
        )
    history = model.fit(batches(), epochs=2, validation_data=batches(), shuffle=False, verbose=0)  # batches fixed
    # The model's own name differs from process to process (transformer, transformer_1, ...).
    return ({variable.path.split("/", 1)[1]: keras.ops.convert_to_numpy(variable) for variable in model.trainable_variables},
            history.history)


if __name__ == "__main__":
    main()
