"""Text classification runs: what `keras-transformer train-classifier|classify|evaluate|export` do.

    labelled texts (data) -> WordPiece vocabulary with [CLS] (text)
      -> "[CLS] pieces ..." batches (data) -> TransformerClassifier (models)
      -> model.fit (training) -> model.keras in the run directory
      -> label and probability per text; accuracy, F1, confusion (evaluation)
      -> SavedModel for TensorFlow Serving (export)

The encoder-only path of the sentiment tutorials: the final state of [CLS]
through a linear head. Like `translation`, this module only wires the floors
together; the run directory is `run_dir`'s, the settings are `options`'.
A classifier run also keeps its class names (`labels.txt`), for `classify`
and the export.
"""

import functools
import logging
import os

import keras
import numpy as np
import tensorflow as tf

from keras_transformer import data, evaluation, text, training
from keras_transformer.lines import answer_each
from keras_transformer.tensorboard_loggers import ClassifierAttentionLogger, EmbeddingProjectorLogger
from keras_transformer.runs import encoders
from keras_transformer.runs import fitting
from keras_transformer.runs import run_dir as runs
from keras_transformer.runs.encoders import (  # noqa: F401 (load_examples, with_dataset_path: the task's own API too)
    class_names,
    load_class_names,
    load_examples,
    save_class_names,
    with_dataset_path,
)
from keras_transformer.runs.options import CLASSIFICATION, DEFAULTS

logger = logging.getLogger("keras_transformer")

# -- tokenizer ----------------------------------------------------------------------


def tokenizer(run_dir, tokenizer_config, train_texts=None):
    """The run's tokenizer (vocabulary with [CLS]): loaded, or learned from `train_texts` and saved."""
    return runs.learn_or_load_tokenizer(
        run_dir, "", train_texts or [], tokenizer_config["vocab_size"], tokenizer_config["lower_case"],
        reserved_tokens=text.CLASSIFIER_TOKENS,
    )


# -- model ---------------------------------------------------------------------------

# Every task module has its `build_model`; a classifier's is shared with pre-training (`--init-from`).
build_model = encoders.build_classifier


def compile_model(model, config):
    settings = config["training"]
    model.compile(
        optimizer=training.transformer_optimizer(
            config["model"]["d_model"],
            settings["warmup_steps"],
            settings["learning_rate_scale"],
            weight_decay=settings["weight_decay"],
            ema_momentum=settings["ema_momentum"],
            accumulate_steps=settings["accumulate_steps"],
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=settings["jit_compile"],
    )
    training.build_optimizer_variables(model)


# -- the commands ------------------------------------------------------------------


def train(config, run_dir, verbose=1, overwrite=False):
    """Train, resume or continue a classification run in `run_dir` (rules: `run_dir.start`); returns the metrics."""
    # On a cluster, only the chief writes `run_dir` (see `run_dir.written_by_this_process`).
    with runs.written_by_this_process(run_dir) as writable_run_dir:
        return _train(config, writable_run_dir, verbose, overwrite)


def _train(config, run_dir, verbose, overwrite):
    config = encoders.classifier_config(with_dataset_path(config))
    config, strategy, state = runs.start(run_dir, config, DEFAULTS[CLASSIFICATION], overwrite)
    settings = config["training"]
    if state.finished:
        return runs.nothing_to_train(run_dir, state)
    if settings["init_from"] and not os.path.exists(os.path.join(runs.vocab_path(run_dir), text.TOKENIZER_SETTINGS)):
        encoders.pretrained_vocabulary(settings["init_from"]).save(runs.vocab_path(run_dir))
    examples = load_examples(config["data"])
    num_classes = max(label for _, label in examples["train"] + examples["val"]) + 1
    save_class_names(run_dir, class_names(config["data"], num_classes))
    text_tokenizer = tokenizer(run_dir, config["tokenizer"], [example_text for example_text, _ in examples["train"]])

    max_length, batch_size = settings["max_length"], settings["batch_size"]
    replicas = strategy.num_replicas_in_sync
    train_batches, train_epoch = data.make_classification_batches(
        examples["train"], text_tokenizer, max_length, batch_size, shuffle=True, seed=settings["seed"],
        drop_remainder=replicas > 1,  # every replica gets a share of every batch
    )
    val_batches, _ = data.make_classification_batches(examples["val"], text_tokenizer, max_length, batch_size)
    with strategy.scope():
        model = build_model(config, text_tokenizer.vocab_size, num_classes)
        compile_model(model, config)
    if settings["init_from"] and not state.epochs_done and not state.batches_done:
        # A fresh start; a resumed run restores its own weights from the backup.
        model.encoder.set_weights(encoders.pretrained_encoder_weights(settings["init_from"]))
        logger.info("encoder initialised from %s", settings["init_from"])
    logger.info("model: %d parameters, %d replica(s)", model.count_params(), replicas)

    samples = _sample_callbacks(run_dir, settings, config["model"]["pooling"], examples["val"], text_tokenizer)
    training_metrics = fitting.fit_epochs(model, run_dir, state, settings, (train_batches, val_batches, train_epoch),
                                       samples, verbose)
    training_metrics.update(train_examples=len(examples["train"]), replicas=replicas)
    _, accuracy = model.evaluate(val_batches, verbose=0)
    return runs.update_metrics(
        run_dir,
        {"val": {"accuracy": round(float(accuracy), 4), "examples": len(examples["val"])}, "training": training_metrics},
    )


def _sample_callbacks(run_dir, settings, pooling, val_examples, text_tokenizer):
    """The callbacks that watch a few validation texts: their attention, and their embeddings in the projector."""
    callbacks = []
    sample = val_examples[: max(settings["projector_samples"], settings["attention_samples"])]
    # Only [CLS] rows and attention pooling show what the label was read from.
    if settings["attention_samples"] and pooling in ClassifierAttentionLogger.POOLINGS:
        watched = sample[: settings["attention_samples"]]
        callbacks.append(
            ClassifierAttentionLogger(
                text_tokenizer.tokenize_with_cls(
                    tf.constant([text for text, _ in watched]), settings["max_length"]
                ).numpy(),
                [text for text, _ in watched],
                [label for _, label in watched],
                text_tokenizer,
                runs.log_path(run_dir, "samples"),
                class_names=load_class_names(run_dir),
            )
        )
    sample = sample[: settings["projector_samples"]]
    if len(sample) >= 3:
        sample_texts = [example_text for example_text, _ in sample]
        callbacks.append(
            EmbeddingProjectorLogger(
                text_tokenizer.tokenize_with_cls(tf.constant(sample_texts), settings["max_length"]).numpy(),
                [label for _, label in sample],
                sample_texts,
                runs.log_path(run_dir, "embeddings"),
            )
        )
    return callbacks


def load_config(run_dir):
    return runs.load_config(run_dir, DEFAULTS[CLASSIFICATION])


class Classifier:
    """A trained run's model, tokenizer and class names: texts in, labels and probabilities out."""

    def __init__(self, run_dir):
        self.config = load_config(run_dir)
        self.class_names = load_class_names(run_dir)
        self.tokenizer = tokenizer(run_dir, self.config["tokenizer"])
        self.max_length = self.config["training"]["max_length"]
        self.model = runs.load_trained_model(
            run_dir, lambda: build_model(self.config, self.tokenizer.vocab_size, len(self.class_names))
        )

    def token_ids(self, texts):
        return self.tokenizer.tokenize_with_cls(tf.constant(list(texts), tf.string), self.max_length)

    def probabilities(self, texts, batch_size=64):
        """`(len(texts), classes)` float32 softmax probabilities."""
        texts = list(texts)
        batches = [np.zeros((0, len(self.class_names)), np.float32)]
        for start in range(0, len(texts), batch_size):
            logits = self.model(self.token_ids(texts[start : start + batch_size]), training=False)
            batches.append(keras.ops.convert_to_numpy(keras.ops.softmax(logits)))
        return np.concatenate(batches)

    def classify(self, texts, batch_size=64):
        """`[(label name, its probability)]`, one per text; a blank text has nothing to classify: `(None, None)`."""
        def classify_all(texts):
            probabilities = self.probabilities(texts, batch_size)
            return [(self.class_names[int(row.argmax())], float(row.max())) for row in probabilities]

        return answer_each(texts, classify_all, (None, None))


def classify(run_dir, texts):
    return Classifier(run_dir).classify(texts)


def evaluate(run_dir, csv_path=None, batch_size=None):
    """Accuracy, per-class precision/recall/F1 and the confusion matrix on the run's validation set or a CSV.

    The CSV needs `text` and `label` columns (label ids, as in training); a
    bad row fails with its file and line. The validation set's scores are
    recorded in `metrics.json`.
    """
    classifier = Classifier(run_dir)
    if csv_path:
        examples = data.read_labelled(csv_path, num_classes=len(classifier.class_names))
    else:
        examples = load_examples(classifier.config["data"])["val"]
    probabilities = classifier.probabilities(
        [example_text for example_text, _ in examples], batch_size or classifier.config["evaluation"]["batch_size"]
    )
    scores = evaluation.classification_scores(
        probabilities.argmax(axis=-1).tolist(), [label for _, label in examples], classifier.class_names
    )
    scores["data"] = csv_path or "val"
    if not csv_path:
        runs.update_metrics(run_dir, {"val": scores})
    return scores


def describe_saved_model(path):
    """What `export` tells the user of a classifier's export: its signature."""
    return ["signature: serving_default (text -> label, label_id, probabilities, embedding)"]


def export(run_dir, export_base, version=None):
    """Write the run's classifier as `export_base/<version>/` for TensorFlow Serving; returns the path."""
    from keras_transformer.export import export_classifier, version_path

    version_path(export_base, version)  # a taken version fails before the model is loaded
    classifier = Classifier(run_dir)
    return export_classifier(
        classifier.model, classifier.tokenizer, classifier.max_length, export_base,
        labels=classifier.class_names, version=version,
    )


def export_litert(run_dir, out_dir, quantization=None, ops="text", web=False):
    """Write the run's classifier as a LiteRT file in the new directory `out_dir` (`export.litert`); returns it.

    `web`: a page around a builtin file, which classifies offline in a browser (`export.web`).
    """
    from keras_transformer.export import litert, web as pages

    litert.check_request(out_dir, quantization, ops)  # before the model is loaded
    classifier = Classifier(run_dir)
    service = litert.LiteRTClassification(classifier.model, classifier.tokenizer, classifier.max_length,
                                          classifier.class_names, ops, fixed_rows=1 if web else None)
    held_out = {"text": runs.held_out_texts(lambda: [text for text, _ in load_examples(classifier.config["data"])["val"]])}
    if web:
        return pages.export_web(service, out_dir, quantization, held_out)
    return litert.export_litert(service, out_dir, quantization, held_out)


export_web = functools.partial(export_litert, ops="builtin", web=True)  # `export --format web`


__all__ = [
    "Classifier",
    "build_model",
    "class_names",
    "classify",
    "evaluate",
    "export",
    "load_config",
    "load_examples",
    "train",
]
