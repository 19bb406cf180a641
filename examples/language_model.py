"""A small GPT-style language model on IMDB's training reviews, trained in about half an hour on two CPU cores.

    python examples/language_model.py --out runs/imdb-lm
    keras-transformer generate runs/imdb-lm "This movie was" --seed 1 --top-p 0.9
    tensorboard --logdir runs/imdb-lm/logs     # Attention tab: the samples' self-attention

Reads IMDB from $KERAS_TRANSFORMER_DATA/imdb or ../shared/data/imdb; learns
an 8,000-piece WordPiece vocabulary; packs the reviews into windows of 128
tokens; trains a 4-layer decoder for 1,320 steps of 32 windows (about 5.4
million tokens, under one pass over the reviews); then reports the held-back
reviews' perplexity per token and bits per character (one review in 50) and
prints a few seeded samples. Killed midway, the same command resumes.

Why this size: on a 2-core CPU half an hour is about 10^14 floating-point
operations. Spent on a model of d_model 256 that is 3 million tokens; on
d_model 128, twice as many, and at this budget more text beats more width
(the "small" preset reached a validation perplexity of 1,974 after 60 steps
against 2,224 for this one, but this one takes 1.35 s a step against 2.4 s:
1,320 steps fit in half an hour on a 2-core AVX2 CPU).
Under one pass over the data nothing overfits, so no dropout; pre-LN layers
(GPT-2's order) take the schedule's peak learning rate after a short warm-up.
Every attempt: docs/results.md.
"""

import argparse
import json
import logging
import sys
import time

from keras_transformer.runs import language_model, run_dir
from keras_transformer.runs.options import merge_config

RECIPE = {
    "data": {"dataset": "imdb", "packing": "windows"},
    "tokenizer": {"vocab_size": 8000, "lower_case": False},
    "model": {
        "preset": None, "num_layers": 4, "d_model": 128, "num_heads": 4, "d_ff": 512, "dropout": 0.0,
        "norm_first": True,
    },
    # 4 validated epochs of 330 steps: 1,320 steps of 32 x 128 tokens.
    "training": {
        "epochs": 4, "steps_per_epoch": 330, "max_length": 128, "batch_size": 32, "warmup_steps": 400,
        "learning_rate_scale": 1.0,
    },
    "evaluation": {"temperature": 1.0, "top_p": 0.9, "max_new_tokens": 60},
}

PROMPTS = ("This movie was", "I have never seen", "The acting")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="runs/imdb-lm", help="the run directory (default runs/imdb-lm)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--precision", default="auto", help="auto: mixed bfloat16 where it is native, else float32")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    run_dir.check_is_run_directory(arguments.out)
    config = merge_config(RECIPE, {"training": {"precision": arguments.precision, "seed": arguments.seed}})
    started = time.time()
    metrics = language_model.train(config, arguments.out, verbose=2)
    trained = time.time() - started
    scores = language_model.evaluate(arguments.out)
    samples = language_model.generate(arguments.out, PROMPTS, seed=1)
    report = {"training": metrics.get("training"), "training_seconds": round(trained), "evaluation": scores,
              "samples": samples}
    print(json.dumps(report, indent=2, ensure_ascii=False))


def run():
    try:
        main()
    except (ValueError, FileNotFoundError, FileExistsError) as error:  # a bad --out, a missing corpus
        sys.exit(f"language_model.py: error: {error}")


if __name__ == "__main__":
    run()
