"""The position-wise feed-forward network (Section 3.3, equation 2).

    FFN(x) = max(0, x W_1 + b_1) W_2 + b_2

The same two-layer network is applied to every position separately and
identically; it is where most of a Transformer layer's parameters live
(d_model x d_ff twice, against 4 d_model^2 for attention).
"""

import keras

from keras_transformer.layers.checks import check_positive_int, check_rate
from keras_transformer.layers.config import Hyperparameters
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.position_wise import position_wise


@keras.saving.register_keras_serializable(package="keras_transformer")
class FeedForward(Hyperparameters, keras.layers.Layer):
    """Equation (2): a d_model -> d_ff -> d_model MLP applied at every position.

    Args:
        d_model: input and output size.
        d_ff: hidden size (2048 for the base model, 4x d_model).
        activation: hidden activation; "relu" in the paper ("gelu" is common
            in later models).
        dropout: dropout on the hidden activations. The paper has none there
            (its dropout is on the sub-layer output, applied by the residual
            sub-block); tensor2tensor calls this "relu_dropout".

    Call arguments:
        inputs: `(batch, length, d_model)`.
        training: whether dropout is active.

    Returns:
        `(batch, length, d_model)`.

    Example:
    >>> FeedForward(d_model=64, d_ff=256)(keras.ops.zeros((2, 10, 64))).shape
    (2, 10, 64)
    """

    hyperparameters = ("d_model", "d_ff", "activation", "dropout")

    def __init__(self, d_model, d_ff, activation="relu", dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        check_positive_int(d_model=d_model, d_ff=d_ff)
        check_rate(dropout=dropout)
        self.store_hyperparameters(locals())
        self.hidden = keras.layers.Dense(d_ff, activation=activation, dtype=self.dtype_policy, name="hidden")
        self.hidden_dropout = Dropout(dropout, dtype=self.dtype_policy)
        self.projection = keras.layers.Dense(d_model, dtype=self.dtype_policy, name="projection")
        self.supports_masking = True

    def build(self, inputs_shape):
        self.hidden.build(inputs_shape)
        self.projection.build(tuple(inputs_shape[:-1]) + (self.d_ff,))

    def call(self, inputs, training=None):
        hidden = self.hidden_dropout(position_wise(self.hidden, inputs), training=training)
        return position_wise(self.projection, hidden)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape[:-1]) + (self.d_model,)
