"""What the encoder and the decoder share: a stack of N identical layers (Section 3.1).

Both are "a stack of N = 6 identical layers" on top of the token embedding
(plus positions). `TransformerStack` holds that common part: the size checks,
the embedding (built here or shared with another stack), and, for pre-LN,
the final LayerNorm. `Encoder` and `Decoder` add their layers.

A stack's hyperparameters are its own (`TransformerStack.hyperparameters`:
depth, vocabulary, width, length, positions) plus those of its layer class,
which it hands unchanged to each of its N layers.

The stack's `index`-th layer is named `layer_name(index)` ("layer_0", ...):
its Keras name, and the prefix of its attention scores ("layer_0/self_attention").
"""

import keras

from keras_transformer.layers.checks import check_heads_divide, check_positive_int
from keras_transformer.layers.config import Hyperparameters
from keras_transformer.layers.embedding import TokenAndPositionEmbedding
from keras_transformer.layers.masks import padding_mask


def layer_name(index):
    """"layer_{index}": the name of a stack's `index`-th layer (counting from 0)."""
    return f"layer_{index}"


class TransformerStack(Hyperparameters, keras.layers.Layer):
    """What `Encoder` and `Decoder` share: embedding, N layers, optional final LayerNorm.

    Sizes are checked here once, and the embedding is built or shared. A
    subclass declares `hyperparameters = TransformerStack.hyperparameters +
    ItsLayer.hyperparameters` and builds its N layers with
    `self._make_layers(ItsLayer)`.

    Args: see `Encoder`.
    """

    # The stack's own; a subclass adds its layer class's.
    hyperparameters = ("num_layers", "vocab_size", "d_model", "max_length", "position")

    def __init__(
        self,
        num_layers,
        vocab_size,
        d_model,
        num_heads,
        d_ff,
        max_length,
        dropout=0.1,
        norm_first=False,
        epsilon=1e-6,
        position="sinusoidal",
        sliding_window=None,
        activation="relu",
        attention_dropout=0.0,
        activation_dropout=0.0,
        embedding=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int(
            num_layers=num_layers,
            vocab_size=vocab_size,
            d_model=d_model,
            num_heads=num_heads,
            d_ff=d_ff,
            max_length=max_length,
        )
        check_heads_divide(d_model, num_heads)
        self.store_hyperparameters(locals())
        # A shared embedding (Section 3.4's weight sharing) is passed in by the
        # model that owns it; it is not part of this layer's config.
        self.embedding = embedding or TokenAndPositionEmbedding(
            vocab_size,
            d_model,
            max_length,
            position=position,
            dropout=dropout,
            dtype=self.dtype_policy,
            name="embedding",
        )
        # Pre-LN leaves the residual stream unnormalised; normalise it once at the end.
        self.final_norm = (
            keras.layers.LayerNormalization(epsilon=epsilon, dtype=self.dtype_policy, name="final_norm")
            if norm_first
            else None
        )
        self.supports_masking = True

    def _make_layers(self, layer_class):
        """N layers of `layer_class`, each given the stack's values of the hyperparameters it declares."""
        return [
            layer_class(**self.shared_hyperparameters(layer_class), dtype=self.dtype_policy, name=layer_name(index))
            for index in range(self.num_layers)
        ]

    @staticmethod
    def _prefixed_scores(index, layer_scores):
        """A layer's scores under the stack's names: "self_attention" -> "layer_{index}/self_attention"."""
        return {f"{layer_name(index)}/{name}": value for name, value in layer_scores.items()}

    def _build_common(self, token_ids_shape):
        if not self.embedding.built:
            self.embedding.build(token_ids_shape)
        hidden_shape = tuple(token_ids_shape) + (self.d_model,)
        if self.final_norm is not None:
            self.final_norm.build(hidden_shape)
        return hidden_shape

    def _finish(self, outputs):
        return outputs if self.final_norm is None else self.final_norm(outputs)

    def compute_mask(self, token_ids, mask=None):
        return padding_mask(token_ids)
