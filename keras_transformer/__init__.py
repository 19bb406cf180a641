"""keras-transformer: "Attention Is All You Need" in readable Keras 3 layers.

>>> import keras_transformer as kt
>>> model = kt.models.Transformer.from_preset("small", src_vocab_size=8000, tgt_vocab_size=8000)
"""

from keras_transformer import layers, models

__version__ = "0.1.0"

__all__ = ["layers", "models", "__version__"]
