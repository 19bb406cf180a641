"""One epoch of a worker's training batches under MultiWorkerMirroredStrategy: which pairs did it see?

`write_pairs_seen` tokenises the demo corpus's first 300 pairs into a run
directory's shards (the chief writes them), builds the training batches as
`keras-transformer train` does on a cluster, and writes the source and target
ids of every pair this worker's replica got in one epoch, and its number of
steps. Run by `multi_worker_fit.py --shards` in each worker process, after its
fit (tests/test_multi_worker.py).
"""

import json

from keras_transformer import data, text
from keras_transformer.runs import translation, translation_data
from keras_transformer.runs.run_dir import written_by_this_process

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
        json.dump({"pairs": seen, "steps": steps}, file)
