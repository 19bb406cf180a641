"""A sentiment (text classification) run on disk: what `keras-transformer train-classifier` works on.

    RUN_DIR/
      config.json      everything needed to rebuild data, tokenizer and model
      vocab/           the WordPiece vocabulary, with a [CLS] token
      model.keras      the trained TransformerClassifier (best validation checkpoint)
      checkpoints/ backup/ history.csv   as for translation runs
      logs/            TensorBoard: train, validation, embeddings (projector + PCA)
      metrics.json     validation accuracy and training figures

The encoder-only path of the sentiment tutorials: "[CLS] tokens ..." in, the
final state of [CLS] through a linear head out. Like `runs`, this module
wires data, tokenizer, model and training together for the CLI.
"""

import logging
import os
import time

import keras
import tensorflow as tf

from keras_transformer import data, models, saving, text, training
from keras_transformer.callbacks import EmbeddingProjectorLogger
from keras_transformer.runs import fit_run, nothing_to_train, start_run

logger = logging.getLogger("keras_transformer")

CLS = "[CLS]"
CLASSIFIER_TOKENS = list(text.RESERVED_TOKENS) + [CLS]

DEFAULT_CONFIG = {
    "data": {
        "dataset": "sst2",  # sst2 | imdb | csv
        "data_dir": None,
        "csv": None,  # dataset csv: a file with text and label columns
        "val_csv": None,
        "val_fraction": 0.1,  # imdb and csv without val_csv: held back from train
        "limit_train": None,
        "limit_val": None,
    },
    "tokenizer": {"vocab_size": 8000, "lower_case": True},
    "model": {"num_layers": 2, "d_model": 128, "num_heads": 4, "d_ff": 256, "dropout": 0.1, "pooling": "cls"},
    "training": {
        "epochs": 3,
        "max_length": 64,
        "batch_size": 64,
        "warmup_steps": 1000,
        "learning_rate_scale": 1.0,
        "weight_decay": None,  # AdamW's decoupled decay of weight matrices, e.g. 0.1
        # Validate and keep a moving average of the weights (over ~1/(1 - m)
        # steps), e.g. 0.998; None: the weights of the epoch's last step.
        "ema_momentum": None,
        "steps_per_epoch": None,
        "early_stopping": None,
        # The checkpoint kept (and early stopping) follow validation accuracy:
        # a classifier's loss can rise while it gets more examples right.
        "monitor": "val_accuracy",
        "strategy": "auto",
        "cpu_replicas": None,
        "precision": "float32",
        "jit_compile": False,
        "seed": 0,
        "projector_samples": 500,
    },
}


def load_examples(data_config):
    """`{"train": [(text, label)], "val": [...]}` for the configured corpus."""
    dataset = data_config["dataset"]
    if dataset == "sst2":
        examples = data.load_sst2(data_config["data_dir"])
    elif dataset == "imdb":
        examples = data.load_imdb(data_config["data_dir"], data_config["val_fraction"])
    elif dataset == "csv":
        if not data_config["csv"]:
            raise ValueError("dataset csv needs a file: --dataset csv:PATH")
        examples = data.load_labelled_csv(data_config["csv"], data_config["val_csv"], data_config["val_fraction"])
    else:
        raise ValueError(f"dataset must be sst2, imdb or csv:PATH, got {dataset!r}")
    for split in ("train", "val"):
        limit = data_config[f"limit_{split}"]
        if limit:
            examples[split] = examples[split][:limit]
    return examples


def encode(tokenizer, texts, max_length):
    """`(batch, <= max_length)` int32 ids: [CLS] first, then the text's pieces, cut to fit."""
    pieces = tokenizer.tokenize(texts, add_start_end=False)[:, : max_length - 1]
    cls_column = tf.fill([pieces.nrows(), 1], tokenizer.vocab.index(CLS))
    return tf.concat([cls_column, pieces], axis=1).to_tensor()


def classification_batches(examples, tokenizer, max_length, batch_size, shuffle=False, seed=0, drop_remainder=False):
    """A tf.data pipeline of `(ids, label)` batches, tokenized in the pipeline.

    Returns `(dataset, epoch)`: with `shuffle`, `epoch` is the variable that
    sets each pass's order (see `data.shuffle_each_epoch`), else None.
    """
    texts = tf.constant([example_text for example_text, _ in examples], tf.string)
    labels = tf.constant([label for _, label in examples], tf.int32)
    dataset = tf.data.Dataset.from_tensor_slices((texts, labels))
    epoch = None
    if shuffle:
        dataset, epoch = data.shuffle_each_epoch(dataset, len(examples), seed)
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    dataset = dataset.map(lambda batch, y: (encode(tokenizer, batch, max_length), y), num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE), epoch


def train_classifier(config, run_dir, verbose=1, overwrite=False):
    """Train, resume or continue a classification run in `run_dir` (rules: `runs.start_run`); returns the metrics dict."""
    config, strategy, state = start_run(run_dir, config, DEFAULT_CONFIG, overwrite=overwrite)
    settings = config["training"]
    if state.finished:
        return nothing_to_train(run_dir, state)
    examples = load_examples(config["data"])

    vocab_dir = os.path.join(run_dir, "vocab")
    if os.path.exists(os.path.join(vocab_dir, "vocab.txt")):
        tokenizer = text.WordPieceTokenizer.load(vocab_dir)
    else:
        started = time.time()
        tokenizer = text.WordPieceTokenizer.learn(
            [example_text for example_text, _ in examples["train"]],
            vocab_size=config["tokenizer"]["vocab_size"],
            lower_case=config["tokenizer"]["lower_case"],
            reserved_tokens=CLASSIFIER_TOKENS,
        )
        tokenizer.save(vocab_dir)
        logger.info("learned a vocabulary of %d tokens in %.0fs", tokenizer.vocab_size, time.time() - started)

    max_length, batch_size = settings["max_length"], settings["batch_size"]
    replicas = strategy.num_replicas_in_sync
    train, train_epoch = classification_batches(
        examples["train"], tokenizer, max_length, batch_size, shuffle=True, seed=settings["seed"],
        drop_remainder=replicas > 1,  # every replica gets a share of every batch
    )
    val, _ = classification_batches(examples["val"], tokenizer, max_length, batch_size)
    num_classes = max(label for _, label in examples["train"] + examples["val"]) + 1
    with strategy.scope():
        model = models.TransformerClassifier(
            vocab_size=tokenizer.vocab_size, num_classes=num_classes, max_length=max_length, **config["model"]
        )
        model.build((None, None))
        model.compile(
            optimizer=training.transformer_optimizer(
                config["model"]["d_model"],
                settings["warmup_steps"],
                settings["learning_rate_scale"],
                weight_decay=settings["weight_decay"],
                ema_momentum=settings["ema_momentum"],
            ),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=settings["jit_compile"],
        )
        training.build_optimizer_variables(model)
    logger.info("model: %d parameters, %d replica(s)", model.count_params(), replicas)

    callbacks = training.training_callbacks(
        run_dir, settings["early_stopping"], monitor=settings["monitor"],
        averaged_weights=settings["ema_momentum"] is not None,
        epoch_variables=[train_epoch], best_so_far=state.best_so_far,
    )
    sample = examples["val"][: settings["projector_samples"]]
    if len(sample) >= 3:
        sample_texts = [example_text for example_text, _ in sample]
        callbacks.append(
            EmbeddingProjectorLogger(
                encode(tokenizer, tf.constant(sample_texts), max_length).numpy(),
                [label for _, label in sample],
                sample_texts,
                os.path.join(run_dir, "logs", "embeddings"),
            )
        )
    if settings["steps_per_epoch"]:
        train = train.repeat()
    history, seconds, stopped_early_after = fit_run(
        model, run_dir, state, train,
        dict(validation_data=val, epochs=settings["epochs"], steps_per_epoch=settings["steps_per_epoch"], verbose=verbose),
        callbacks,
    )
    _, accuracy = model.evaluate(val, verbose=0)
    epochs_run = len(history.epoch)
    metrics = {
        "val": {"accuracy": round(float(accuracy), 4), "examples": len(examples["val"])},
        "training": {
            "train_examples": len(examples["train"]),
            "epochs_done": state.epochs_done + epochs_run,
            "stopped_early_after": stopped_early_after,
            "epochs_this_session": epochs_run,
            "seconds_this_session": round(seconds, 1),
            "seconds_per_epoch": round(seconds / max(epochs_run, 1), 1),
            "parameters": model.count_params(),
            "replicas": replicas,
        },
    }
    saving.write_json(os.path.join(run_dir, "metrics.json"), metrics)
    return metrics


__all__ = ["CLS", "DEFAULT_CONFIG", "classification_batches", "encode", "load_examples", "train_classifier"]
