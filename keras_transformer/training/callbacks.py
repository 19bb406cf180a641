"""Callbacks that `fit` needs for a real training run."""

import os

import keras
from keras import ops


class LearningRateLogger(keras.callbacks.Callback):
    """Puts the current learning rate into the epoch logs (and so into TensorBoard)."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        optimizer = self.model.optimizer
        rate = optimizer.learning_rate
        if callable(rate):
            rate = rate(optimizer.iterations)
        logs["learning_rate"] = float(ops.convert_to_numpy(rate))


def training_callbacks(run_dir, early_stopping_patience=None, tensorboard=True, monitor="val_loss"):
    """The standard set: checkpoint the best model, resume after a kill, log, stop on NaN.

    Writes `checkpoints/best.weights.h5`, `backup/` (BackupAndRestore),
    `logs/` (TensorBoard: loss, accuracy, perplexity, learning rate) and
    `history.csv` inside `run_dir`. "Best" and early stopping follow
    `monitor` (lower is better for a loss, higher for an accuracy).
    """
    callbacks = [
        keras.callbacks.TerminateOnNaN(),
        LearningRateLogger(),
        keras.callbacks.ModelCheckpoint(
            os.path.join(run_dir, "checkpoints", "best.weights.h5"),
            monitor=monitor,
            save_best_only=True,
            save_weights_only=True,
        ),
        keras.callbacks.BackupAndRestore(os.path.join(run_dir, "backup")),
        keras.callbacks.CSVLogger(os.path.join(run_dir, "history.csv"), append=True),
    ]
    if tensorboard:
        callbacks.append(keras.callbacks.TensorBoard(os.path.join(run_dir, "logs"), update_freq="epoch"))
    if early_stopping_patience:
        callbacks.append(
            keras.callbacks.EarlyStopping(
                monitor=monitor, patience=early_stopping_patience, restore_best_weights=True
            )
        )
    return callbacks
