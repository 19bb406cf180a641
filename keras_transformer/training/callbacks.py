"""Callbacks that `fit` needs for a real training run."""

import glob
import os

import keras
import numpy as np
from keras import ops

from keras_transformer import saving
from keras_transformer.training.backup import TrainingBackup, seed_generator_states


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
    `training_callbacks(..., averaged_weights=True)` does). A run resumed
    from a backup (`TrainingBackup`, or Keras' `BackupAndRestore` with its
    default `save_freq="epoch"`) goes on exactly: a backup written at an
    epoch's end holds the average in the model's place, one written during
    an epoch the trained weights.

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
        # A backup tells fit which epoch it restored by setting the model's
        # initial epoch; a fit merely started at a later epoch does not.
        restored = getattr(self.model, "_initial_epoch", None)
        mid_epoch = getattr(self.model, "_resumed_mid_epoch", False)
        if self._first_epoch_of_fit and epoch > 0 and restored == epoch and not mid_epoch:
            # Resumed from a backup written at the end of the previous epoch,
            # with the average in the model and the trained weights in the
            # average's place: swapping them back resumes training exactly.
            self._ema_weights_in_model = True
        self._first_epoch_of_fit = False
        super().on_epoch_begin(epoch, logs)


class EpochCheckpoints(keras.callbacks.Callback):
    """Keep the weights of the last `keep` epochs, one file each, for checkpoint averaging.

    The paper's models are the average of their last checkpoints (section
    6.1: the last 5 for base models, written at 10-minute intervals): single
    weights carry the noise of their last updates, and their average sits
    nearer the middle of the valley the updates circle in. At the end of each
    epoch this writes `pattern.format(epoch=N)` (N counting from 1, so a
    resumed run numbers on) and removes the oldest files beyond `keep`;
    `keras_transformer.saving.average_weights` averages them.

    Args:
        pattern: the files' path with an `{epoch}` field, e.g.
            `"checkpoints/epoch-{epoch:03d}.weights.h5"`.
        keep: how many of the newest files stay.

    Example:
    >>> model.fit(train, epochs=20, callbacks=[EpochCheckpoints("ckpt/epoch-{epoch:03d}.weights.h5", keep=5)])
    """

    def __init__(self, pattern, keep):
        super().__init__()
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.pattern = pattern
        self.keep = keep

    def on_epoch_end(self, epoch, logs=None):
        saving.replace_whole(self.pattern.format(epoch=epoch + 1), self.model.save_weights)
        for _, stale in epoch_checkpoint_files(self.pattern)[: -self.keep]:
            os.remove(stale)


def epoch_checkpoint_files(pattern):
    """`[(epoch, path), ...]` of the files `EpochCheckpoints(pattern, ...)` has kept, oldest first."""
    prefix, _, rest = pattern.partition("{")
    suffix = rest.partition("}")[2]
    numbered = []
    for name in glob.glob(glob.escape(prefix) + "*" + glob.escape(suffix)):
        number = name[len(prefix): len(name) - len(suffix)]
        if number.isdigit():  # not a rename's staging file
            numbered.append((int(number), name))
    return sorted(numbered)


class EpochSeeds(keras.callbacks.Callback):
    """Make each epoch's randomness depend on the seed and the epoch number alone.

    Dropout draws its random numbers from seed generators whose state moves
    on with every draw, and that state is not part of a model's weights, so
    no checkpoint keeps it (`TrainingBackup` does, for a backup written in
    the middle of an epoch): a run resumed in a new process at epoch e would
    drop other units than an uninterrupted run,
    and so would the data's shuffling (see `data.shuffle_each_epoch`). At the
    start of every epoch this callback puts each seed generator at a state
    made from its initial state and the epoch number, and sets the data's
    epoch variables to the epoch. A resumed run then trains exactly as an
    uninterrupted one would have, digit for digit.

    Args:
        epoch_variables: the `epoch` variables of the training data
            (`TranslationBatches.epoch`, `shuffle_each_epoch`'s).

    Example:
    >>> batches = data.make_translation_batches(pairs, source, target, data.Batching(64, batch_size=32), seed=0)
    >>> model.fit(batches.dataset, epochs=10, callbacks=[EpochSeeds([batches.epoch]), backup])
    """

    # Steps between the streams of successive epochs (the golden ratio in 32 bits).
    _EPOCH_STRIDE = 0x9E3779B9

    def __init__(self, epoch_variables=()):
        super().__init__()
        self.epoch_variables = [variable for variable in epoch_variables if variable is not None]
        self._initial_states = None

    def on_train_begin(self, logs=None):
        if self._initial_states is None:  # the states as the model was built, before any draw
            self._initial_states = seed_generator_states(self.model)

    def on_epoch_begin(self, epoch, logs=None):
        for variable in self.epoch_variables:
            variable.assign(epoch)
        for variable, initial in self._initial_states:
            state = initial.astype(np.int64)
            state[0] = (state[0] + epoch * self._EPOCH_STRIDE) % (1 << 32)
            variable.assign(state.astype(initial.dtype))


def training_callbacks(
    checkpoint_path,
    backup_dir,
    history_path,
    log_dir=None,
    early_stopping_patience=None,
    monitor="val_loss",
    averaged_weights=False,
    epoch_variables=(),
    best_so_far=None,
    save_every_steps=None,
    epoch_checkpoints=None,
    keep_checkpoints=None,
):
    """The standard set: checkpoint the best model, resume after a kill, log, stop on NaN.

    Writes the best weights to `checkpoint_path`, the training state to
    `backup_dir` (`TrainingBackup`), one CSV row per epoch to `history_path` and, with a
    `log_dir`, TensorBoard logs (loss, accuracy, perplexity, learning rate).
    A run directory names these paths (`keras_transformer.runs.run_dir`).
    "Best" and early stopping follow `monitor` (lower is better for a loss,
    higher for an accuracy). `averaged_weights=True` (for an optimizer with
    `use_ema=True`) puts `AveragedWeights` first, so that all of them see the
    weights' average.

    A run can be resumed, and its result is the same as if it had never
    stopped: the backup is written at the end of every epoch (and every
    `save_every_steps` steps; on SIGTERM too), whole or not at all;
    `EpochSeeds` makes every epoch's dropout and data order
    (`epoch_variables`) depend only on the seed and the epoch; and
    `best_so_far`, the best `monitor` value of the epochs already trained,
    keeps a resumed run from replacing the best checkpoint with a worse one.
    The backup stays after training, so a finished run can be trained for
    more epochs. With `keep_checkpoints=N`, the last N epochs' weights are
    kept too (`EpochCheckpoints`, files named by the `epoch_checkpoints`
    pattern), for averaging.
    """
    callbacks = [AveragedWeights()] if averaged_weights else []
    callbacks += [
        EpochSeeds(epoch_variables),
        keras.callbacks.TerminateOnNaN(),
        LearningRateLogger(),
        keras.callbacks.ModelCheckpoint(
            checkpoint_path,
            monitor=monitor,
            save_best_only=True,
            save_weights_only=True,
            initial_value_threshold=best_so_far,
        ),
        *([EpochCheckpoints(epoch_checkpoints, keep_checkpoints)] if keep_checkpoints else []),
        keras.callbacks.CSVLogger(history_path, append=True),
        # After the history row: a kill between the two retrains the epoch, never skips it.
        TrainingBackup(backup_dir, save_every_steps),
    ]
    if log_dir:
        callbacks.append(keras.callbacks.TensorBoard(log_dir, update_freq="epoch"))
    if early_stopping_patience:
        callbacks.append(
            keras.callbacks.EarlyStopping(
                monitor=monitor, patience=early_stopping_patience, restore_best_weights=True
            )
        )
    return callbacks
