"""Pre-training runs: what `keras-transformer pretrain` does, and what `train-classifier --init-from` takes.

    unlabelled texts (data) -> WordPiece vocabulary with [CLS] and [MASK] (text)
      -> "[CLS] pieces ..." batches, 15% of the tokens hidden (data.mask_tokens)
      -> MaskedLanguageModel (models) -> model.fit (training) -> model.keras

The texts are a file's lines (`--text FILE`) or a classification corpus's
texts, its labels unused (`--dataset sst2|imdb|imdb-sentences|csv:PATH`: its training texts
to learn from, its validation texts to validate on). A classifier run
started with `--init-from RUN_DIR` takes the run's vocabulary, the encoder's
sizes and its weights (`classifier_config`, `pretrained_encoder_weights`);
RUN_DIR may also be another classifier's run, whose encoder learned from
other labels (SST-2's recipe starts from one trained on IMDB's sentences).
"""

import logging
import os
import random

from keras_transformer import data, models, text, training
from keras_transformer.runs import classification
from keras_transformer.runs import run_dir as runs
from keras_transformer.runs.options import CLASSIFICATION, DEFAULTS, PRETRAINING

logger = logging.getLogger("keras_transformer")

# What a classifier started from a pre-trained encoder takes over from its run.
ENCODER_SETTINGS = ("num_layers", "d_model", "num_heads", "d_ff", "norm_first", "position", "epsilon", "activation")


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
        examples = classification.load_examples(data_config)
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


def build_model(config, vocab_size):
    model = models.MaskedLanguageModel(
        vocab_size=vocab_size, max_length=config["training"]["max_length"], **config["model"]
    )
    model.build((None, None))
    return model


def compile_model(model, config):
    settings = config["training"]
    model.compile(
        optimizer=training.transformer_optimizer(
            config["model"]["d_model"], settings["warmup_steps"], settings["learning_rate_scale"],
            ema_momentum=settings["ema_momentum"],
        ),
        # Labels are 0 where nothing was hidden: the masked loss and accuracy read only the hidden tokens.
        loss=training.MaskedSparseCrossEntropy(),
        metrics=[training.MaskedAccuracy(), training.Perplexity()],
        jit_compile=settings["jit_compile"],
    )
    training.build_optimizer_variables(model)


def train(config, run_dir, verbose=1, overwrite=False):
    """Pre-train, resume or continue in `run_dir` (rules: `run_dir.start`); returns the metrics."""
    with runs.written_by_this_process(run_dir) as writable_run_dir:
        return _train(config, writable_run_dir, verbose, overwrite)


def _train(config, run_dir, verbose, overwrite):
    if config.get("data", {}).get("dataset"):
        config = classification.with_dataset_path(config)
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
    callbacks = runs.training_callbacks(
        run_dir, settings, state, epoch_variables=[train_epoch], averaged_weights=settings["ema_momentum"] is not None
    )
    if settings["steps_per_epoch"]:
        train_batches = train_batches.repeat()
    metrics = runs.fit(
        model, run_dir, state, train_batches,
        dict(validation_data=val_batches, epochs=settings["epochs"], steps_per_epoch=settings["steps_per_epoch"],
             verbose=verbose),
        callbacks,
    )
    metrics.update(train_texts=len(texts["train"]), replicas=strategy.num_replicas_in_sync)
    scores = model.evaluate(val_batches, verbose=0, return_dict=True)
    return runs.update_metrics(
        run_dir,
        {"val": {"masked_accuracy": round(float(scores["accuracy"]), 4), "texts": len(texts["val"])},
         "training": metrics},
    )


def load_config(run_dir):
    return runs.load_config(run_dir, DEFAULTS[PRETRAINING])


# -- what a classifier takes over ------------------------------------------------------


def _check_can_start_a_classifier(run_dir):
    if not os.path.exists(runs.path(run_dir, runs.CONFIG)):
        raise FileNotFoundError(f"--init-from {run_dir}: no such run (it has no {runs.CONFIG})")
    task = runs.task_of(run_dir)
    if task not in (PRETRAINING, CLASSIFICATION):
        raise ValueError(
            f"--init-from needs a pre-training run (keras-transformer pretrain) or a classifier run; {run_dir} is a {task} run"
        )
    # A run stopped midway still has its best epoch's weights (load_trained_model falls back to them).
    if not any(os.path.exists(runs.path(run_dir, name)) for name in (runs.MODEL, runs.BEST_CHECKPOINT)):
        raise FileNotFoundError(
            f"--init-from {run_dir}: its training has not finished an epoch (no {runs.MODEL}, no checkpoint)"
        )


def _config_of(run_dir):
    """The config of a pre-training or classifier run, with its task's defaults."""
    return runs.load_config(run_dir, DEFAULTS[runs.task_of(run_dir)])


def classifier_config(config):
    """A classifier's `config` with the encoder sizes of its `training.init_from` run (unchanged without one).

    That run pre-trained an encoder, or trained a classifier on another
    labelled task (intermediate-task training: IMDB's review labels before
    SST-2's). The encoder's shape must be that run's; the classifier keeps
    its own dropout, pooling and training settings. Its texts may not be
    longer than that run's position table.
    """
    init_from = config.get("training", {}).get("init_from")
    if not init_from:
        return config
    _check_can_start_a_classifier(init_from)
    pretrained = _config_of(init_from)
    model = dict(config.get("model", {}))
    for name in ENCODER_SETTINGS:
        if name in pretrained["model"]:
            if name in model and model[name] != pretrained["model"][name]:
                raise ValueError(
                    f"--init-from {init_from}: its encoder has {name}={pretrained['model'][name]}, "
                    f"this classifier asks for {model[name]}; leave {name} out"
                )
            model[name] = pretrained["model"][name]
    # The position table's size is that run's (a classifier started from another keeps that one's);
    # the classifier cuts its texts to its own max_length.
    model["max_length"] = pretrained["model"].get("max_length") or pretrained["training"]["max_length"]
    max_length = config.get("training", {}).get("max_length", DEFAULTS[CLASSIFICATION]["training"]["max_length"])
    if max_length > model["max_length"]:
        raise ValueError(
            f"--init-from {init_from}: max_length {max_length} is longer than that run's "
            f"{model['max_length']}; its encoder never saw later positions"
        )
    tokenizer_config = dict(config.get("tokenizer", {}), **pretrained["tokenizer"])
    return {**config, "model": model, "tokenizer": tokenizer_config}


def pretrained_vocabulary(init_from):
    """The `init_from` run's tokenizer, which the classifier run saves as its own."""
    return runs.load_tokenizer(init_from)


def pretrained_encoder_weights(init_from):
    """The weights of the `init_from` run's encoder (`model.keras`), for `encoder.set_weights`."""
    config = _config_of(init_from)
    vocab_size = runs.load_tokenizer(init_from).vocab_size
    if config["task"] == CLASSIFICATION:
        num_classes = len(classification.load_class_names(init_from))
        model = runs.load_trained_model(init_from, lambda: classification.build_model(config, vocab_size, num_classes))
    else:
        model = runs.load_trained_model(init_from, lambda: build_model(config, vocab_size))
    return model.encoder.get_weights()


__all__ = ["build_model", "classifier_config", "load_config", "load_texts", "pretrained_encoder_weights", "train"]
