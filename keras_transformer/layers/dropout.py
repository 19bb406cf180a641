"""Dropout (Section 5.4, "Residual Dropout"), with cheaper random numbers.

"We apply dropout to the output of each sub-layer, before it is added to the
sub-layer input and normalized. In addition, we apply dropout to the sums of
the embeddings and the positional encodings." Each element is zeroed with
probability `rate` and the survivors are scaled by 1 / (1 - rate), so that
the expected value is unchanged and inference needs no rescaling.

`keras.layers.Dropout` draws one random float per element, in the compute
dtype. On CPU, drawing the random numbers is most of dropout's cost (and
bfloat16 draws are slower still), so with the TensorFlow backend this layer
draws raw 32-bit random integers and splits each into two 16-bit numbers:
half the random-number work, no conversion to floats. The drop probability
becomes `rate` rounded to a multiple of 1/65536 (0.1 -> 0.100006), and the
scale is chosen from the rounded probability, so the expectation is still
exact. Other backends, and `noise_shape`, use Keras' own dropout.
"""

import keras

_SIXTEEN_BITS = 1 << 16


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` with 16-bit random draws under TensorFlow.

    Args and call arguments: as `keras.layers.Dropout` (`rate`,
    `noise_shape`, `seed`; `inputs`, `training`).

    Example:
    >>> layer = Dropout(0.1)
    >>> outputs = layer(keras.ops.ones((2, 8)), training=True)
    >>> # about 10% zeros, the rest 1 / (1 - 0.1)
    """

    def call(self, inputs, training=False):
        if (
            not training
            or self.rate == 0
            or self.noise_shape is not None
            or keras.backend.backend() != "tensorflow"
        ):
            return super().call(inputs, training=training)
        return _dropout_with_16_bit_draws(inputs, self.rate, self.seed_generator)


def _dropout_with_16_bit_draws(inputs, rate, seed_generator):
    import tensorflow as tf

    dropped_below = min(max(round(rate * _SIXTEEN_BITS), 0), _SIXTEEN_BITS - 1)
    scale = _SIXTEEN_BITS / (_SIXTEEN_BITS - dropped_below)
    seed = tf.cast(seed_generator.next(), tf.int64)
    size = tf.size(inputs)
    bits = tf.random.stateless_uniform(
        [(size + 1) // 2], seed=seed, minval=None, maxval=None, dtype=tf.uint32
    )
    # Each 32-bit draw holds two independent uniform 16-bit numbers.
    draws = tf.reshape(tf.bitcast(bits, tf.uint16), [-1])[:size]
    keep = tf.reshape(draws >= dropped_below, tf.shape(inputs))
    return tf.where(keep, inputs * tf.cast(scale, inputs.dtype), tf.zeros_like(inputs))
