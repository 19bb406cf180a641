"""What a translation run reads: its corpus, its tokenizers, its token shards and its batches.

    pairs streamed from disk (data) -> vocabularies learned from a sample (text)
      -> tokenized once into shards in the run directory -> length-bucketed batches (data)

`runs.translation` trains on what this module prepares.
"""

import dataclasses
import logging
import time

from keras_transformer import data
from keras_transformer.models.multi_worker import spans_workers
from keras_transformer.runs import run_dir as runs
from keras_transformer.runs.options import TRANSLATION_DATASETS

logger = logging.getLogger("keras_transformer")

# The tokenizer section's "kind" of a run whose tokenizers came with a checkpoint (SentencePiece).
PRETRAINED_TOKENIZERS = "pretrained"

def corpus_splits(data_config, splits=("train", "val")):
    """`{split: data.Split}` for the configured corpus: streams, read from disk when needed."""
    dataset = data_config["dataset"]
    if dataset not in TRANSLATION_DATASETS:
        raise ValueError(f"dataset must be one of {TRANSLATION_DATASETS}, got {dataset!r}")
    result = {}
    if dataset == "demo":
        corpus = data.demo_corpus()
        result = {split: data.Split(data.PairsInMemory(tuple(corpus[split]))) for split in splits}
    elif dataset == "multi30k":
        for split in splits:
            source, target = data.multi30k_files(data_config["data_dir"], data_config["direction"], split)
            result[split] = data.Split(data.ParallelText(source_files=(str(source),), target_files=(str(target),)))
    else:
        files = {
            split: {kind: data_config.get(f"{split}_{kind}") for kind in ("tsv", "source", "target")}
            for split in ("train", "val")
        }
        for split in splits:
            if split not in files:
                raise ValueError(f"dataset 'files' has a train and a val split, not {split!r}")
            given = files[split]
            if given["tsv"] or (given["source"] and given["target"]):
                result[split] = data.Split(data.ParallelText.from_files(**given))
            elif split == "val" and (files["train"]["tsv"] or files["train"]["source"]):
                # No validation files: validate on lines lent by the training files.
                result[split] = data.Split(data.ParallelText.from_files(**files["train"]), held_back="val")
            else:
                raise ValueError(
                    f"dataset 'files' needs --{split}-tsv, or --{split}-source with --{split}-target"
                )
        given_val = files["val"]
        if "train" in result and not (given_val["tsv"] or (given_val["source"] and given_val["target"])):
            result["train"] = data.Split(result["train"].corpus, held_back="train")
    for split in splits:
        limit = data_config.get(f"limit_{split}")
        if limit:
            result[split] = data.Split(result[split].corpus, result[split].held_back, limit)
    return result


def load_pairs(data_config, splits=("train", "val")):
    """`{split: [(source, target), ...]}` of the good pairs: for validation-sized splits."""
    return {split: stream.good_pairs_list() for split, stream in corpus_splits(data_config, splits).items()}


def tokenizers(run_dir, tokenizer_config, train_split=None, seed=0):
    """The run's source and target tokenizers: loaded, or learned from a sample of `train_split` and saved.

    One vocabulary folder each (`vocab/source`, `vocab/target`), or one for
    both languages (`vocab/shared`) with `shared`. The sample is at most
    `vocab_sample` pairs, chosen by `seed` (`data.streaming.sample`), and
    recorded in metrics.json.

    A SentencePiece source is framed as Marian's tokenizer frames it,
    pieces then `</s>` with no start token, so that the run can go out as a
    Marian checkpoint (`export --format hf`): a shared SentencePiece
    vocabulary is learned once and saved per side, `vocab/source` without
    the start token and `vocab/target` with it. (A run whose sentencepiece
    vocabulary is in `vocab/shared` was made before, with `<s>` in front of
    its sources, and goes on so.)
    """
    kind = tokenizer_config.get("kind", "wordpiece")  # a run made before the option: WordPiece
    if kind == PRETRAINED_TOKENIZERS:
        # A pretrained checkpoint's own tokenizers, written at import (`import_checkpoint`): nothing to learn.
        return runs.load_tokenizer(run_dir, "source"), runs.load_tokenizer(run_dir, "target")
    sentencepiece = kind == "sentencepiece"
    shared_folder = tokenizer_config["shared"] and (not sentencepiece or runs.has_tokenizer(run_dir, "shared"))
    names = ("shared",) if shared_folder else ("target",) if tokenizer_config["shared"] else ("source", "target")
    settings = dict(vocab_size=tokenizer_config["vocab_size"], lower_case=tokenizer_config["lower_case"])
    if sentencepiece:
        settings["sentencepiece_settings"] = dict(model_type=tokenizer_config["sentencepiece_model"],
                                                  character_coverage=tokenizer_config["character_coverage"])
    sources = targets = ()
    if train_split is not None and not all(runs.has_tokenizer(run_dir, name) for name in names):
        started, lines = time.time(), train_split.count()
        sample = data.streaming.sample(train_split.line_batches(), lines, tokenizer_config["vocab_sample"], seed)
        sample = data.streaming.pairs_list(sample)
        sources, targets = [source for source, _ in sample], [target for _, target in sample]
        logger.info("vocabulary sample: %d of %d pairs (%.0fs)", len(sources), lines, time.time() - started)
        runs.update_metrics(run_dir, {"vocabulary_sample": {"pairs": len(sources), "of_lines": lines, "seed": seed}})
    if shared_folder:
        shared = runs.learn_or_load_tokenizer(run_dir, "shared", sources + targets, **settings)
        return shared, shared
    if sentencepiece and tokenizer_config["shared"]:  # one model, learned once, saved per side
        target = runs.learn_or_load_tokenizer(run_dir, "target", sources + targets, **settings)
        if not runs.has_tokenizer(run_dir, "source"):
            target.with_start_token(None).save(runs.vocab_path(run_dir, "source"))
        return runs.load_tokenizer(run_dir, "source"), target
    source_settings = settings
    if sentencepiece:
        source_settings = dict(settings, sentencepiece_settings=dict(settings["sentencepiece_settings"], start_token=None))
    return (
        runs.learn_or_load_tokenizer(run_dir, "source", sources, **source_settings),
        runs.learn_or_load_tokenizer(run_dir, "target", targets, **settings),
    )


def token_shards(run_dir, split_name, split, source_tokenizer, target_tokenizer, chief_run_dir=None):
    """The split tokenised once into shards in the run directory (`data.token_shards`).

    A cluster's other workers train in a private copy of the run directory
    (`run_dir.written_by_this_process`), made without the shards: they read
    the chief's (`chief_run_dir`) when those are there and intact, and
    tokenise into their copy otherwise (the same shards: tokenising is
    deterministic).
    """
    identity = {
        "split": split.identity(),
        "source_vocabulary": source_tokenizer.fingerprint(),
        "target_vocabulary": target_tokenizer.fingerprint(),
    }
    if chief_run_dir and chief_run_dir != run_dir:
        shards, _ = data.open_token_shards(runs.tokens_path(chief_run_dir, split_name), identity)
        if shards is not None:
            return shards
    directory = runs.tokens_path(run_dir, split_name)
    shards, _ = data.open_token_shards(directory, identity)
    if shards is None:
        split.count()  # refuses misaligned files before any work
        shards = data.tokenize_once(directory, split.line_batches(), source_tokenizer, target_tokenizer, identity)
    return shards


def training_batches(strategy, shards, source_tokenizer, target_tokenizer, settings):
    """`(the dataset fit trains on, its TranslationBatches, the validation TranslationBatches)`."""
    batching = data.Batching(
        max_length=settings["max_length"],
        tokens_per_batch=settings["tokens_per_batch"] if not settings["batch_size"] else None,
        batch_size=settings["batch_size"],
        long_pairs=settings["long_pairs"],
        batch_multiple=strategy.num_replicas_in_sync,
    )
    if spans_workers(strategy):
        train_dataset, train_batches = worker_batches(
            strategy, shards["train"], source_tokenizer, target_tokenizer, settings, batching
        )
    else:
        train_batches = data.make_translation_batches(
            shards["train"], source_tokenizer, target_tokenizer, batching, shuffle=True, seed=settings["seed"]
        )
        train_dataset = train_batches.dataset.repeat() if settings["steps_per_epoch"] else train_batches.dataset
    val_batches = data.make_translation_batches(shards["val"], source_tokenizer, target_tokenizer, batching,
                                                shuffle=False)
    skipped = ", ".join(f"{count} {problem}" for problem, count in shards["train"].skipped.items() if count)
    logger.info(
        "training pairs: %d kept, %d dropped and %d truncated for max_length=%d%s",
        train_batches.num_pairs, train_batches.num_dropped, train_batches.num_truncated, settings["max_length"],
        f"; lines skipped: {skipped}" if skipped else "",
    )
    return train_dataset, train_batches, val_batches


def worker_batches(strategy, shards, source_tokenizer, target_tokenizer, settings, batching):
    """`(batches, TranslationBatches)`: on a cluster, each worker batches its own shards.

    `batches(skip_steps)` is the distributed dataset with its first steps
    skipped (`fitting.fit` resumes a run stopped mid-epoch with it).

    Worker w of W reads shards w, w + W, ...: no worker reads what another
    trains on. A batch is a replica's share of the global token budget (or
    batch size), so a step still trains on `tokens_per_batch` tokens in all.
    Every worker must take as many steps as the others: one whose shards
    make fewer batches ends its epoch with empty ones (see
    `data.WorkerShare`'s `pad_to_batches`).
    """
    import tensorflow as tf

    replicas = strategy.num_replicas_in_sync
    if batching.tokens_per_batch:
        share = dataclasses.replace(batching, batch_multiple=1, tokens_per_batch=batching.tokens_per_batch // replicas)
    else:
        share = dataclasses.replace(batching, batch_multiple=1, batch_size=max(1, batching.batch_size // replicas))
    # One variable outside the strategy sets every epoch's order (an exact resume).
    epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="shuffle_epoch")
    made = []
    # The pairs of all workers together, as one process would report them.
    totals = data.pair_counts(shards.lengths(), batching.max_length, batching.long_pairs)
    if totals["num_pairs"] == 0:
        raise ValueError(f"every pair is longer than max_length={batching.max_length} tokens")

    def this_worker(context, skip_steps):
        workers, worker = context.num_input_pipelines, context.input_pipeline_id
        local_replicas = replicas // workers
        most = max(
            data.count_batches(shards.lengths(range(other, shards.num_shards, workers)), share)
            for other in range(workers)
        )
        share_of_this_worker = data.WorkerShare(shards=range(worker, shards.num_shards, workers),
                                                pad_to_batches=-(-most // local_replicas) * local_replicas, epoch=epoch)
        batches = data.make_translation_batches(shards, source_tokenizer, target_tokenizer, share, shuffle=True,
                                                seed=settings["seed"], worker=share_of_this_worker)
        made.append(batches)
        dataset = batches.dataset.repeat() if settings["steps_per_epoch"] else batches.dataset
        # A step takes one batch per local replica.
        return dataset.skip(skip_steps * local_replicas) if skip_steps else dataset

    def distributed(skip_steps=0):
        return strategy.distribute_datasets_from_function(lambda context: this_worker(context, skip_steps))

    whole_epochs = distributed()
    batches = dataclasses.replace(made[0], **totals)
    return (lambda skip_steps: distributed(skip_steps) if skip_steps else whole_epochs), batches
