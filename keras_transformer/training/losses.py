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
own count of real tokens, and the gradients of the replicas' losses are
summed. Each replica's loss is its token sum divided by the *global* token
count: the summed gradient is exactly the gradient of the global per-token
mean, as on one device. Keras expects a replica's loss in just that form
(its share, which it multiplies by the number of replicas to log it), so
the loss bypasses Keras' own reduction, which would divide by the number of
replicas again, or not, depending on whether the model's output carries a
Keras mask.
"""

import keras
import tensorflow as tf
from keras import ops


def token_cross_entropy(labels, logits, label_smoothing=0.0):
    """Per-position smoothed cross-entropy, `(batch, length)`, float32.

    With lse = logsumexp(logits), -log p(v) = lse - logit_v, so

        loss = lse - (1 - eps) * logit_y - eps * mean_v(logit_v)

    and its gradient with respect to the logits is softmax(logits) minus the
    smoothed target, (1 - eps) * onehot(y) + eps / V. Both are written out
    by hand (`tf.custom_gradient`): the logits are the largest tensor of a
    step (batch x length x vocabulary), and automatic differentiation of
    logsumexp makes several passes over it where one softmax suffices; on
    CPU this halves the loss's share of a training step.
    """
    logits = ops.cast(logits, "float32")
    labels = ops.cast(labels, "int32")
    return _smoothed_cross_entropy(logits, labels, float(label_smoothing))


def _smoothed_cross_entropy(logits, labels, label_smoothing):
    vocab_size = tf.shape(logits)[-1]
    flat_logits = tf.reshape(logits, [-1, vocab_size])
    flat_labels = tf.reshape(labels, [-1])

    @tf.custom_gradient
    def cross_entropy(flat_logits):
        probabilities = tf.nn.softmax(flat_logits)
        # lse without another pass of exponentials: at the largest logit,
        # p_max = exp(max - lse), so lse = max - log(p_max); and p_max >= 1/V
        # cannot underflow, however far apart the logits are.
        log_normalizer = tf.reduce_max(flat_logits, -1) - tf.math.log(tf.reduce_max(probabilities, -1))
        label_logits = tf.gather(flat_logits, flat_labels, batch_dims=1)
        loss = log_normalizer - (1.0 - label_smoothing) * label_logits
        if label_smoothing:
            loss -= label_smoothing * tf.reduce_mean(flat_logits, -1)

        def gradient(upstream):
            if label_smoothing:
                smoothed = label_smoothing / tf.cast(vocab_size, tf.float32)
                grads = (probabilities - smoothed) * upstream[:, None]
            else:
                grads = probabilities * upstream[:, None]
            # ... minus (1 - eps) at each label: a scatter, not a one-hot tensor.
            positions = tf.stack([tf.range(tf.shape(flat_labels)[0]), flat_labels], axis=1)
            return tf.tensor_scatter_nd_sub(grads, positions, (1.0 - label_smoothing) * upstream)

        return loss, gradient

    return tf.reshape(cross_entropy(flat_logits), tf.shape(labels))


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

    def __call__(self, y_true, y_pred, sample_weight=None):
        # The padding labels are the mask, and the value is already this
        # replica's share: no Keras reduction (see the module's docstring).
        if sample_weight is not None:
            raise ValueError("MaskedSparseCrossEntropy weighs tokens by their labels; it takes no sample_weight")
        with keras.name_scope(self.name):
            return self.call(ops.convert_to_tensor(y_true), ops.convert_to_tensor(y_pred))

    def call(self, y_true, y_pred):
        per_token = token_cross_entropy(y_true, y_pred, self.label_smoothing)
        real = ops.cast(ops.not_equal(y_true, self.padding_id), "float32")
        return ops.sum(per_token * real) / ops.maximum(_global_token_count(real), 1.0)

    def get_config(self):
        config = super().get_config()
        config.update({"label_smoothing": self.label_smoothing, "padding_id": self.padding_id})
        return config
