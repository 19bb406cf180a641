"""Backing up a training run, so that a killed or preempted run resumes where it stopped.

A run on shared machines gets killed: by a crash, an out-of-memory killer,
a preempted cloud VM (which first receives SIGTERM, then after a grace
period SIGKILL). `TrainingBackup` keeps everything needed to go on exactly
as if nothing had happened:

- the model's weights and the optimizer's state (its moments, its step
  count, so the learning-rate schedule goes on too);
- where training was: the epoch, and how many of its batches were trained;
- what no weights file keeps: the dropout seed generators' states and the
  running sums of the epoch's metrics (so the epoch's logged loss and
  accuracy are the ones an uninterrupted run logs).

It writes that at the end of every epoch and, with `save_every_steps=N`,
every N steps, so a kill loses at most N steps. On SIGTERM it writes the
state after the step under way (after the epoch's end, when that step is
the epoch's last) and stops with `TrainingInterrupted`; rerun the same
command to resume. The data's position is the caller's part: resuming in
the middle of an epoch, the rest of that epoch must be a `fit` of its own
on the data with the batches already trained skipped, in the same order
(`data.shuffle_each_epoch` with `EpochSeeds`), then the epochs after it:
Keras takes the number of batches of a fit's first epoch for all of its
epochs (`runs.fitting.fit` does this).

The backup is a weights file and `state.json` naming it. A new backup
writes a new weights file, then replaces `state.json` in one rename: a
kill at any moment leaves the old backup or the new one, whole.

Keras' own `BackupAndRestore` keeps only the weights and the epoch; it
restarts an epoch from its first batch, and its every-N-steps backups stop
being written at the ends of epochs.

Across machines (`MultiWorkerMirroredStrategy`) every worker writes its
backup (only the chief's is kept, see `runs.run_dir.written_by_this_process`),
and a SIGTERM received by any worker stops them all after the same step:
after each step the workers sum their "stop" votes in one all-reduce, so
no worker waits forever in a step the others never take. Every worker
resumes from the chief's backup, which holds the chief's share of the
epoch's metric sums only: across workers a resumed epoch's logged training
metrics start afresh (weights, optimizer, data and dropout are exact).
"""

import contextlib
import dataclasses
import functools
import logging
import os
import signal

import h5py
import numpy as np
import tensorflow as tf

import keras
from keras import ops

from keras_transformer import saving
from keras_transformer.models.multi_worker import spans_workers

logger = logging.getLogger("keras_transformer")

STATE = "state.json"
# The layout of backups written by Keras' BackupAndRestore (by runs made
# before this module): still read, so those runs resume too.
_KERAS_WEIGHTS = "latest.weights.h5"
_KERAS_METADATA = "training_metadata.json"


class TrainingInterrupted(Exception):
    """Training stopped on a signal after writing its backup; the same command resumes it."""


@dataclasses.dataclass
class BackupState:
    """What a backup holds, besides its weights file."""

    epoch: int = 0  # the epoch training goes on with: the number of epochs done
    batches_done: int = 0  # batches of that epoch already trained
    weights: str = None  # the weights file, relative to the backup folder
    seed_states: list = None  # dropout seed generators' states, in model order
    metric_values: list = None  # the epoch's metrics' running sums, in model order, per local replica


def read_backup(backup_dir):
    """The `BackupState` in `backup_dir`, or None when there is none; a `DamagedFileError` for a damaged one."""
    state_path = os.path.join(backup_dir, STATE)
    if os.path.exists(state_path):
        try:
            state = BackupState(**saving.read_json(state_path))
        except TypeError:
            state = None
        if state is None or not isinstance(state.weights, str) or not isinstance(state.epoch, int):
            raise saving.DamagedFileError(f"{state_path} is not a backup's state; pass --overwrite to start over")
    elif os.path.exists(os.path.join(backup_dir, _KERAS_METADATA)):
        state = _read_keras_backup(backup_dir)
    else:
        return None
    weights = os.path.join(backup_dir, state.weights)
    if not _readable_h5(weights):
        raise saving.DamagedFileError(
            f"{weights} is damaged and there is no earlier backup to resume from; pass --overwrite to start over"
        )
    return state


class TrainingBackup(keras.callbacks.Callback):
    """Write the training state to `backup_dir` at each epoch's end (and every N steps); resume from it.

    Args:
        backup_dir: the backup's folder (created when first written).
        save_every_steps: also write it every this many steps, so a kill
            loses at most that many; None: only at the ends of epochs.
        stop_on_sigterm: on SIGTERM, write the backup after the current step
            and raise `TrainingInterrupted` (the process ends cleanly instead
            of losing the steps since the last backup).

    Put it after the callbacks that write an epoch's results (the history
    row, the best checkpoint): a kill between those and the backup retrains
    that epoch, never skips it. `EpochSeeds` must come before it.

    Example:
    >>> backup = TrainingBackup("run/backup", save_every_steps=500)
    >>> model.fit(batches, epochs=10, callbacks=[EpochSeeds([epoch]), checkpoint, history, backup])
    """

    def __init__(self, backup_dir, save_every_steps=None, stop_on_sigterm=True):
        super().__init__()
        if save_every_steps is not None and save_every_steps < 1:
            raise ValueError(f"save_every_steps must be a positive number of steps, got {save_every_steps}")
        self.backup_dir = backup_dir
        self.save_every_steps = save_every_steps
        self.stop_on_sigterm = stop_on_sigterm
        self._resumed = None  # the state restored at the start of training, until it is all restored
        self._batches_before = 0  # batches of the current epoch trained before this fit
        self._steps_since_saving = 0
        self._signal = None
        self._previous_handler = None
        self._training = False
        self._epoch = 0
        self._stop_before_next_epoch = False
        self._left_by_a_kill = []

    # -- restoring -------------------------------------------------------------------

    def on_train_begin(self, logs=None):
        state = read_backup(self.backup_dir)
        self._signal = None
        self._stop_before_next_epoch = False
        # A save a kill cut short leaves its hidden staging file (`saving.replace_whole`); those
        # here now are gone with the next save. Only those: a file staged later is a live save's.
        self._left_by_a_kill = [name for name in os.listdir(self.backup_dir) if name.startswith(".incomplete-")] \
            if os.path.isdir(self.backup_dir) else []
        if self.stop_on_sigterm and not self._training:
            # `fit` skips `on_train_end` when it fails: whoever calls fit calls
            # `stop_handling_signals()` then (`runs.fitting.fit` does).
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_signal)
        self._training = True
        if state is None:
            return
        saving.load_weights(self.model, os.path.join(self.backup_dir, state.weights))
        logger.info("resuming from the backup %s", f"after batch {state.batches_done} of epoch {state.epoch + 1}"
                    if state.batches_done else f"at the start of epoch {state.epoch + 1}")
        # Keras' fit starts at the model's initial epoch when one is set.
        self.model._initial_epoch = state.epoch
        self.model._resumed_mid_epoch = state.batches_done > 0
        self._resumed = state

    def on_epoch_begin(self, epoch, logs=None):
        if self._stop_before_next_epoch:
            self._interrupt(f"at the end of epoch {epoch}")
        self._epoch = epoch
        self._batches_before = 0
        if self._resumed is None or self._resumed.batches_done == 0 or epoch != self._resumed.epoch:
            self._resumed = None
            return
        # In the middle of an epoch: `EpochSeeds` has just put the seeds at the
        # epoch's start; the backup has them as they were after its last batch.
        self._batches_before = self._resumed.batches_done
        for variable, value in zip(_seed_variables(self.model), self._resumed.seed_states or ()):
            variable.assign(np.asarray(value, dtype=variable.dtype))

    def _carry_metrics_over(self):
        """Add the epoch's metric sums from before the stop to those of the first batch after it.

        Keras zeroes the metrics at an epoch's start and makes the compiled
        ones only in the first step, so they are there to restore only after
        it. The metrics here are running sums (a total and a count, summed
        across replicas too), so adding the saved sums gives exactly what an
        uninterrupted epoch has; a metric of another kind starts afresh.
        """
        if spans_workers(self.model.distribute_strategy):
            self._resumed = None  # each worker would add the chief's sums (see the module docstring)
            return
        for variable, values in zip(_metric_variables(self.model), self._resumed.metric_values or ()):
            if getattr(variable, "aggregation", None) == "sum":
                for part, value in zip(_local_parts(variable), values):
                    part.assign_add(np.asarray(value, dtype=part.dtype.as_numpy_dtype))
        self._resumed = None

    # -- saving ------------------------------------------------------------------------

    def on_train_batch_end(self, batch, logs=None):
        if self._resumed is not None:
            self._carry_metrics_over()
        self._steps_since_saving += 1
        batches_done = self._batches_before + batch + 1
        # After an epoch's last batch the epoch's end comes (validation, the
        # history row): a backup there is the epoch-end one, never a mid-epoch one.
        last_of_epoch = bool(self.params.get("steps")) and batch + 1 >= self.params["steps"]
        if self._stop_requested() and not last_of_epoch:
            self._save(self._epoch, batches_done)
            self._interrupt(f"after batch {batches_done} of epoch {self._epoch + 1}")
        if self.save_every_steps and self._steps_since_saving >= self.save_every_steps and not last_of_epoch:
            self._save(self._epoch, batches_done)

    def on_epoch_end(self, epoch, logs=None):
        self._batches_before = 0
        self._save(epoch + 1, 0)
        # A SIGTERM during the epoch's last step or its validation: stop when
        # the next epoch begins, once every callback has ended this one.
        self._stop_before_next_epoch = self._stop_requested()

    def on_train_end(self, logs=None):
        self.stop_handling_signals()

    def _interrupt(self, when):
        self.stop_handling_signals()
        raise TrainingInterrupted(
            f"stopped by SIGTERM {when}; its state is saved in {self.backup_dir}: rerun the same command to resume"
        )

    def _save(self, epoch, batches_done):
        os.makedirs(self.backup_dir, exist_ok=True)
        # Named by the state it holds: a file the current state names is never rewritten.
        weights = f"epoch-{epoch:05d}-batch-{batches_done:07d}.weights.h5"
        saving.replace_whole(os.path.join(self.backup_dir, weights), self.model.save_weights)
        state = BackupState(
            epoch=epoch,
            batches_done=batches_done,
            weights=weights,
            seed_states=[_to_list(variable) for variable in _seed_variables(self.model)],
            metric_values=[
                [np.asarray(part.numpy()).tolist() for part in _local_parts(variable)]
                for variable in _metric_variables(self.model)
            ],
        )
        saving.write_json(os.path.join(self.backup_dir, STATE), dataclasses.asdict(state))
        # Only now are older weights files no longer named by the state.
        for name in os.listdir(self.backup_dir):
            if name.endswith(".weights.h5") and name != weights and name.startswith("epoch-"):
                os.remove(os.path.join(self.backup_dir, name))
        for name in self._left_by_a_kill:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.backup_dir, name))
        self._left_by_a_kill = []
        self._steps_since_saving = 0

    # -- stopping on SIGTERM -----------------------------------------------------------

    def _on_signal(self, signum, frame):
        if not self._training:  # training is over: behave as if this handler were not there
            signal.signal(signum, self._previous_handler or signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self._signal = signum

    def _stop_requested(self):
        local = self._signal is not None
        strategy = self.model.distribute_strategy
        if not spans_workers(strategy):
            return local
        # Every worker votes after every step, so all of them stop after the same one.
        return _sum_of_votes(strategy, float(local)) > 0

    def stop_handling_signals(self):
        """Give SIGTERM back to the handler it had before training (call it when `fit` fails)."""
        if self._training and self.stop_on_sigterm:
            signal.signal(signal.SIGTERM, self._previous_handler or signal.SIG_DFL)
        self._training = False
        self._signal = None


# -- what a backup keeps besides the weights -------------------------------------------


def seed_generator_states(model):
    """`[(variable, its value), ...]` for every dropout seed generator of `model`, in the model's order."""
    return [
        (variable, np.array(ops.convert_to_numpy(variable.value)))
        for variable in model.non_trainable_variables
        if variable.path.endswith("seed_generator_state")
    ]


def _seed_variables(model):
    return [variable for variable, _ in seed_generator_states(model)]


def _metric_variables(model):
    return [variable for metric in model.metrics for variable in metric.variables]


def _local_parts(variable):
    """The variable's copies on this process' replicas (under a strategy a metric's sums are kept per replica)."""
    value = variable.value if isinstance(variable, keras.Variable) else variable
    if isinstance(value, tf.distribute.DistributedValues):
        return list(value.values)
    return [value]


def _to_list(variable):
    return np.asarray(ops.convert_to_numpy(variable.value)).tolist()


@functools.lru_cache(maxsize=None)
def _vote_function(strategy):
    def vote_on_each_replica(vote):
        return tf.distribute.get_replica_context().all_reduce("SUM", tf.identity(vote))

    def sum_of_votes(vote):
        return strategy.run(vote_on_each_replica, args=(vote,))

    return tf.function(sum_of_votes)


def _sum_of_votes(strategy, vote):
    votes = _vote_function(strategy)(tf.constant(vote, tf.float32))
    return float(strategy.experimental_local_results(votes)[0])


# -- reading ------------------------------------------------------------------------------


def _readable_h5(file_path):
    try:
        with h5py.File(file_path, "r"):
            return True
    except OSError:
        return False


def _read_keras_backup(backup_dir):
    """A backup in Keras' layout: its epoch and weights, or the copies it kept of the ones before."""
    metadata = os.path.join(backup_dir, _KERAS_METADATA)
    weights = _KERAS_WEIGHTS
    if not _readable_h5(os.path.join(backup_dir, weights)) and _readable_h5(os.path.join(backup_dir, weights + ".bkp")):
        # Killed while writing it: Keras' copy of the one before is whole.
        weights += ".bkp"
        if os.path.exists(metadata + ".bkp"):
            metadata += ".bkp"
    content = saving.read_json(metadata)
    epoch = content.get("epoch") if isinstance(content, dict) else None
    if not isinstance(epoch, int):
        raise saving.DamagedFileError(f"{metadata} names no epoch; pass --overwrite to start over")
    return BackupState(epoch=epoch, weights=weights)
