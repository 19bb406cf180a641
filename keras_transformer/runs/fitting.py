"""Training a run: `model.fit` epoch by epoch into the run directory, resumed exactly where it stopped.

Every task trains through `fit_epochs` (or `fit`): the run's callbacks
(checkpoints, backups, TensorBoard), a stop on SIGTERM that saves the run's
state, and the best weights as `model.keras` at the end.
"""

import os
import time

import keras

from keras_transformer import saving, training
from keras_transformer.runs import run_dir as runs

def training_callbacks(run_dir, settings, state, epoch_variables=(), averaged_weights=False):
    """`keras_transformer.training.training_callbacks` writing into this run's layout."""
    return training.training_callbacks(
        checkpoint_path=runs.path(run_dir, runs.BEST_CHECKPOINT),
        backup_dir=runs.path(run_dir, runs.BACKUP),
        history_path=runs.path(run_dir, runs.HISTORY),
        log_dir=runs.log_path(run_dir),
        early_stopping_patience=settings["early_stopping"],
        monitor=settings.get("monitor", "val_loss"),
        averaged_weights=averaged_weights,
        epoch_variables=epoch_variables,
        best_so_far=state.best_so_far,
        save_every_steps=settings.get("save_every_steps"),
        epoch_checkpoints=runs.path(run_dir, runs.EPOCH_CHECKPOINT),
        keep_checkpoints=settings.get("keep_checkpoints"),
    )


def _skipped(train_dataset, batches):
    """The training data without its first `batches`: `train_dataset` is a dataset, or a function that makes it
    from that number (a cluster's distributed dataset, which has no `skip`)."""
    if callable(train_dataset):
        return train_dataset(batches)
    return train_dataset.skip(batches) if batches else train_dataset


def fit_epochs(model, run_dir, state, settings, datasets, more_callbacks=(), verbose=1):
    """`fit` as a run's `settings` say (epochs, steps per epoch, averaged weights), with the run's callbacks.

    `datasets`: `(training dataset, validation dataset, the variable that
    sets each epoch's order)`; with `steps_per_epoch` the training data is
    repeated. `more_callbacks` follow the run's own (samples for TensorBoard).
    Returns what `fit` returns.
    """
    train_batches, val_batches, train_epoch = datasets
    callbacks = training_callbacks(run_dir, settings, state, epoch_variables=[train_epoch],
                                   averaged_weights=settings["ema_momentum"] is not None) + list(more_callbacks)
    if settings["steps_per_epoch"]:
        train_batches = train_batches.repeat()
    arguments = dict(validation_data=val_batches, epochs=settings["epochs"],
                     steps_per_epoch=settings["steps_per_epoch"], verbose=verbose)
    return fit(model, run_dir, state, train_batches, arguments, callbacks)


def fit(model, run_dir, state, train_dataset, fit_arguments, callbacks):
    """`model.fit` for a run in `state`, then finish: the best checkpoint becomes `model.keras`.

    The run resumes where it stopped and its history keeps each epoch once.
    On SIGTERM, `training.TrainingInterrupted` comes out of here after the
    state is saved, and the run is not finished. Returns the training part
    of the metrics (epochs, time, `final` values); the model ends with the
    best checkpoint's weights, as `model.keras` holds them.
    """
    runs._keep_history_of_done_epochs(run_dir, state.epochs_done)
    started = time.time()
    history = {}
    try:
        if state.batches_done and state.epochs_done < fit_arguments["epochs"]:
            # Stopped in the middle of an epoch: first the rest of it, its first
            # batches skipped (in the same order: the data's order is set by the
            # epoch), in a fit of its own that stops after it, because Keras
            # takes a fit's first epoch's number of batches for all of its
            # epochs; then the epochs after it.
            rest = dict(fit_arguments)
            if rest.get("steps_per_epoch"):
                rest["steps_per_epoch"] = max(1, rest["steps_per_epoch"] - state.batches_done)
            stop_after_it = _StopAfterOneEpoch()
            history = _fit(model, _skipped(train_dataset, state.batches_done), rest, callbacks + [stop_after_it])
            go_on = not stop_after_it.stopped_by_others and history["epoch"][-1] + 1 < fit_arguments["epochs"]
        else:
            go_on = True
        if go_on:
            for name, values in _fit(model, _skipped(train_dataset, 0), fit_arguments, callbacks).items():
                history[name] = history.get(name, []) + values
    finally:
        # `fit` skips its callbacks' `on_train_end` when it fails: give SIGTERM back.
        for callback in callbacks:
            if isinstance(callback, training.TrainingBackup):
                callback.stop_handling_signals()
    seconds = time.time() - started
    epochs_run = len(history.get("epoch", []))
    stopped_early = any(
        isinstance(callback, keras.callbacks.EarlyStopping) and callback.stopped_epoch > 0 for callback in callbacks
    )
    best = runs.path(run_dir, runs.BEST_CHECKPOINT)
    if os.path.exists(best):
        saving.load_weights(model, best)
    saving.save_model(model, runs.path(run_dir, runs.MODEL))
    epochs_done = state.epochs_done + epochs_run
    return {
        "epochs_done": epochs_done,
        "stopped_early_after": epochs_done if stopped_early else None,
        "epochs_this_session": epochs_run,
        "seconds_this_session": round(seconds, 1),
        "seconds_per_epoch": round(seconds / max(epochs_run, 1), 1),
        "parameters": model.count_params(),
        "final": {key: float(values[-1]) for key, values in history.items() if key != "epoch"} if epochs_run else {},
    }


class _StopAfterOneEpoch(keras.callbacks.Callback):
    """Ends a fit after its first epoch; notes whether another callback (early stopping, NaN) ended it."""

    def on_epoch_end(self, epoch, logs=None):
        self.stopped_by_others = self.model.stop_training
        self.model.stop_training = True


def _fit(model, train_dataset, fit_arguments, callbacks):
    """`model.fit`; its history as `{"epoch": [...], metric: [...]}`."""
    history = model.fit(train_dataset, shuffle=False, callbacks=callbacks, **fit_arguments)  # the pipeline shuffles
    return {"epoch": list(history.epoch), **history.history}
