"""Where a decoding batch's time goes: the TensorFlow profiler's op times, summed by op type.

    python benchmarks/profile_decoding.py [--model keras_transformer|keras_hub] [--no-cache] [--jit] [--batches 3]

Builds the decoder of the benchmark's decoding rows (`rows.py decode`: 32
random sources of 32 tokens, 32 new tokens each, float32), runs it a few
times to warm up, traces `--batches` more with `tf.profiler` and prints the
op time per batch by op type, largest first (CPU time summed over threads,
as `profile_training.py` counts it).
"""

import argparse
import tempfile
import time

import numpy as np

from config import SMALL
from profile_training import by_op_type, op_times, print_shares
from rows import DECODE_BATCH, DECODE_SOURCE_LENGTH, _keras_hub_decoder, _our_decoder


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["keras_transformer", "keras_hub"], default="keras_transformer")
    parser.add_argument("--no-cache", action="store_true", help="ours, recomputing the prefix at every step")
    parser.add_argument("--jit", action="store_true", help="compile the decoder with XLA")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    args.search, args.beam_size = "greedy", 1

    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    source = tf.constant(rng.integers(1, SMALL["vocab_size"], (DECODE_BATCH, DECODE_SOURCE_LENGTH), dtype=np.int32))
    decode = (_our_decoder if args.model == "keras_transformer" else _keras_hub_decoder)(args, SMALL)
    for _ in range(3):
        decode(source).numpy()
    started = time.perf_counter()
    for _ in range(args.batches):
        decode(source).numpy()
    wall = (time.perf_counter() - started) / args.batches
    with tempfile.TemporaryDirectory() as trace_directory:
        tf.profiler.experimental.start(trace_directory)
        for _ in range(args.batches):
            decode(source).numpy()
        tf.profiler.experimental.stop()
        totals = op_times(trace_directory)

    everything = sum(totals.values())
    print(f"{args.model}: {wall * 1e3:.0f} ms per batch (wall, untraced), {everything / args.batches * 1e3:.0f} ms of op time")
    print_shares("by op type", by_op_type(totals), args.batches, "batch", args.top)

if __name__ == "__main__":
    main()
