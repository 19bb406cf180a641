"""Where a decoding batch's time goes: the TensorFlow profiler's op times, summed by op type.

    python benchmarks/profile_decoding.py [--model keras_transformer|keras_hub] [--no-cache] [--jit] [--batches 3]
    python benchmarks/profile_decoding.py --run RUN_DIR [--beam-size 4] [--threads 2]   # a run's own translator

Builds the decoder of the benchmark's decoding rows (`rows.py decode`: 32
random sources of 32 tokens, 32 new tokens each, float32), runs it a few
times to warm up, traces `--batches` more with `tf.profiler` and prints the
op time per batch by op type, largest first (CPU time summed over threads,
as `profile_training.py` counts it).

With `--run`, the run's `Translator` (the search its export holds) translates
the first 32 Multi30k validation sentences instead, and the op time is also
printed by op, the layers' copies of an op added up: for an imported
checkpoint (BENCHMARKS.md, "Where a step goes"), divide by the steps a batch
takes (`--max-length` of `pretrained_vs_hf.py`, less one).
"""

import argparse
import collections
import os
import re
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
    parser.add_argument("--run", help="profile this run directory's translator on Multi30k validation sentences")
    parser.add_argument("--beam-size", type=int, default=1, help="with --run")
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: TensorFlow's)")
    args = parser.parse_args()

    import keras
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(0)
    if args.run:
        source, decode = _run_translator(args)
    else:
        args.search, args.beam_size = "greedy", 1
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
    print(f"{args.run or args.model}: {wall * 1e3:.0f} ms per batch (wall, untraced), "
          f"{everything / args.batches * 1e3:.0f} ms of op time")
    print_shares("by op type", by_op_type(totals), args.batches, "batch", args.top)
    if args.run:
        print_shares("by op, the layers' copies added up", by_op(totals), args.batches, "batch", args.top, width=90)


def _run_translator(args):
    """The first 32 Multi30k validation sentences, and a call translating them with the run's `Translator`."""
    import tensorflow as tf

    from keras_transformer.runs import translation

    data = os.environ.get("KERAS_TRANSFORMER_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data"))
    with open(os.path.join(data, "multi30k", "val.en"), encoding="utf-8") as file:
        sentences = tf.constant(file.read().splitlines()[:DECODE_BATCH])
    translator = translation.load_translator(args.run, beam_size=args.beam_size)
    return sentences, lambda batch: translator(batch)["tokens"]


def by_op(totals):
    """{op name with its layer and loop numbers taken out: seconds}: a decoder layer's op and its copies in the others."""
    grouped = collections.Counter()
    for name, seconds in totals.items():
        grouped[re.sub(r"_\d+", "", name)] += seconds
    return grouped

if __name__ == "__main__":
    main()
