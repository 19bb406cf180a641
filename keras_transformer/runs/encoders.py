"""What the two encoder tasks share: labelled corpora, class names, and encoders that runs start from.

Classification (`classification.py`) and masked-LM pre-training
(`pretraining.py`) read the same labelled corpora (pre-training takes their
texts and leaves the labels), and a classifier run may start from the
encoder of either kind of run (`train-classifier --init-from RUN_DIR`). Both
task modules import this one and neither imports the other: a task module
never imports another task module.
"""

import os

from keras_transformer import data, models, saving
from keras_transformer.runs import run_dir as runs
from keras_transformer.runs.options import (
    CLASSIFICATION,
    CLASSIFICATION_DATASETS,
    DEFAULTS,
    PRETRAINING,
    SENTIMENT_DATASETS,
    SENTIMENT_LABELS,
)

# -- labelled corpora and their class names --------------------------------------------


def with_dataset_path(config):
    """`--dataset csv:PATH` as the config keeps it: dataset "csv", the path in `data.csv`."""
    dataset = config.get("data", {}).get("dataset")
    if dataset is None:
        return config
    name, _, csv_path = dataset.partition(":")
    if name not in CLASSIFICATION_DATASETS or (name == "csv") != bool(csv_path or config["data"].get("csv")):
        raise _unknown_dataset(dataset)
    updated = {**config, "data": {**config["data"], "dataset": name}}
    if csv_path:
        updated["data"]["csv"] = csv_path
    _also_train_on(updated["data"])  # a wrong name is refused before the run starts
    return updated


def _unknown_dataset(dataset):
    names = ", ".join(name for name in CLASSIFICATION_DATASETS if name != "csv")
    return ValueError(f"dataset must be {names} or csv:PATH, got {dataset!r}")


def load_examples(data_config):
    """`{"train": [(text, label)], "val": [...]}` for the configured corpus.

    `also_train_on` names built-in sentiment corpora (comma-separated) whose training examples
    join the training set (their labels mean what this corpus's do); the
    validation set stays this corpus's own.
    """
    examples = _load_corpus(data_config)
    for extra in _also_train_on(data_config):
        # From its default place ($KERAS_TRANSFORMER_DATA/NAME or ../shared/data/NAME): data_dir is this corpus's.
        examples["train"] = examples["train"] + _load_corpus({**data_config, "dataset": extra, "data_dir": None})["train"]
    for split in ("train", "val"):
        limit = data_config.get(f"limit_{split}")
        if limit:
            examples[split] = examples[split][:limit]
    return examples


def _also_train_on(data_config):
    """The corpus names in `also_train_on` ("sst2,imdb"), each checked."""
    names = [name.strip() for name in (data_config.get("also_train_on") or "").split(",") if name.strip()]
    for name in names:
        if name not in SENTIMENT_DATASETS or name == data_config.get("dataset"):
            others = ", ".join(other for other in SENTIMENT_DATASETS if other != data_config.get("dataset"))
            raise ValueError(f"also_train_on must name {others}, got {name!r}")
    return names


def _load_corpus(data_config):
    dataset = data_config["dataset"]
    if dataset == "sst2":
        examples = data.load_sst2(data_config["data_dir"])
    elif dataset == "imdb":
        examples = data.load_imdb(data_config["data_dir"], data_config["val_fraction"])
    elif dataset == "imdb-sentences":
        examples = data.load_imdb_sentences(data_config["data_dir"], data_config["val_fraction"])
    elif dataset == "csv":
        if not data_config["csv"]:
            raise ValueError("dataset csv needs a file: --dataset csv:PATH")
        examples = data.load_labelled_csv(data_config["csv"], data_config["val_csv"], data_config["val_fraction"])
    else:
        raise _unknown_dataset(dataset)
    return examples


def class_names(data_config, num_classes):
    """The name of each label id: the config's `labels`, the sentiment sets' names, else "0", "1", ..."""
    names = data_config.get("labels")
    if names is None and data_config["dataset"] in SENTIMENT_DATASETS and num_classes == len(SENTIMENT_LABELS):
        names = SENTIMENT_LABELS
    names = [str(name) for name in names] if names is not None else [str(label) for label in range(num_classes)]
    if len(names) != num_classes:
        raise ValueError(f"data.labels names {len(names)} classes; the data has {num_classes}")
    return names


def save_class_names(run_dir, names):
    saving.replace_whole(runs.path(run_dir, runs.LABELS), lambda staging: _write_lines(staging, names))


def load_class_names(run_dir):
    labels_path = runs.path(run_dir, runs.LABELS)
    if not os.path.exists(labels_path):
        raise FileNotFoundError(f"{run_dir} has no {runs.LABELS}: is it a classifier run whose training started?")
    with open(labels_path, encoding="utf-8") as file:
        return file.read().splitlines()


def _write_lines(file_path, lines):
    with open(file_path, "w", encoding="utf-8") as file:
        file.write("\n".join(lines) + "\n")


# -- the two encoder models ----------------------------------------------------------


def build_classifier(config, vocab_size, num_classes):
    """The run's TransformerClassifier, built (weights made), not trained."""
    # A classifier started from a pre-trained encoder has that encoder's position table (`model.max_length`).
    arguments = {"max_length": config["training"]["max_length"], **config["model"]}
    model = models.TransformerClassifier(vocab_size=vocab_size, num_classes=num_classes, **arguments)
    model.build((None, None))
    return model


def build_masked_lm(config, vocab_size):
    """The run's MaskedLanguageModel, built (weights made), not trained."""
    model = models.MaskedLanguageModel(
        vocab_size=vocab_size, max_length=config["training"]["max_length"], **config["model"]
    )
    model.build((None, None))
    return model


# -- a classifier started from another run's encoder (--init-from) -----------------------

# What a classifier started from a pre-trained encoder takes over from its run.
ENCODER_SETTINGS = ("num_layers", "d_model", "num_heads", "d_ff", "norm_first", "position", "epsilon", "activation")


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
        num_classes = len(load_class_names(init_from))
        model = runs.load_trained_model(init_from, lambda: build_classifier(config, vocab_size, num_classes))
    else:
        model = runs.load_trained_model(init_from, lambda: build_masked_lm(config, vocab_size))
    return model.encoder.get_weights()
