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


class AveragedWeights(keras.callbacks.SwapEMAWeights):
    """Validate, checkpoint and keep the moving average of the weights, not the last step's.

    For an optimizer made with `use_ema=True` (`transformer_optimizer(...,
    ema_momentum=0.998)`). At the end of each epoch the averaged weights take
    the model's place, so the validation metrics, the best checkpoint, early
    stopping, the backup and the embedding projector all see them; at the start
    of the next epoch the trained weights come back and training goes on from
    them. After the last epoch the model keeps the average. Weights from single
    steps carry the noise of their last few updates; the paper averages its
    last checkpoints for this reason (section 6.1).

    Put it before the callbacks that should see the average (as
    `training_callbacks(..., averaged_weights=True)` does). A run resumed by
    `BackupAndRestore` goes on exactly, provided the backup was written at an
    epoch's end (its default `save_freq="epoch"`, as in `training_callbacks`):
    such a backup holds the average in the model's place.

    Example:
    >>> model.compile(optimizer=transformer_optimizer(128, ema_momentum=0.998), loss=...)
    >>> model.fit(train, validation_data=val, callbacks=[AveragedWeights(), checkpoint])
    """

    def __init__(self):
        super().__init__(swap_on_epoch=True)
        self._first_epoch_of_fit = True

    def on_train_begin(self, logs=None):
        self._first_epoch_of_fit = True

    def on_epoch_begin(self, epoch, logs=None):
        # BackupAndRestore tells fit which epoch it restored by setting the
        # model's initial epoch; a fit merely started at a later epoch does not.
        restored = getattr(self.model, "_initial_epoch", None)
        if self._first_epoch_of_fit and epoch > 0 and restored == epoch:
            # Resumed from a backup written at the end of the previous epoch,
            # with the average in the model and the trained weights in the
            # average's place: swapping them back resumes training exactly.
            self._ema_weights_in_model = True
        self._first_epoch_of_fit = False
        super().on_epoch_begin(epoch, logs)


def training_callbacks(run_dir, early_stopping_patience=None, tensorboard=True, monitor="val_loss", averaged_weights=False):
    """The standard set: checkpoint the best model, resume after a kill, log, stop on NaN.

    Writes `checkpoints/best.weights.h5`, `backup/` (BackupAndRestore),
    `logs/` (TensorBoard: loss, accuracy, perplexity, learning rate) and
    `history.csv` inside `run_dir`. "Best" and early stopping follow
    `monitor` (lower is better for a loss, higher for an accuracy).
    `averaged_weights=True` (for an optimizer with `use_ema=True`) puts
    `AveragedWeights` first, so that all of them see the weights' average.
    """
    callbacks = [AveragedWeights()] if averaged_weights else []
    callbacks += [
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
