"""Gradients on whichever Keras backend the tests run: TensorFlow's tape, `jax.grad`, PyTorch's autograd."""

import keras
import numpy as np
from keras import ops


def gradients(loss_fn, variables):
    """`d loss_fn() / d variable` for each of `variables`, as NumPy arrays (None where none flows)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = loss_fn()
        found = tape.gradient(loss, [variable.value for variable in variables])
        return [None if gradient is None else ops.convert_to_numpy(ops.convert_to_tensor(gradient)) for gradient in found]
    if backend == "jax":
        import jax

        def loss_of(values):
            # Keras variables read these values inside the scope: a pure function for jax.grad.
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return loss_fn()

        return [np.asarray(gradient) for gradient in jax.grad(loss_of)([variable.value for variable in variables])]
    if backend == "torch":
        import torch

        with torch.enable_grad():
            found = torch.autograd.grad(loss_fn(), [variable.value for variable in variables], allow_unused=True)
        return [None if gradient is None else gradient.detach().cpu().numpy() for gradient in found]
    raise ValueError(f"no gradients for the {backend} backend")
