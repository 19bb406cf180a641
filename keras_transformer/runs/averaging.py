"""Checkpoint averaging (the paper, section 6.1): a new run whose model is the mean of a run's last epochs."""

import os
import shutil
import tempfile

from keras_transformer import saving, training
from keras_transformer.runs import run_dir as runs


def average_checkpoints(run_dir, out_dir, last=None):
    """A new run directory `out_dir` whose model is the mean of `run_dir`'s last epoch checkpoints.

    Checkpoint averaging, the paper's section 6.1: a run trained with
    `keep_checkpoints=N` keeps its last N epochs' weights; this averages the
    newest `last` of them (default: all kept). `out_dir` gets the run's
    config, vocabulary, labels and history, and the averaged `model.keras`,
    so `evaluate`, `translate`, `classify` and `export` work on it as on any
    finished run; `run_dir` is left as it was. `out_dir` must not exist yet
    (or be empty): nothing the user has is overwritten. Returns the epochs
    averaged.
    """
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise FileExistsError(f"{out_dir} already exists: averaging writes a new run directory, choose another")
    if not os.path.exists(runs.path(run_dir, runs.MODEL)):
        runs.read_config(run_dir)  # not a run directory at all: say that first
        raise FileNotFoundError(f"{run_dir} has no {runs.MODEL}: average its checkpoints once its training has finished")
    files = training.epoch_checkpoint_files(runs.path(run_dir, runs.EPOCH_CHECKPOINT))
    if not files:
        raise FileNotFoundError(
            f"{run_dir} kept no epoch checkpoints: train it with --keep-checkpoints N to average its last N epochs"
        )
    last = len(files) if last is None else last
    if not 1 <= last <= len(files):
        raise ValueError(f"--last must be between 1 and {len(files)} (the epoch checkpoints {run_dir} kept), got {last}")
    epochs = [epoch for epoch, _ in files[-last:]]
    model = saving.average_weights(saving.load_model(runs.path(run_dir, runs.MODEL)), [name for _, name in files[-last:]])

    # Written beside its final place and renamed into it: a kill leaves no half run.
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".incomplete-", dir=parent)
    try:
        for name in (runs.CONFIG, runs.VOCAB, runs.LABELS, runs.HISTORY):
            source = runs.path(run_dir, name)
            if os.path.isdir(source):
                shutil.copytree(source, runs.path(staging, name))
            elif os.path.exists(source):
                shutil.copy2(source, runs.path(staging, name))
        saving.save_model(model, runs.path(staging, runs.MODEL))
        training_metrics = runs.read_metrics(run_dir).get("training", {})
        saving.write_json(
            runs.path(staging, runs.METRICS),
            {"training": training_metrics, "averaged": {"run": os.path.abspath(run_dir), "epochs": epochs}},
        )
        if os.path.isdir(out_dir):
            os.rmdir(out_dir)  # empty, checked above
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return epochs
