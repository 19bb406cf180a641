"""One epoch of a worker's training batches under MultiWorkerMirroredStrategy: which pairs did it see?

    python tests/multi_worker_shards.py RUN_DIR OUT.json

Tokenises the demo corpus's first 300 pairs into RUN_DIR's shards (the chief
writes them; the other worker reads the chief's), builds the training batches
as `keras-transformer train` does on a cluster, and writes the source and
target ids of every pair this worker's replica got in one epoch, and its
number of steps. Used by tests/test_multi_worker.py, alone and after
`multi_worker_fit.py` in the same worker process (`write_pairs_seen`).
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from keras_transformer import data, text, training  # noqa: E402
from keras_transformer.runs import translation, translation_data  # noqa: E402
from keras_transformer.runs.run_dir import written_by_this_process  # noqa: E402

PAIRS = data.demo_corpus()["train"][:300]
SETTINGS = {"seed": 3, "steps_per_epoch": None}
BATCHING = data.Batching(max_length=24, tokens_per_batch=256, batch_multiple=2)


def write_pairs_seen(strategy, run_dir, out):
    source_tokenizer = text.WordPieceTokenizer.learn([source for source, _ in PAIRS], vocab_size=200)
    target_tokenizer = text.WordPieceTokenizer.learn([target for _, target in PAIRS], vocab_size=200)
    split = data.Split(data.PairsInMemory(tuple(PAIRS)))
    with written_by_this_process(run_dir) as writable:
        shards = translation.token_shards(writable, "train", split, source_tokenizer, target_tokenizer, run_dir)
        batches, _ = translation_data.worker_batches(
            strategy, shards, source_tokenizer, target_tokenizer, SETTINGS, BATCHING
        )
        seen, steps = [], 0
        for (sources, _), labels in batches(0):
            steps += 1
            for source_ids, label_ids in zip(strategy.experimental_local_results(sources)[0].numpy(),
                                             strategy.experimental_local_results(labels)[0].numpy()):
                seen.append([[int(i) for i in source_ids if i], [int(i) for i in label_ids if i]])
    with open(out, "w") as file:
        json.dump({"pairs": seen, "steps": steps, "shards_read_from": shards.directory}, file)


def main():
    run_dir, out = sys.argv[1:]
    write_pairs_seen(training.make_strategy("multi-worker", cluster_timeout=120), run_dir, out)


if __name__ == "__main__":
    main()
