"""keras-transformer: "Attention Is All You Need" in readable Keras 3 layers.

>>> import keras_transformer as kt
>>> model = kt.models.Transformer.from_preset("small", src_vocab_size=8000, tgt_vocab_size=8000)
>>> kt.callbacks.AttentionMapLogger   # the other packages load on first use
"""

import importlib

from keras_transformer import layers, models

__version__ = "0.1.0"

# Imported when first used, so that `import keras_transformer` (all a saved
# model needs) does not pull in tensorflow-text, sacrebleu or matplotlib.
_LAZY = ("callbacks", "data", "evaluation", "export", "inference", "runs", "text", "training", "visualization")


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f"keras_transformer.{name}")
    raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")


__all__ = ["layers", "models", "__version__", *_LAZY]
