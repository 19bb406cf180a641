"""keras-transformer: "Attention Is All You Need" in readable Keras 3 layers.

>>> import keras_transformer as kt
>>> model = kt.models.Transformer.from_preset("small", src_vocab_size=8000, tgt_vocab_size=8000)
>>> kt.tensorboard_loggers.AttentionMapLogger   # the other packages load on first use
"""

import importlib
import importlib.util
import os
import sys

from keras_transformer import startup  # the standard library only

__version__ = "0.1.0"

# Imported when first used, so that `import keras_transformer` (all a saved
# model needs) does not pull in tensorflow-text, sacrebleu or matplotlib.
_LAZY = ("data", "evaluation", "export", "inference", "runs", "tensorboard_loggers", "text", "training", "visualization")

# Importing the layers and models registers them with Keras, so that a saved
# model loads with plain `keras.saving.load_model` after `import
# keras_transformer`. The `keras-transformer` command is the exception: it
# imports what a command needs once it runs, so that parsing arguments (and
# `--help`) does not wait seconds for TensorFlow to start; and so is
# `tensorboard`, which loads the Attention tab's plugin and needs no model.
# The scripts in examples/ start TensorFlow as the command does, without its
# start-up lines (startup.py says why they need catching).
_IMPORTS_LATER = ("keras-transformer", "tensorboard")
# A device runs a LiteRT export with no Keras installed (`on_device`, `device_tokenizers`): the layers
# and models load at once only where Keras is there to load them.
if (os.path.basename((getattr(sys, "argv", None) or [""])[0]) not in _IMPORTS_LATER
        and importlib.util.find_spec("keras") is not None):
    if startup.is_an_example():
        startup.start_tensorflow_quietly()
    from keras_transformer import layers, models  # noqa: F401


def __getattr__(name):
    if name in _LAZY or name in ("layers", "models"):
        return importlib.import_module(f"keras_transformer.{name}")
    raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")


__all__ = ["layers", "models", "__version__", *_LAZY]
