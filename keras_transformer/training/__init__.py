"""Training: schedule, loss, metrics, strategy and precision, callbacks."""

from keras_transformer.backends import require_tensorflow

require_tensorflow("keras_transformer.training", "tf.distribute strategies, a fused TensorFlow optimizer and loss")

from keras_transformer.training.backup import TrainingBackup, TrainingInterrupted, read_backup
from keras_transformer.training.callbacks import (
    AveragedWeights,
    EpochCheckpoints,
    EpochSeeds,
    LearningRateLogger,
    epoch_checkpoint_files,
    training_callbacks,
)
from keras_transformer.training.distribution import (
    PRECISIONS,
    STRATEGIES,
    cluster_addresses,
    is_chief,
    local_cluster,
    make_strategy,
    multi_worker_strategy,
    set_precision,
    split_cpu,
)
from keras_transformer.training.precision import AUTO, choose_precision
from keras_transformer.training.losses import MaskedSparseCrossEntropy, token_cross_entropy
from keras_transformer.training.metrics import MaskedAccuracy, Perplexity
from keras_transformer.training.optimizers import FusedAdam, build_optimizer_variables
from keras_transformer.training.schedule import TransformerSchedule, transformer_optimizer

__all__ = [
    "AUTO",
    "AveragedWeights",
    "EpochCheckpoints",
    "EpochSeeds",
    "FusedAdam",
    "LearningRateLogger",
    "MaskedAccuracy",
    "MaskedSparseCrossEntropy",
    "PRECISIONS",
    "Perplexity",
    "STRATEGIES",
    "TrainingBackup",
    "TrainingInterrupted",
    "epoch_checkpoint_files",
    "cluster_addresses",
    "is_chief",
    "local_cluster",
    "multi_worker_strategy",
    "read_backup",
    "TransformerSchedule",
    "build_optimizer_variables",
    "choose_precision",
    "make_strategy",
    "set_precision",
    "split_cpu",
    "token_cross_entropy",
    "training_callbacks",
    "transformer_optimizer",
]
