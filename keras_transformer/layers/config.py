"""Hyperparameters declared once: `get_config` and a stack's per-layer settings follow.

Keras saves a layer as its class plus `get_config()` and rebuilds it as
`cls(**config)`, so the config must hold every `__init__` argument that shapes
the layer. Instead of writing each one three more times besides the
signature (`self.d_ff = d_ff`, a `get_config` entry, the arguments handed to
sub-layers), a class names its hyperparameters once, in `hyperparameters`:

    class FeedForward(Hyperparameters, keras.layers.Layer):
        hyperparameters = ("d_model", "d_ff", "activation", "dropout")

        def __init__(self, d_model, d_ff, activation="relu", dropout=0.0, **kwargs):
            super().__init__(**kwargs)
            self.store_hyperparameters(locals())  # self.d_model = d_model, ...

`get_config` is then Keras' base config (name, dtype, trainable) plus
`{name: self.<name>}` for the names listed, and
`shared_hyperparameters(OtherClass)` gives this object's values of the
hyperparameters that `OtherClass` also declares: how an `Encoder` hands its
settings to each `EncoderLayer`, and a `Transformer` to its two stacks,
without listing them again. Keras' own arguments (`name`, `dtype`) travel in
`**kwargs` and are not hyperparameters here.
"""

import keras


class Hyperparameters:
    """Mixin for Keras layers and models: `get_config` from a declared list of names.

    Put it before the Keras base class (`class EncoderLayer(Hyperparameters,
    keras.layers.Layer)`) so that its `get_config` extends Keras' one.

    Class attributes:
        hyperparameters: names of the `__init__` arguments saved in the config,
            each stored as the attribute of the same name.

    Example:
    >>> layer = FeedForward(d_model=64, d_ff=256)
    >>> layer.d_ff, layer.get_config()["d_ff"]  # (256, 256)
    >>> FeedForward.from_config(layer.get_config()).d_ff  # 256
    """

    hyperparameters = ()

    def store_hyperparameters(self, arguments):
        """Set `self.<name>` for every declared name found in `arguments`.

        `arguments` is `locals()` taken in `__init__` before any other local
        variable is assigned, when the local variables are exactly the call's
        arguments. A subclass that adds arguments of its own calls this again
        from its `__init__`; a name never stored fails in `get_config`.
        """
        for name in self.hyperparameters:
            if name in arguments:
                setattr(self, name, arguments[name])

    def shared_hyperparameters(self, other):
        """`{name: value}` of this object's hyperparameters that the class `other` also declares."""
        return {name: getattr(self, name) for name in other.hyperparameters if name in self.hyperparameters}

    def get_config(self):
        config = super().get_config()
        # Plain values stay as they are; Keras objects (an initializer) become
        # their serialized form, which `__init__` turns back into one
        # (`keras.initializers.get`).
        config.update(
            {name: keras.saving.serialize_keras_object(getattr(self, name)) for name in self.hyperparameters}
        )
        return config
