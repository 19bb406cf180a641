"""Which parts of the package run on which Keras backend.

`layers` and `models` are written in `keras.ops` and run on TensorFlow, JAX
and PyTorch alike (the same weights give the same outputs). What is
TensorFlow by nature stays TensorFlow: `tf.data` pipelines and
tensorflow-text tokenizers (`data`, `text`, usable from any backend, as
TensorFlow code beside it), and the parts that run our models inside
TensorFlow graphs and strategies: `training` (`tf.distribute`, the fused
optimizer, the custom-gradient loss), `inference` (searches in
`tf.while_loop`), `export` (SavedModels) and `tensorboard_loggers`, which
fail at once in one line when imported under another backend; `runs`
builds on them, and the command line sets another backend aside.
"""

import keras

TENSORFLOW = "tensorflow"


class BackendError(ImportError):
    """A TensorFlow-only part of the package was imported under another Keras backend."""


def require_tensorflow(package, because):
    """Raise `BackendError` unless Keras runs on TensorFlow.

    Example:
    >>> require_tensorflow("keras_transformer.export", "a SavedModel is a TensorFlow graph")
    """
    backend = keras.backend.backend()
    if backend != TENSORFLOW:
        raise BackendError(
            f"{package} runs on TensorFlow ({because}), and this process uses Keras' {backend} "
            "backend: set KERAS_BACKEND=tensorflow for it (layers and models run on every backend)"
        )
