"""Adam with TensorFlow's fused update kernel.

Section 5.3: "We used the Adam optimizer with beta1 = 0.9, beta2 = 0.98 and
epsilon = 1e-9". Keras' `Adam` writes each update as about ten separate
element-wise operations per variable (subtract, multiply, square, add,
sqrt, divide, ...), each a full pass over the variable's memory. For a
Transformer whose embedding and output matrices hold most of the
parameters, those passes cost more than some of the layers. TensorFlow has
the whole update as one kernel, `ResourceApplyAdam`, which reads the
gradient, the variable and both moments once:

    m <- m + (g - m) (1 - beta1)
    v <- v + (g^2 - v) (1 - beta2)
    w <- w - lr sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + epsilon)

the same arithmetic as `keras.optimizers.Adam`. `FusedAdam` uses it under
the TensorFlow backend (also inside `tf.distribute` strategies, where each
replica's copy is updated in place) and falls back to Keras' own update
elsewhere and for AMSGrad.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam`, updating each variable with one fused kernel.

    Args: as `keras.optimizers.Adam`.

    Example:
    >>> optimizer = FusedAdam(learning_rate=1e-3, beta_2=0.98, epsilon=1e-9)
    >>> model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    """

    def update_step(self, gradient, variable, learning_rate):
        if keras.backend.backend() != "tensorflow" or self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        import tensorflow as tf

        # The TensorFlow optimizer hands over tf.Variables (per replica
        # under a strategy); the moments are Keras variables around them.
        if isinstance(variable, keras.Variable):
            variable = variable.value
        index = self._get_variable_index(variable)
        momentum = self._momentums[index].value
        velocity = self._velocities[index].value
        dtype = variable.dtype
        if isinstance(gradient, tf.IndexedSlices):
            # Adam touches every row anyway (the moments decay everywhere).
            gradient = tf.convert_to_tensor(gradient)
        step = ops.cast(self.iterations + 1, dtype)
        beta_1 = ops.cast(self.beta_1, dtype)
        beta_2 = ops.cast(self.beta_2, dtype)
        return tf.raw_ops.ResourceApplyAdam(
            var=variable.handle,
            m=momentum.handle,
            v=velocity.handle,
            beta1_power=ops.power(beta_1, step),
            beta2_power=ops.power(beta_2, step),
            lr=ops.cast(learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=ops.cast(self.epsilon, dtype),
            grad=ops.cast(gradient, dtype),
            use_locking=False,
        )


def build_optimizer_variables(model):
    """Create the compiled optimizer's variables (Adam's moments) now, eagerly.

    On a single device, Keras' `fit` leaves them to the tracing of its first
    training step, where every variable created inside the `tf.function` costs
    a lifted initializer and the step is traced twice: about 10 of the first
    step's 20 s for the "small" Transformer on a 2-core CPU. Made here, they
    take about a second. Call it after `compile`, on a built model, inside the
    strategy's scope when there is one.

    Example:
    >>> model.build(((None, None), (None, None)))
    >>> model.compile(optimizer=FusedAdam(), loss=MaskedSparseCrossEntropy())
    >>> build_optimizer_variables(model)
    """
    if not model.built:
        raise ValueError("build_optimizer_variables needs a built model: call model.build(...) first")
    if getattr(model, "optimizer", None) is None:
        raise ValueError("build_optimizer_variables needs a compiled model: call model.compile(...) first")
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
