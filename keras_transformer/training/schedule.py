"""The learning-rate schedule of Section 5.3, equation (3).

    lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)

It rises linearly for `warmup_steps` steps, then decays with the inverse
square root of the step. The paper uses Adam with beta1 = 0.9,
beta2 = 0.98, epsilon = 1e-9 and warmup_steps = 4000: `transformer_optimizer`.
"""

import keras
from keras import ops

from keras_transformer.training.optimizers import FusedAdam


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Equation (3), times an optional `scale` (useful for small data sets).

    Args:
        d_model: the model width.
        warmup_steps: steps of linear warm-up (4000 in the paper).
        scale: multiplier on the whole schedule.
        steps_per_update: batches whose gradients are averaged into one update
            (`transformer_optimizer(accumulate_steps=...)`). The optimizer
            counts batches; the schedule counts updates, so that warm-up and
            decay follow the paper's steps whatever the batch is split into.

    Example:
    >>> schedule = TransformerSchedule(d_model=512)
    >>> float(schedule(4000))  # the peak: 512^-0.5 * 4000^-0.5 ~= 7.0e-4
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0, steps_per_update=1):
        if d_model < 1 or warmup_steps < 1 or scale <= 0 or steps_per_update < 1:
            raise ValueError(
                "d_model, warmup_steps, scale and steps_per_update must be positive; "
                f"got {d_model}, {warmup_steps}, {scale}, {steps_per_update}"
            )
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale
        self.steps_per_update = steps_per_update

    def __call__(self, step):
        # Keras counts batches from 0; the formula counts updates from 1.
        step = ops.floor_divide(ops.cast(step, "int64"), self.steps_per_update)
        step = ops.cast(step, "float32") + 1.0
        warmup = ops.cast(self.warmup_steps, "float32")
        rate = ops.minimum(ops.rsqrt(step), step * warmup**-1.5)
        return self.scale * self.d_model**-0.5 * rate

    def get_config(self):
        return {
            "d_model": self.d_model,
            "warmup_steps": self.warmup_steps,
            "scale": self.scale,
            "steps_per_update": self.steps_per_update,
        }


def transformer_optimizer(
    d_model, warmup_steps=4000, scale=1.0, clipnorm=None, weight_decay=None, ema_momentum=None, accumulate_steps=1
):
    """Adam(0.9, 0.98, 1e-9) on the warm-up schedule, as in the paper (fused: see `optimizers`).

    `weight_decay` (not in the paper) adds decoupled weight decay (AdamW,
    Loshchilov & Hutter): each step shrinks the weight matrices and
    embeddings by learning_rate * weight_decay of themselves; biases and
    LayerNorm gains and offsets are left alone.

    `ema_momentum` keeps a moving average of the weights beside them
    (Polyak averaging), updated after every step as
    `average = ema_momentum * average + (1 - ema_momentum) * weights`: it
    averages over about `1 / (1 - ema_momentum)` steps. The paper averages
    its last checkpoints for the same reason (section 6.1). Evaluate and keep
    the average with the `AveragedWeights` callback.

    `accumulate_steps` K > 1 updates the weights once every K batches, with
    the mean of their gradients (Keras' `gradient_accumulation_steps`): the
    paper's 25k-token batches on a machine that holds 3k tokens at a time,
    as 8 batches of 3k. The mean of K batches' mean losses is the mean over
    all their tokens when the batches hold equal numbers of tokens, as
    token-budget batches nearly do. The schedule counts updates, not batches.
    """
    if not (isinstance(accumulate_steps, int) and accumulate_steps >= 1):
        raise ValueError(f"accumulate_steps must be a positive integer, got {accumulate_steps!r}")
    if weight_decay is not None and not weight_decay >= 0:
        raise ValueError(f"weight_decay must be a non-negative number, got {weight_decay!r}")
    if ema_momentum is not None and not 0 < ema_momentum < 1:
        raise ValueError(f"ema_momentum must be between 0 and 1 (e.g. 0.998), got {ema_momentum!r}")
    optimizer = FusedAdam(
        learning_rate=TransformerSchedule(d_model, warmup_steps, scale, steps_per_update=accumulate_steps),
        beta_1=0.9,
        beta_2=0.98,
        epsilon=1e-9,
        clipnorm=clipnorm,
        weight_decay=weight_decay or None,
        use_ema=ema_momentum is not None,
        ema_momentum=ema_momentum if ema_momentum is not None else 0.99,
        gradient_accumulation_steps=accumulate_steps if accumulate_steps > 1 else None,
    )
    if weight_decay:
        optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return optimizer
