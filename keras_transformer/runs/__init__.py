"""Runs: the floor that wires data, text, models, training, inference and export into tasks.

    run_dir.py         a run on disk: its layout, start / resume / continue, finishing, metrics
    fitting.py         training a run: fit epoch by epoch, resumed exactly
    averaging.py       a new run averaging a run's last checkpoints
    options.py         every setting's default, and the table of command-line options
    exporters.py       one exporter per format behind one table (`export --format`)
    translation.py     train | evaluate | translate | export | plot-attention a translator
    translation_data.py  what a translation run reads: corpus, tokenizers, token shards, batches
    classification.py  train-classifier | classify | evaluate | export a text classifier
    pretraining.py     pretrain an encoder (masked language modelling)
    encoders.py        what the two encoder tasks share: labelled corpora, class names,
                       and the encoder a classifier starts from (--init-from)

`keras-transformer` (cli.py) parses a command, and its handler (commands.py) calls a task module. A
task module never imports another; what they share is in `run_dir` (and, for the
encoder tasks, `encoders`). A new
task is one module here, its defaults and rows in `options`, and its
commands in cli.py and commands.py.
"""

import importlib


def task_module(task):
    """The module of `task` ("translation", "classification"), imported on first use."""
    from keras_transformer.runs.options import TASKS

    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; this version knows {', '.join(TASKS)}")
    return importlib.import_module(f"keras_transformer.runs.{task}")
