"""Training on a WMT-sized corpus: start-up time, peak memory and input speed, at two corpus sizes.

    python benchmarks/corpus_scale.py [--pairs 4500000] [--small-pairs 450000] [--work DIR]

The paper's English-German corpus has 4.5 million pairs. This script builds
one that size (never committed: under --work, default
/tmp/keras-transformer-corpus-scale) from Multi30k's training pairs and the
demo grammar's, shuffled and repeated, as gzipped shards of a million lines,
and for each size measures with the `keras-transformer train` command a
user would run (the "small" model, Multi30k's validation pairs):

* first start: a fresh run directory, to the end of the first training step
  (vocabulary from a 1M-pair sample, tokenisation into shards, model build,
  one step, then a validation pass and the save, included: an upper bound);
* later start: the same command for a second epoch, which checks and reads
  the vocabulary and shards, to the end of its first step (same bound);
* peak resident memory of each command (the process's maximum RSS);
* input speed: batches/s the shards deliver against batches/s the model
  trains on, in one process, one after the other.

It prints one JSON line per size and a summary line of the goals.
"""

import argparse
import gzip
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

LINES_PER_SHARD = 1_000_000
TRAIN = ["--preset", "small", "--tokens-per-batch", "4096", "--max-length", "100", "--steps-per-epoch", "1",
         "--attention-samples", "0", "--bleu-samples", "0", "--precision", "float32", "--no-evaluate"]


def build_corpus(directory, num_pairs, seed=0):
    """`train.NN.{en,de}.gz` shards of `num_pairs` English-German pairs; returns the source and target globs."""
    from keras_transformer import data

    directory = Path(directory)
    globs = str(directory / "train.*.en.gz"), str(directory / "train.*.de.gz")
    done = directory / "done.json"
    if done.exists() and json.loads(done.read_text()).get("pairs") == num_pairs:
        return globs
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("train.*.gz"):
        old.unlink()
    german_english = data.load_multi30k(splits=("train",), direction="de-en")["train"]
    demo = data.demo_corpus()["train"]  # English -> German
    pairs = [(english, german) for german, english in german_english] + list(demo)
    rng = random.Random(seed)
    written, shard = 0, 0
    while written < num_pairs:
        count = min(LINES_PER_SHARD, num_pairs - written)
        with gzip.open(directory / f"train.{shard:02d}.en.gz", "wt", encoding="utf-8", compresslevel=1) as english, \
                gzip.open(directory / f"train.{shard:02d}.de.gz", "wt", encoding="utf-8", compresslevel=1) as german:
            for _ in range(count // len(pairs) + 1):
                rng.shuffle(pairs)
                take = pairs[: min(len(pairs), count)]
                english.write("\n".join(source for source, _ in take) + "\n")
                german.write("\n".join(target for _, target in take) + "\n")
                count -= len(take)
                written += len(take)
                if count == 0:
                    break
        shard += 1
    done.write_text(json.dumps({"pairs": num_pairs}))
    return globs


def timed_command(arguments):
    """`(seconds, peak RSS in MB, stderr)` of a command, measured from a fresh parent process."""
    measure = (
        "import resource, subprocess, sys, time; started = time.time(); "
        "result = subprocess.run(sys.argv[1:], stderr=subprocess.PIPE, text=True); "
        "sys.stderr.write(result.stderr); "
        "print(time.time() - started, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, result.returncode)"
    )
    result = subprocess.run([sys.executable, "-c", measure, *arguments], capture_output=True, text=True)
    seconds, peak_kb, returncode = result.stdout.split()[-3:]
    if int(returncode) != 0:
        raise SystemExit(f"command failed: {' '.join(arguments)}\n{result.stderr[-3000:]}")
    return float(seconds), int(peak_kb) / 1024, result.stderr


def input_speed(run_dir, batches=300, steps=8):
    """Batches/s from the run's token shards, and training steps/s of its model on the same batches."""
    import keras

    from keras_transformer import data
    from keras_transformer.runs import translation

    config = translation.load_config(run_dir)
    source_tokenizer, target_tokenizer = translation.tokenizers(run_dir, config["tokenizer"])
    directory = os.path.join(run_dir, "tokens", "train")  # checked by the training run before
    shards = data.TokenShards(directory, json.loads(Path(directory, "manifest.json").read_text()))
    settings = config["training"]
    batches_of = data.make_translation_batches(
        shards, source_tokenizer, target_tokenizer,
        data.Batching(settings["max_length"], tokens_per_batch=settings["tokens_per_batch"]), shuffle=True, seed=0,
    )
    iterator = iter(batches_of.dataset.repeat())
    next(iterator)  # the shuffle buffer fills first
    started = time.time()
    kept = [next(iterator) for _ in range(batches)]
    pipeline = batches / (time.time() - started)
    model = translation.build_model(config, source_tokenizer.vocab_size, target_tokenizer.vocab_size)
    translation.compile_model(model, settings)
    model.train_on_batch(*kept[0])
    started = time.time()
    for inputs, labels in kept[1 : 1 + steps]:
        model.train_on_batch(inputs, labels)
    model_rate = steps / (time.time() - started)
    keras.backend.clear_session()
    return pipeline, model_rate, shards.num_pairs, int(shards.lengths()[:, 1].sum())


def measure_size(work, num_pairs, val):
    source, target = build_corpus(Path(work) / f"corpus-{num_pairs}", num_pairs)
    run_dir = str(Path(work) / f"run-{num_pairs}")
    subprocess.run(["rm", "-rf", run_dir], check=True)
    command = [sys.executable, "-m", "keras_transformer.cli", "train", "--dataset", "files", "--train-source", source,
               "--train-target", target, "--val-source", val[0], "--val-target", val[1], "--out", run_dir, *TRAIN]
    first_seconds, first_rss, first_log = timed_command([*command, "--epochs", "1"])
    later_seconds, later_rss, _ = timed_command([*command, "--epochs", "2"])
    pipeline, model_rate, pairs, target_tokens = input_speed(run_dir)
    return {
        "pairs": num_pairs,
        "pairs_kept": pairs,
        "target_tokens": target_tokens,
        "first_start_s": round(first_seconds, 1),
        "later_start_s": round(later_seconds, 1),
        "peak_rss_mb_first": round(first_rss),
        "peak_rss_mb_later": round(later_rss),
        "pipeline_batches_per_s": round(pipeline, 1),
        "model_steps_per_s": round(model_rate, 2),
        "pipeline_over_model": round(pipeline / model_rate, 1),
        "log": [line for line in first_log.splitlines() if "tokenised" in line or "vocabulary" in line],
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=4_500_000)
    parser.add_argument("--small-pairs", type=int, default=450_000)
    parser.add_argument("--work", default="/tmp/keras-transformer-corpus-scale")
    arguments = parser.parse_args()
    from keras_transformer import data

    german, english = data.multi30k_files(split="val", direction="de-en")
    val = (str(english), str(german))
    rows = {}
    for size in (arguments.small_pairs, arguments.pairs):
        rows[size] = measure_size(arguments.work, size, val)
        print(json.dumps(rows[size]), flush=True)
    large, small = rows[arguments.pairs], rows[arguments.small_pairs]
    print(json.dumps({
        "goals": {
            "first_start_min<=15": round(large["first_start_s"] / 60, 1),
            "later_start_min<=1": round(large["later_start_s"] / 60, 2),
            "peak_rss_gb<=3": round(max(large["peak_rss_mb_first"], large["peak_rss_mb_later"]) / 1024, 2),
            "peak_rss_large_over_small<=1.2": round(
                max(large["peak_rss_mb_first"], large["peak_rss_mb_later"])
                / max(small["peak_rss_mb_first"], small["peak_rss_mb_later"]), 2),
            "pipeline_over_model>=5": large["pipeline_over_model"],
        }
    }))


if __name__ == "__main__":
    main()
