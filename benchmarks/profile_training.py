"""Where a training step's time goes: the TensorFlow profiler's op times, summed.

    python benchmarks/profile_training.py --model keras_transformer [--dtype bfloat16] [--steps 5] [--top 25]

Trains the benchmark's "small" model for a few warm-up steps, traces
`--steps` more with `tf.profiler`, reads the trace (the XPlane protobuf the
profiler writes) and prints the total time per op type and per op, as a
share of all op time, largest first. The figures are CPU time summed over
the threads that ran the ops, so on 2 cores they can add up to twice the
wall time.
"""

import argparse
import collections
import glob
import os
import tempfile

import numpy as np

from config import KERAS_CONTENDERS, SMALL
from contenders import build_keras_model, build_loss, build_optimizer
from rows import random_batches


def op_times(trace_directory):
    """{op name: seconds}, from every XPlane file under `trace_directory`."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    totals = collections.Counter()
    for path in glob.glob(os.path.join(trace_directory, "**", "*.xplane.pb"), recursive=True):
        space = xplane_pb2.XSpace()
        with open(path, "rb") as handle:
            space.ParseFromString(handle.read())
        for plane in space.planes:
            if not plane.name.startswith("/host:CPU"):
                continue
            for line in plane.lines:
                # Executor threads record one event per op kernel, named "name:Type".
                for event in line.events:
                    name = plane.event_metadata[event.metadata_id].name
                    if ":" in name and "/" in name:
                        totals[name] += event.duration_ps / 1e12
    return totals


def by_op_type(totals):
    """{op type: seconds} from the profiler's {"name:Type": seconds}."""
    grouped = collections.Counter()
    for name, seconds in totals.items():
        grouped[name.rsplit(":", 1)[1]] += seconds
    return grouped


def print_shares(title, grouped, repeats, unit, top=None, width=30, everything=None):
    """`grouped` largest first: milliseconds per `unit` (over `repeats` of them) and share of
    `everything` (by default, of `grouped`'s own total)."""
    everything = everything or sum(grouped.values())
    print(f"\n{title:{width + 2}s} ms/{unit}   share")
    for key, seconds in grouped.most_common(top):
        print(f"  {key[-width:]:{width}s} {seconds / repeats * 1e3:8.1f}  {seconds / everything:6.1%}")


PARTS = ("adam", "loss", "output_projection", "embedding", "attention", "norm", "feed_forward", "dropout")


def part_of(op_name):
    """A coarse label for an op: the optimizer, the loss, or the layer kind it belongs to."""
    name = op_name.lower()
    direction = "backward" if "gradient_tape" in name or "grad" in name.rsplit(":", 1)[1] else "forward"
    if "/adam/" in name:
        return "optimizer (adam)"
    if "crossentropy" in name or "/loss" in name:
        return "loss"
    for part in PARTS[2:]:
        if part in name:
            return f"{part} ({direction})"
    return f"other ({direction})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=KERAS_CONTENDERS, default="keras_transformer")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--part", help="count only the ops of this part (for example 'attention (backward)')")
    parser.add_argument("--op-type", help="list only the ops of this type (for example Mul)")
    args = parser.parse_args()

    import keras
    import tensorflow as tf

    if args.dtype == "bfloat16":
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    keras.utils.set_random_seed(0)
    model = build_keras_model(args.model)
    model.compile(
        optimizer=build_optimizer(args.model),
        loss=build_loss(args.model),
    )
    sources, inputs, outputs = (np.stack(parts) for parts in zip(*random_batches(SMALL)))
    dataset = tf.data.Dataset.from_tensor_slices(((sources, inputs), outputs)).repeat()
    model.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0)
    with tempfile.TemporaryDirectory() as trace_directory:
        tf.profiler.experimental.start(trace_directory)
        model.fit(dataset, epochs=1, steps_per_epoch=args.steps, verbose=0)
        tf.profiler.experimental.stop()
        totals = op_times(trace_directory)
    if args.part:
        totals = collections.Counter({name: sec for name, sec in totals.items() if part_of(name) == args.part})

    everything = sum(totals.values())
    print(f"{args.model} {args.dtype}: {everything / args.steps * 1e3:.0f} ms of op time per step")
    print_shares("by op type", by_op_type(totals), args.steps, "step", args.top)
    by_part = collections.Counter()
    for name, seconds in totals.items():
        by_part[part_of(name)] += seconds
    print_shares("by part of the step", by_part, args.steps, "step")
    listed = collections.Counter(
        {name: seconds for name, seconds in totals.items() if not args.op_type or name.endswith(":" + args.op_type)}
    )
    print_shares("by op", listed, args.steps, "step", args.top, width=72, everything=everything)

if __name__ == "__main__":
    main()
