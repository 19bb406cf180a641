"""Pre-training runs: what `keras-transformer pretrain` does, and what `train-classifier --init-from` takes.

    unlabelled texts (data) -> WordPiece vocabulary with [CLS] and [MASK] (text)
      -> "[CLS] pieces ..." batches, 15% of the tokens hidden (data.mask_tokens)
      -> MaskedLanguageModel (models) -> model.fit (training) -> model.keras

The texts are a file's lines (`--text FILE`) or a classification corpus's
texts, its labels unused (`--dataset sst2|imdb|imdb-sentences|csv:PATH`: its training texts
to learn from, its validation texts to validate on). A classifier run
started with `--init-from RUN_DIR` takes the run's vocabulary, the encoder's
sizes and its weights (`encoders.classifier_config`, `encoders.pretrained_encoder_weights`);
RUN_DIR may also be another classifier's run, whose encoder learned from
other labels (SST-2's recipe starts from one trained on IMDB's sentences).
"""

import logging
import random

from keras_transformer import data, text
from keras_transformer.runs import encoders
from keras_transformer.runs import fitting
from keras_transformer.runs import run_dir as runs
from keras_transformer.runs.encoders import classifier_config, pretrained_encoder_weights  # noqa: F401 (API)
from keras_transformer.runs.options import DEFAULTS, PRETRAINING

logger = logging.getLogger("keras_transformer")

def load_texts(data_config):
    """`{"train": [text, ...], "val": [...]}`: a file's lines (2% held back, at most 1000) or a corpus's texts."""
    if data_config.get("text"):
        texts = [line.strip() for line in data.read_lines(data_config["text"]) if line.strip()]
        if len(texts) < 2:
            raise ValueError(f"{data_config['text']} needs at least two non-empty lines to pre-train on")
        random.Random(0).shuffle(texts)
        held = max(1, min(1000, len(texts) // 50))
        splits = {"val": texts[:held], "train": texts[held:]}
    else:
        examples = encoders.load_examples(data_config)
        splits = {split: [example_text for example_text, _ in examples[split]] for split in ("train", "val")}
    for split in ("train", "val"):
        limit = data_config.get(f"limit_{split}")
        if limit:
            splits[split] = splits[split][:limit]
    return splits


def tokenizer(run_dir, tokenizer_config, train_texts=None):
    """The run's vocabulary ([CLS] and [MASK] reserved): loaded, or learned from `train_texts` and saved."""
    return runs.learn_or_load_tokenizer(
        run_dir, "", train_texts or [], tokenizer_config["vocab_size"], tokenizer_config["lower_case"],
        reserved_tokens=text.PRETRAINING_TOKENS,
    )


# Every task module has its `build_model`; this one is shared with classification (`--init-from`).
build_model = encoders.build_masked_lm


def compile_model(model, config):
    # Labels are 0 where nothing was hidden: the masked loss and accuracy read only the hidden tokens.
    runs.compile_token_prediction(model, config["model"]["d_model"], config["training"])


def train(config, run_dir, verbose=1, overwrite=False):
    """Pre-train, resume or continue in `run_dir` (rules: `run_dir.start`); returns the metrics."""
    with runs.written_by_this_process(run_dir) as writable_run_dir:
        return _train(config, writable_run_dir, verbose, overwrite)


def _train(config, run_dir, verbose, overwrite):
    if config.get("data", {}).get("dataset"):
        config = encoders.with_dataset_path(config)
    config, strategy, state = runs.start(run_dir, config, DEFAULTS[PRETRAINING], overwrite)
    settings = config["training"]
    if state.finished:
        return runs.nothing_to_train(run_dir, state)
    texts = load_texts(config["data"])
    text_tokenizer = tokenizer(run_dir, config["tokenizer"], texts["train"])
    batching = dict(max_length=settings["max_length"], batch_size=settings["batch_size"], rate=settings["mask_rate"])
    train_batches, train_epoch = data.make_pretraining_batches(
        texts["train"], text_tokenizer, shuffle=True, seed=settings["seed"], **batching,
        drop_remainder=strategy.num_replicas_in_sync > 1,  # every replica gets a share of every batch
    )
    val_batches, _ = data.make_pretraining_batches(texts["val"], text_tokenizer, seed=settings["seed"], **batching)
    with strategy.scope():
        model = build_model(config, text_tokenizer.vocab_size)
        compile_model(model, config)
    logger.info("masked language model: %d parameters, %d texts", model.count_params(), len(texts["train"]))
    metrics = fitting.fit_epochs(model, run_dir, state, settings, (train_batches, val_batches, train_epoch),
                              verbose=verbose)
    metrics.update(train_texts=len(texts["train"]), replicas=strategy.num_replicas_in_sync)
    scores = model.evaluate(val_batches, verbose=0, return_dict=True)
    return runs.update_metrics(
        run_dir,
        {"val": {"masked_accuracy": round(float(scores["accuracy"]), 4), "texts": len(texts["val"])},
         "training": metrics},
    )


def load_config(run_dir):
    return runs.load_config(run_dir, DEFAULTS[PRETRAINING])


__all__ = ["build_model", "classifier_config", "load_config", "load_texts", "pretrained_encoder_weights", "train"]
