"""The speed-ups give the answers of the straightforward code they replace.

`FusedAdam` against Keras' Adam (and against plain dense Adam where Keras'
sparse update goes wrong), the 16-bit `Dropout` against the definition of
dropout. The attention projections and the cache write are covered where
attention is tested: against `keras.layers.MultiHeadAttention` and against
decoding without a cache.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.layers import Dropout
from keras_transformer.training import FusedAdam


def _train(optimizer_class, strategy=None, steps=6):
    strategy = strategy or tf.distribute.get_strategy()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((5, 3)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(7)]
        )
        model.compile(
            optimizer=optimizer_class(learning_rate=1e-2, beta_2=0.98, epsilon=1e-9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    rng = np.random.default_rng(0)
    inputs = rng.normal(size=(16 * steps, 5, 3)).astype("float32")
    labels = rng.integers(0, 7, (16 * steps, 5))
    model.fit(inputs, labels, batch_size=16, epochs=1, shuffle=False, verbose=0)
    return [variable.numpy() for variable in model.weights]


class TestFusedAdam:
    def test_same_weights_as_keras_adam(self):
        for fused, reference in zip(_train(FusedAdam), _train(keras.optimizers.Adam)):
            np.testing.assert_allclose(fused, reference, atol=1e-6)

    def test_same_weights_as_keras_adam_under_mirrored_strategy(self, mirrored_strategy):
        fused = _train(FusedAdam, mirrored_strategy)
        reference = _train(keras.optimizers.Adam, mirrored_strategy)
        for fused_weights, reference_weights in zip(fused, reference):
            np.testing.assert_allclose(fused_weights, reference_weights, atol=1e-6)

    def test_repeated_rows_of_a_sparse_gradient_are_summed(self):
        # An embedding gradient lists a row once per occurrence of the token.
        # Adam must see their sum, as if the gradient were dense.
        def three_steps(optimizer, gradient):
            variable = keras.Variable(np.ones((3, 2), "float32"))
            for _ in range(3):
                optimizer.apply_gradients([(gradient, variable)])
            return variable.numpy()

        sparse = tf.IndexedSlices(tf.ones((2, 2)), tf.constant([0, 0]), tf.constant([3, 2]))
        dense = tf.constant([[2.0, 2.0], [0.0, 0.0], [0.0, 0.0]])
        fused = three_steps(FusedAdam(learning_rate=0.1), sparse)
        plain = three_steps(keras.optimizers.Adam(learning_rate=0.1), dense)
        np.testing.assert_allclose(fused, plain, rtol=1e-5, atol=1e-5)
        assert np.all(fused[1:] == 1.0)

    def test_serializes(self):
        optimizer = FusedAdam(learning_rate=3e-4, beta_2=0.98)
        restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
        assert isinstance(restored, FusedAdam)
        assert restored.beta_2 == pytest.approx(0.98)


class TestDropout:
    @pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
    def test_drops_the_rate_and_keeps_the_expectation(self, dtype):
        layer = Dropout(0.1, dtype=dtype)
        outputs = keras.ops.convert_to_numpy(
            keras.ops.cast(layer(keras.ops.ones((400, 1000), dtype=dtype), training=True), "float32")
        )
        dropped = np.mean(outputs == 0)
        # 400k draws: the standard error of the drop rate is ~0.0005.
        assert abs(dropped - 0.1) < 0.003
        kept = outputs[outputs != 0]
        np.testing.assert_allclose(kept, 1 / 0.9, rtol=1e-2 if dtype == "bfloat16" else 1e-4)
        assert abs(outputs.mean() - 1.0) < (0.01 if dtype == "bfloat16" else 0.005)

    def test_identity_at_inference_and_fresh_masks_each_call(self):
        layer = Dropout(0.5)
        inputs = keras.random.normal((8, 64))
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(inputs)), keras.ops.convert_to_numpy(inputs))
        first = keras.ops.convert_to_numpy(layer(inputs, training=True)) == 0
        second = keras.ops.convert_to_numpy(layer(inputs, training=True)) == 0
        assert 0.3 < first.mean() < 0.7 and np.mean(first != second) > 0.3

    def test_odd_sizes_and_the_gradient_follows_the_mask(self):
        layer = Dropout(0.3)
        inputs = tf.random.normal((3, 7, 5))  # an odd number of elements
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            outputs = layer(inputs, training=True)
        gradient = tape.gradient(outputs, inputs).numpy()
        kept = outputs.numpy() != 0
        np.testing.assert_allclose(gradient[kept], 1 / 0.7, rtol=1e-4)
        assert np.all(gradient[~kept] == 0)

    def test_same_seed_same_mask(self):
        inputs = keras.ops.ones((16, 16))
        first = Dropout(0.2, seed=7)(inputs, training=True)
        second = Dropout(0.2, seed=7)(inputs, training=True)
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(first), keras.ops.convert_to_numpy(second))
