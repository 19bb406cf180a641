"""A trained text classifier as one SavedModel: raw strings in, class names out.

The classifier's counterpart of `export_translator`: the WordPiece tokenizer
that made the training batches, the encoder, the pooling and the linear head
are one graph of TensorFlow and tensorflow-text ops, so the stock
`tensorflow_model_server` serves it and a client sends plain text.

    text -> [CLS] + WordPiece ids, cut to max_length -> encoder -> pooled embedding
         -> linear head -> logits -> softmax -> probabilities -> argmax -> label

The export is written the way `export_translator` writes one: version
`EXPORT_BASE/<version>/` (see `versions`); `assets.extra/classifier.json`
records the label names, `max_length` and the model's sizes.

Signature `serving_default` (see `CLASSIFIER_SIGNATURES`):
`text` (string `[batch]`) -> `label` (string `[batch]`, the class name),
`label_id` (int32 `[batch]`), `probabilities` (float32 `[batch, num_classes]`,
the softmax of the logits) and `embedding` (float32 `[batch, d_model]`, the
pooled sentence embedding the head sees).

`text` is checked in the graph exactly as the translator's is (see
`requests`): anything but a string vector is refused with an
`InvalidArgument` error naming `text`. Within that shape every request gets a prediction: an
empty string is classified from [CLS] alone, a text longer than `max_length`
pieces is cut as in training, bytes that are not UTF-8 are replaced by
U+FFFD, and an empty batch gives empty outputs.
"""

import tensorflow as tf

from keras_transformer.export.requests import TEXT, checked_sentences
from keras_transformer.export.versions import version_path, write_version
from keras_transformer.inference.tracing import graph_function
from keras_transformer.text import CLS

CLASSIFIER_SIGNATURES = {"serving_default": ("text",)}
OUTPUTS = ("label", "label_id", "probabilities", "embedding")


class ClassificationService:
    """The `serving_default` signature of a classifier export.

    Args:
        model: a trained `keras_transformer.models.TransformerClassifier`.
        tokenizer: the `WordPieceTokenizer` it was trained with (its
            vocabulary has [CLS]).
        max_length: ids per text, [CLS] included, as in training; longer
            texts are cut.
        labels: the class names, one per logit.

    Example:
    >>> service = ClassificationService(model, tokenizer, 64, ["negative", "positive"])
    >>> service.serve(tf.constant(["A gripping, funny film."]))["label"]   # [b"positive"]
    """

    def __init__(self, model, tokenizer, max_length, labels):
        self.model = model
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.labels = list(labels)

    @graph_function(input_signature=[TEXT])
    def serve(self, text):
        ids = self.tokenizer.tokenize_with_cls(checked_sentences(text), self.max_length)
        # One encoder pass gives both the embedding and the logits.
        pooled = self.model.embed(ids, training=False)
        logits = self.model.head(pooled, training=False)
        label_id = tf.argmax(logits, axis=-1, output_type=tf.int32)
        return {
            "label": tf.gather(tf.constant(self.labels, tf.string), label_id),
            "label_id": label_id,
            "probabilities": tf.nn.softmax(logits, axis=-1),
            "embedding": tf.cast(pooled, tf.float32),
        }

    def signatures(self):
        return {"serving_default": self.serve.get_concrete_function()}

    def saveable(self):
        """The object to hand to `tf.saved_model.save` beside `signatures()`: the model's `tf.Variable`s.

        The variables inside the Keras variables, not the Keras wrappers, as
        for the translator (see `TranslationService.saveable`): saving the
        wrappers makes a Session-based loader restore copies the function
        never reads.
        """
        root = tf.Module(name="classification_service")
        root.model_variables = [variable.value for variable in self.model.variables]
        return root


def export_classifier(model, tokenizer, max_length, export_base, labels=None, version=None):
    """Write `model` with its tokenizer as SavedModel version `version` under `export_base`.

    Args:
        model: a trained `keras_transformer.models.TransformerClassifier`.
        tokenizer: the `WordPieceTokenizer` it was trained with (learned with
            `reserved_tokens=keras_transformer.text.CLASSIFIER_TOKENS`).
        max_length: ids per text, [CLS] included: the training pipeline's
            `max_length`, at most the model's.
        export_base: the directory TensorFlow Serving watches.
        labels: the class names, one per class, e.g. `["negative",
            "positive"]`; default "0", "1", ...
        version: a positive integer; default one more than the highest
            version already there (1 for a new directory). An existing
            version is refused before anything is written.

    Returns:
        The path of the new version directory.

    Example:
    >>> export_classifier(model, tokenizer, 64, "exports/sentiment", labels=["negative", "positive"])
    'exports/sentiment/1'
    """
    version_path(export_base, version)  # a taken version is refused before anything is traced
    labels = _checked_arguments(model, tokenizer, max_length, labels)
    service = ClassificationService(model, tokenizer, max_length, labels)
    return write_version(export_base, version, service, "classifier.json", _settings(service))


def _checked_arguments(model, tokenizer, max_length, labels):
    """The label names to export; a ValueError for a tokenizer, length or labels that do not fit the model."""
    if model.vocab_size != tokenizer.vocab_size:
        raise ValueError(
            f"the model has {model.vocab_size} token ids but the tokenizer's vocabulary has {tokenizer.vocab_size}"
        )
    if CLS not in tokenizer.vocab:
        raise ValueError(f"the tokenizer has no {CLS} token: learn it with reserved_tokens=CLASSIFIER_TOKENS")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or not 1 <= max_length <= model.max_length:
        raise ValueError(f"max_length must be an integer in [1, {model.max_length}] (the model's), got {max_length!r}")
    if labels is None:
        return [str(class_id) for class_id in range(model.num_classes)]
    labels = list(labels)
    if len(labels) != model.num_classes or not all(isinstance(label, str) for label in labels):
        raise ValueError(f"labels must be {model.num_classes} strings, one per class; got {labels!r}")
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels must be distinct, got {labels!r}")
    return labels


def _settings(service):
    """What `assets.extra/classifier.json` records: the label names, `max_length` and the model's sizes."""
    model = service.model
    return {
        "labels": service.labels,
        "max_length": service.max_length,
        "vocab_size": model.vocab_size,
        "lower_case": service.tokenizer.lower_case,
        "num_classes": model.num_classes,
        "num_layers": model.num_layers,
        "d_model": model.d_model,
        "num_heads": model.num_heads,
        "pooling": model.pooling,
        "signatures": {name: list(inputs) for name, inputs in CLASSIFIER_SIGNATURES.items()},
        "outputs": list(OUTPUTS),
    }
