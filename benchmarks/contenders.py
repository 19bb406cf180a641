"""The models the benchmark races, all of one size: the issue's "small" configuration.

* `keras_transformer` -- our `Transformer`.
* `keras_hub` -- the same architecture assembled from keras-hub's
  `TokenAndPositionEmbedding`, `TransformerEncoder` and `TransformerDecoder`.
* `tutorial` -- the TensorFlow "Transformer and Keras" tutorial's design:
  layers built on `keras.layers.MultiHeadAttention`, written here afresh.
* `torch` -- PyTorch's `nn.Transformer` (see `torch_contender.py`).

Every Keras contender maps `(source_ids, target_ids)` to float32 logits
`(batch, target_length, vocab)`, so one loss and one training loop serve all.
"""

import math

import keras
from keras import ops

from config import SMALL, sinusoids



def build_keras_model(name, config=SMALL):
    """A Keras contender under the current global dtype policy."""
    builders = {
        "keras_transformer": _ours,
        "keras_hub": _keras_hub,
        "tutorial": _tutorial,
    }
    if name not in builders:
        raise ValueError(f"unknown Keras contender {name!r}; choose one of {sorted(builders)}")
    return builders[name](config)


def build_optimizer(name, learning_rate=1e-4, stock=False):
    """Adam for every contender: each library's own (ours fuses the update into one kernel).

    `stock=True`: Keras' own Adam whatever the contender, as a user who
    compiles our layers their own way would.
    """
    if name == "keras_transformer" and not stock:
        from keras_transformer.training import FusedAdam

        return FusedAdam(learning_rate)
    return keras.optimizers.Adam(learning_rate)


def build_loss(name, stock=False):
    """Cross-entropy from logits, no label smoothing: each library's own where it has one.

    Ours is `MaskedSparseCrossEntropy` (it also skips padding, which these
    batches have none of); the others (and ours with `stock=True`) use
    Keras' sparse cross-entropy.
    """
    if name == "keras_transformer" and not stock:
        from keras_transformer.training import MaskedSparseCrossEntropy

        return MaskedSparseCrossEntropy(label_smoothing=0.0)
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _ours(config):
    from keras_transformer.models import Transformer

    return Transformer(
        src_vocab_size=config["vocab_size"],
        tgt_vocab_size=config["vocab_size"],
        num_layers=config["num_layers"],
        d_model=config["d_model"],
        num_heads=config["num_heads"],
        d_ff=config["d_ff"],
        dropout=config["dropout"],
        max_length=max(config["source_length"], config["target_length"]) + 32,
    )


def _id_inputs(config):
    source = keras.Input((None,), dtype="int32", name="source_ids")
    target = keras.Input((None,), dtype="int32", name="target_ids")
    return source, target


def _float32_logits(hidden, config):
    logits = keras.layers.Dense(config["vocab_size"], name="logits")(hidden)
    return keras.layers.Activation("linear", dtype="float32", name="float32_logits")(logits)


# -- keras-hub ---------------------------------------------------------------


def _keras_hub(config):
    import keras_hub

    source, target = _id_inputs(config)
    max_length = max(config["source_length"], config["target_length"]) + 32
    sizes = dict(
        intermediate_dim=config["d_ff"],
        num_heads=config["num_heads"],
        dropout=config["dropout"],
        layer_norm_epsilon=1e-6,
    )
    encoded = keras_hub.layers.TokenAndPositionEmbedding(
        config["vocab_size"], max_length, config["d_model"], mask_zero=True, name="source_embedding"
    )(source)
    for index in range(config["num_layers"]):
        encoded = keras_hub.layers.TransformerEncoder(name=f"encoder_{index}", **sizes)(encoded)
    decoded = keras_hub.layers.TokenAndPositionEmbedding(
        config["vocab_size"], max_length, config["d_model"], mask_zero=True, name="target_embedding"
    )(target)
    for index in range(config["num_layers"]):
        decoded = keras_hub.layers.TransformerDecoder(name=f"decoder_{index}", **sizes)(decoded, encoded)
    return keras.Model([source, target], _float32_logits(decoded, config), name="keras_hub_transformer")


def keras_hub_parts(model, config=SMALL):
    """The keras-hub contender's layers by role, for a decoding loop:
    `(source_embedding, target_embedding, encoders, decoders, logits_layer)`."""
    return (
        model.get_layer("source_embedding"),
        model.get_layer("target_embedding"),
        [model.get_layer(f"encoder_{index}") for index in range(config["num_layers"])],
        [model.get_layer(f"decoder_{index}") for index in range(config["num_layers"])],
        model.get_layer("logits"),
    )


# -- the TensorFlow tutorial's design ---------------------------------------


class TutorialPositionalEmbedding(keras.layers.Layer):
    def __init__(self, vocab_size, d_model, max_length=2048, **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.embedding = keras.layers.Embedding(vocab_size, d_model, mask_zero=True)
        self.max_length = max_length

    def build(self, inputs_shape):
        self.embedding.build(inputs_shape)
        table = sinusoids(self.max_length, self.d_model)
        self.table = self.add_weight(
            name="sinusoids", shape=table.shape, initializer=keras.initializers.Constant(table), trainable=False
        )

    def compute_mask(self, inputs, mask=None):
        return self.embedding.compute_mask(inputs, mask)

    def call(self, inputs):
        length = ops.shape(inputs)[1]
        embedded = self.embedding(inputs) * ops.cast(math.sqrt(self.d_model), self.compute_dtype)
        return embedded + ops.slice(self.table, [0, 0], [length, self.d_model])[None]


class TutorialAttention(keras.layers.Layer):
    """keras.layers.MultiHeadAttention, then Add and LayerNormalization."""

    def __init__(self, causal=False, **attention_args):
        super().__init__()
        self.causal = causal
        self.attention = keras.layers.MultiHeadAttention(**attention_args)
        self.norm = keras.layers.LayerNormalization(epsilon=1e-6)
        self.add = keras.layers.Add()

    def call(self, inputs, context=None):
        context = inputs if context is None else context
        attended = self.attention(query=inputs, value=context, key=context, use_causal_mask=self.causal)
        return self.norm(self.add([inputs, attended]))


class TutorialFeedForward(keras.layers.Layer):
    def __init__(self, d_model, d_ff, dropout):
        super().__init__()
        self.network = keras.Sequential(
            [keras.layers.Dense(d_ff, activation="relu"), keras.layers.Dense(d_model), keras.layers.Dropout(dropout)]
        )
        self.norm = keras.layers.LayerNormalization(epsilon=1e-6)
        self.add = keras.layers.Add()

    def call(self, inputs):
        return self.norm(self.add([inputs, self.network(inputs)]))


def _tutorial(config):
    source, target = _id_inputs(config)
    d_model, heads = config["d_model"], config["num_heads"]
    attention_args = dict(num_heads=heads, key_dim=d_model // heads, dropout=config["dropout"])

    encoded = TutorialPositionalEmbedding(config["vocab_size"], d_model)(source)
    encoded = keras.layers.Dropout(config["dropout"])(encoded)
    for _ in range(config["num_layers"]):
        encoded = TutorialAttention(**attention_args)(encoded)
        encoded = TutorialFeedForward(d_model, config["d_ff"], config["dropout"])(encoded)

    decoded = TutorialPositionalEmbedding(config["vocab_size"], d_model)(target)
    decoded = keras.layers.Dropout(config["dropout"])(decoded)
    for _ in range(config["num_layers"]):
        decoded = TutorialAttention(causal=True, **attention_args)(decoded)
        decoded = TutorialAttention(**attention_args)(decoded, encoded)
        decoded = TutorialFeedForward(d_model, config["d_ff"], config["dropout"])(decoded)
    return keras.Model([source, target], _float32_logits(decoded, config), name="tutorial_transformer")
