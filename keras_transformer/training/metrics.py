"""Token-level metrics that ignore padding: accuracy and perplexity."""

import keras
from keras import ops

from keras_transformer.training.losses import token_cross_entropy


class _MaskedTokenMean(keras.metrics.Metric):
    """A running mean over real (non-padding) tokens of some per-token value."""

    def __init__(self, padding_id=0, **kwargs):
        super().__init__(**kwargs)
        self.padding_id = padding_id
        self.total = self.add_variable(shape=(), initializer="zeros", name="total", aggregation="sum")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count", aggregation="sum")

    def per_token(self, y_true, y_pred):
        raise NotImplementedError

    def update_state(self, y_true, y_pred, sample_weight=None):
        real = ops.cast(ops.not_equal(y_true, self.padding_id), "float32")
        self.total.assign_add(ops.sum(self.per_token(y_true, y_pred) * real))
        self.count.assign_add(ops.sum(real))

    def result(self):
        return self.total / ops.maximum(self.count, 1.0)

    def get_config(self):
        return {**super().get_config(), "padding_id": self.padding_id}


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedAccuracy(_MaskedTokenMean):
    """Fraction of real target tokens predicted exactly (argmax)."""

    def __init__(self, padding_id=0, name="accuracy", **kwargs):
        super().__init__(padding_id=padding_id, name=name, **kwargs)

    def per_token(self, y_true, y_pred):
        predicted = ops.argmax(y_pred, axis=-1)
        return ops.cast(ops.equal(ops.cast(y_true, predicted.dtype), predicted), "float32")


@keras.saving.register_keras_serializable(package="keras_transformer")
class Perplexity(_MaskedTokenMean):
    """exp(mean negative log-likelihood per real token), without label smoothing."""

    def __init__(self, padding_id=0, name="perplexity", **kwargs):
        super().__init__(padding_id=padding_id, name=name, **kwargs)

    def per_token(self, y_true, y_pred):
        return token_cross_entropy(y_true, y_pred)

    def result(self):
        return ops.exp(super().result())
