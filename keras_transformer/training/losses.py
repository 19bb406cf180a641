"""Cross-entropy with label smoothing over real tokens only (Section 5.4).

"During training, we employed label smoothing of value eps_ls = 0.1. This
hurts perplexity, as the model learns to be more unsure, but improves
accuracy and BLEU score." The target distribution puts 1 - eps on the right
token and spreads eps evenly over the vocabulary:

    loss = (1 - eps) * -log p(y) + eps * mean_v(-log p(v))

Padding positions (label 0) contribute nothing, and the loss is averaged
over real tokens: a batch of long sentences and one of short ones weigh each
token the same.

**Under tf.distribute** each replica sees part of the global batch, with its
own count of real tokens. Keras scales each replica's loss by
1 / num_replicas and sums the gradients; dividing each replica's token sum by
the *global* token count (and undoing Keras' scaling) makes the summed
gradient exactly the gradient of the global per-token mean, as on one device.
"""

import keras
import tensorflow as tf
from keras import ops


def token_cross_entropy(labels, logits, label_smoothing=0.0):
    """Per-position smoothed cross-entropy, `(batch, length)`, float32.

    With lse = logsumexp(logits), -log p(v) = lse - logit_v, so

        loss = lse - (1 - eps) * logit_y - eps * mean_v(logit_v)

    which needs two reductions over the vocabulary instead of materialising
    a `(batch, length, vocab)` log-softmax (the largest tensor of a step).
    """
    logits = ops.cast(logits, "float32")
    labels = ops.cast(labels, "int32")
    log_normalizer = ops.logsumexp(logits, axis=-1)
    label_logits = ops.squeeze(ops.take_along_axis(logits, labels[..., None], axis=-1), axis=-1)
    if not label_smoothing:
        return log_normalizer - label_logits
    return log_normalizer - (1.0 - label_smoothing) * label_logits - label_smoothing * ops.mean(logits, axis=-1)


def _global_token_count(real):
    """Real tokens in the global batch: summed over replicas inside `strategy.run`.

    A count, not a function of the weights: no gradient flows through it (and
    none may flow through the all-reduce, whose inputs differ in shape when a
    batch splits unevenly).
    """
    count = tf.stop_gradient(ops.sum(real))
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return count
    return context.all_reduce(tf.distribute.ReduceOp.SUM, count)


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedSparseCrossEntropy(keras.losses.Loss):
    """Label-smoothed cross-entropy from logits, averaged over non-padding tokens.

    Args:
        label_smoothing: eps_ls (0.1 in the paper).
        padding_id: the label that marks padding.

    Example:
    >>> loss = MaskedSparseCrossEntropy(label_smoothing=0.1)
    >>> model.compile(optimizer="adam", loss=loss)
    """

    def __init__(self, label_smoothing=0.1, padding_id=0, name="masked_cross_entropy", **kwargs):
        super().__init__(name=name, **kwargs)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        self.label_smoothing = label_smoothing
        self.padding_id = padding_id

    def call(self, y_true, y_pred):
        per_token = token_cross_entropy(y_true, y_pred, self.label_smoothing)
        real = ops.cast(ops.not_equal(y_true, self.padding_id), "float32")
        total = ops.sum(per_token * real)
        count = _global_token_count(real)
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        # Keras multiplies by 1 / replicas before summing gradients: cancel it.
        return total * replicas / ops.maximum(count, 1.0)

    def get_config(self):
        config = super().get_config()
        config.update({"label_smoothing": self.label_smoothing, "padding_id": self.padding_id})
        return config
