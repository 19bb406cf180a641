"""A run directory: the one place that knows what a training run keeps on disk.

    RUN_DIR/
      config.json      the task and everything needed to rebuild data, tokenizers and model
      vocab/           the tokenizers (a folder each: source/ target/, or shared/;
                       a classifier's vocabulary is vocab/ itself)
      tokens/          a translation corpus tokenized once: train/ and val/, TFRecord shards
                       of token ids with a manifest (data.token_shards)
      labels.txt       a classifier's class names, one a line, in label-id order
      pretrained/      an imported checkpoint's settings and tokenizer files, as it came with them
                       (no weights): what `export --format hf` writes back beside the weights
      model.keras      the trained model (the best validation checkpoint)
      checkpoints/     best.weights.h5, updated during training; with --keep-checkpoints N,
                       epoch-NNN.weights.h5 of the last N epochs too (`average_checkpoints`)
      backup/          the training state (training.TrainingBackup): a killed run resumes where it stopped
      logs/            TensorBoard (train/, validation/, samples/, embeddings/)
      history.csv      one row per epoch
      metrics.json     what training and evaluation measured, merged section by section
      hypotheses.SPLIT.txt   translations written by `evaluate`

A task module (`translation`, `classification`) wires data, text, model and
training together; everything about the directory itself (its layout, what a
rerun does, how training finishes) is here, shared by every task.
"""

import contextlib
import copy
import csv
import logging
import os
import shutil
import tempfile
import time

import keras

from keras_transformer import saving, text, training
from keras_transformer.runs.options import CLASSIFICATION, CLASSIFICATION_DATASETS, TRANSLATION, merge_config

logger = logging.getLogger("keras_transformer")

# -- the layout ----------------------------------------------------------------

CONFIG = "config.json"
VOCAB = "vocab"
TOKENS = "tokens"
LABELS = "labels.txt"
PRETRAINED = "pretrained"
MODEL = "model.keras"
CHECKPOINTS = "checkpoints"
BEST_CHECKPOINT = os.path.join(CHECKPOINTS, "best.weights.h5")
EPOCH_CHECKPOINT = os.path.join(CHECKPOINTS, "epoch-{epoch:03d}.weights.h5")
BACKUP = "backup"
LOGS = "logs"
HISTORY = "history.csv"
METRICS = "metrics.json"
HYPOTHESES = "hypotheses.{split}.txt"

# Everything a run writes into its directory, and so everything `overwrite`
# removes; anything else there is the user's and is never touched.
RUN_FILES = (CONFIG, VOCAB, TOKENS, LABELS, PRETRAINED, MODEL, CHECKPOINTS, BACKUP, LOGS, HISTORY, METRICS)
# What `--precision auto` chose when the run started, and why: recorded in
# the config, and kept when the run resumes (on this machine or another).
PRECISION_CHOSEN = ("precision_chosen", "precision_reason")
# Settings a trained run may be given anew when it is continued: how long it
# trains, what it logs, how it is evaluated. Any other change needs a new run.
CONTINUABLE_SETTINGS = {
    "training": (
        "epochs", "attention_samples", "bleu_samples", "projector_samples", "cluster_timeout", "save_every_steps",
        "keep_checkpoints", *PRECISION_CHOSEN,
    ),
    "evaluation": None,
}


def path(run_dir, *names):
    """`run_dir/names...`, for the names above: `path(run_dir, MODEL)`."""
    return os.path.join(run_dir, *names)


def vocab_path(run_dir, name=""):
    """The folder of the tokenizer `name` ("source", "target", "shared"; "" for a task's only one)."""
    return os.path.join(run_dir, VOCAB, name)


def tokens_path(run_dir, split):
    return path(run_dir, TOKENS, split)


def log_path(run_dir, name=""):
    """A TensorBoard log folder of the run: `tensorboard --logdir log_path(run_dir)`."""
    return os.path.join(run_dir, LOGS, name)


def hypotheses_path(run_dir, split):
    return os.path.join(run_dir, HYPOTHESES.format(split=split))


# -- the config ------------------------------------------------------------------


def read_config(run_dir):
    """The config a run saved, as written (no defaults merged in)."""
    config_path = path(run_dir, CONFIG)
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"{run_dir} is not a run directory: it has no {CONFIG}")
    return saving.read_json(config_path)


def task_of(run_dir):
    """The task a run directory trains ("translation", "classification"), from its config."""
    config = read_config(run_dir)
    if "task" in config:
        return config["task"]
    # Runs made before configs named their task: a classifier's corpus says it.
    dataset = config.get("data", {}).get("dataset")
    return CLASSIFICATION if dataset in CLASSIFICATION_DATASETS else TRANSLATION


def load_config(run_dir, defaults):
    """The run's config over `defaults` (settings added since the run started take their default)."""
    return merge_config(defaults, read_config(run_dir))


# -- starting, resuming, continuing ------------------------------------------------


class RunState:
    """Where a run directory stands, read from its files before training.

    `epochs_done`: epochs trained (from the backup); `batches_done`: batches
    of the next epoch trained before the run stopped (a backup written during
    an epoch, `--save-every-steps` or SIGTERM); `finished`: those epochs reach the configured number, or early stopping
    ended the run; `best_so_far`: the best monitored value of those epochs
    (from `history.csv`), so a continued run keeps a better checkpoint.
    """

    def __init__(self, run_dir, config):
        monitor = config["training"].get("monitor", "val_loss")
        backup = training.read_backup(path(run_dir, BACKUP))
        self.epochs_done = backup.epoch if backup else len(_history_rows(run_dir))
        self.batches_done = backup.batches_done if backup else 0
        self.trained = self.epochs_done > 0 or self.batches_done > 0 or any(
            os.path.exists(path(run_dir, name)) for name in (MODEL, BEST_CHECKPOINT)
        )
        metrics = read_metrics(run_dir)
        stopped_early = metrics.get("training", {}).get("stopped_early_after")
        # A run killed after its last epoch but before writing model.keras
        # is not finished: fitting it for no more epochs writes the file.
        self.finished = os.path.exists(path(run_dir, MODEL)) and (
            self.epochs_done >= config["training"]["epochs"] or stopped_early == self.epochs_done
        )
        self.best_so_far = _best_in_history(run_dir, monitor, self.epochs_done)


def start(run_dir, config, defaults, overwrite=False):
    """Create, restart or reopen `run_dir`; returns its config, the distribution strategy and its `RunState`.

    The rules, so that a rerun never loses work nor silently ignores what it
    was asked:
    - a new directory (or an empty one) starts a run with `config`;
    - a run that never trained a step it kept (a failed start) starts again with
      the new `config`;
    - a trained run continues with the config it saved; only its epochs (and
      what it logs and how it is evaluated) may be given anew, so `epochs`
      above the epochs done trains a finished run further, from exactly where
      it stopped; any other change is refused with the settings that differ;
    - `overwrite=True` removes the run's files (`RUN_FILES`, nothing else)
      and starts over.
    A directory that holds other files but no run is refused. Seeds,
    precision and strategy are set from the resulting config.
    """
    check_is_run_directory(run_dir)
    if overwrite:
        _remove_run_files(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    config_path = path(run_dir, CONFIG)
    requested = merge_config(defaults, config)
    if os.path.exists(config_path):
        saved = merge_config(defaults, saving.read_json(config_path))
        if requested["training"]["precision"] == training.AUTO:
            # "auto" leaves the precision to the run: a run started before
            # "auto" existed goes on in the precision it was given.
            requested["training"]["precision"] = saved["training"]["precision"]
        state = RunState(run_dir, saved)
        if not state.trained:
            if _without_precision_chosen(saved) != requested:
                logger.info("%s never kept a trained step: starting it again with the new settings", run_dir)
                _remove_run_files(run_dir)
                os.makedirs(run_dir, exist_ok=True)
        else:
            changed = _changed_settings(saved, requested)
            if changed:
                raise ValueError(
                    f"{run_dir} holds a run trained with other settings ({changed}); rerun it with the "
                    "settings it was started with (only --epochs may change, to train it further), "
                    "or pass --overwrite to start over"
                )
            requested = _continued_config(saved, requested)
    settings = requested["training"]
    if "precision_chosen" not in settings:
        settings["precision_chosen"], settings["precision_reason"] = training.choose_precision(settings["precision"])
    saving.write_json(config_path, requested)
    config = requested
    state = RunState(run_dir, config)
    keras.utils.set_random_seed(settings["seed"])
    training.set_precision(settings["precision_chosen"])
    strategy = training.make_strategy(settings["strategy"], settings["cpu_replicas"], settings["cluster_timeout"])
    logger.info("precision: %s (%s)", settings["precision_chosen"], settings["precision_reason"])
    return config, strategy, state


@contextlib.contextmanager
def written_by_this_process(run_dir):
    """The directory this process writes the run into: `run_dir`, except on a cluster's other workers.

    One writer per run directory: on a cluster (`TF_CONFIG`) only the chief
    writes `run_dir`. Every other worker trains on a private copy of it
    (taken at the start, without the TensorBoard logs and the token shards:
    the same config, vocabularies and backup, so it resumes where the chief does), which is
    removed when training ends. TensorFlow's convention for multi-worker
    checkpoints is the same.
    """
    if training.is_chief():
        yield run_dir
        return
    private = tempfile.mkdtemp(prefix="keras-transformer-worker-")
    try:
        if os.path.isdir(run_dir):
            # Without the logs, nor the token shards (gigabytes for a large
            # corpus), which a worker reads where they are.
            shutil.copytree(run_dir, private, dirs_exist_ok=True, ignore=shutil.ignore_patterns(LOGS, TOKENS))
        yield private
    finally:
        shutil.rmtree(private, ignore_errors=True)


def check_is_run_directory(run_dir):
    """Refuse (FileExistsError) a `run_dir` that is a file, or a directory of other files and no run."""
    if not os.path.isdir(run_dir):
        if os.path.exists(run_dir):
            raise FileExistsError(f"{run_dir} exists and is not a directory: choose another --out")
        return
    foreign = sorted(name for name in os.listdir(run_dir) if not _is_run_file(name))
    if foreign and not os.path.exists(path(run_dir, CONFIG)):
        raise FileExistsError(
            f"{run_dir} is not a run directory (no {CONFIG}) and holds other files ({', '.join(foreign[:3])}): "
            "choose another --out"
        )


def _is_run_file(name):
    prefix, _, suffix = HYPOTHESES.partition("{split}")
    return name in RUN_FILES or (name.startswith(prefix) and name.endswith(suffix))


def _remove_run_files(run_dir):
    if not os.path.isdir(run_dir):
        return
    for name in os.listdir(run_dir):
        if _is_run_file(name):
            file_path = path(run_dir, name)
            shutil.rmtree(file_path) if os.path.isdir(file_path) else os.remove(file_path)


def _changed_settings(saved, requested):
    """'section.key: saved -> requested' for each setting that differs and may not change."""
    changes = []
    for section in sorted(set(saved) | set(requested)):
        continuable = CONTINUABLE_SETTINGS.get(section, ())
        if continuable is None:
            continue
        old, new = saved.get(section), requested.get(section)
        if not isinstance(old, dict) or not isinstance(new, dict):  # a top-level setting, such as the task
            if old != new:
                changes.append(f"{section}: {old!r} saved, {new!r} given")
            continue
        for key in sorted(set(old) | set(new)):
            if key not in continuable and old.get(key) != new.get(key):
                changes.append(f"{section}.{key}: {old.get(key)!r} saved, {new.get(key)!r} given")
    return "; ".join(changes)


def _without_precision_chosen(config):
    config = copy.deepcopy(config)
    for key in PRECISION_CHOSEN:
        config["training"].pop(key, None)
    return config


def _continued_config(saved, requested):
    config = copy.deepcopy(saved)
    for section, keys in CONTINUABLE_SETTINGS.items():
        for key in requested.get(section, {}) if keys is None else keys:
            if key in requested.get(section, {}):
                config.setdefault(section, {})[key] = requested[section][key]
    return config


def _history_rows(run_dir):
    history = path(run_dir, HISTORY)
    if not os.path.exists(history):
        return []
    with open(history, newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))


def _best_in_history(run_dir, monitor, epochs):
    values = [float(row[monitor]) for row in _history_rows(run_dir)[:epochs] if row.get(monitor) not in (None, "")]
    if not values:
        return None
    return max(values) if "acc" in monitor else min(values)


def _keep_history_of_done_epochs(run_dir, epochs_done):
    """Drop `history.csv` rows of epochs that will be trained again (a kill after the row, before the backup)."""
    rows = _history_rows(run_dir)
    if len(rows) <= epochs_done:
        return
    with open(path(run_dir, HISTORY), "w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows[:epochs_done])


# -- finishing -----------------------------------------------------------------------


def nothing_to_train(run_dir, state):
    """A finished run's saved metrics, its training part marked as not trained this session."""
    metrics = read_metrics(run_dir)
    metrics["training"] = {
        **metrics.get("training", {}), "epochs_done": state.epochs_done, "epochs_this_session": 0,
        "nothing_to_train": True,
    }
    return metrics


def read_metrics(run_dir):
    metrics_path = path(run_dir, METRICS)
    return saving.read_json(metrics_path) if os.path.exists(metrics_path) else {}


def update_metrics(run_dir, update):
    """Merge `update` ({section: values}) into `metrics.json`, section by section; returns all metrics."""
    metrics = read_metrics(run_dir)
    metrics.update(update)
    saving.write_json(path(run_dir, METRICS), metrics)
    return metrics


# The precision every inference road computes in unless asked otherwise: `translate`,
# `evaluate`, the exports (SavedModel, CTranslate2, LiteRT), a classifier's and a
# language model's runs. float32 whatever the run trained in: a mixed-precision run
# keeps its weights in float32, so only the arithmetic changes, and every road then
# gives the same outputs on every machine (CTranslate2 computes in float32 on a CPU).
INFERENCE_PRECISION = "float32"

# A builtin LiteRT export checks its host tokenizers on at most this many of the run's held-out texts.
HELD_OUT_TEXTS = 1000


def held_out_texts(read):
    """`read()`'s texts (the first `HELD_OUT_TEXTS`), or none where the run's data cannot be read.

    A run's corpus may have moved since it trained: its export is then
    checked on the probe sentences alone (`export.litert.export_litert`),
    as an imported checkpoint's is (the caller reads none for it).
    """
    try:
        return list(read())[:HELD_OUT_TEXTS]
    except (OSError, ValueError, KeyError, RuntimeError):
        return []
INFERENCE_PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")


def load_trained_model(run_dir, build_model, precision=INFERENCE_PRECISION):
    """`model.keras` once training has finished; before that, the best checkpoint so far.

    So a run that is still training (or was killed) can be evaluated and
    tried out without stopping it. `build_model()` makes the run's model,
    built, for the checkpoint's weights.

    The model computes in `precision` (one of `INFERENCE_PRECISIONS`: float32
    by default, whatever the run trained in), from the run's float32
    weights; None keeps the policy the model was saved with.
    """
    if precision is not None and precision not in INFERENCE_PRECISIONS:
        raise ValueError(f"precision must be one of {INFERENCE_PRECISIONS}, got {precision!r}")
    model_path = path(run_dir, MODEL)
    if os.path.exists(model_path):
        return saving.load_model(model_path, dtype_policy=precision)
    checkpoint = path(run_dir, BEST_CHECKPOINT)
    if not os.path.exists(checkpoint):
        raise FileNotFoundError(f"{run_dir} has neither {MODEL} nor a checkpoint: has its first epoch finished?")
    logger.warning("%s has no %s (training not finished): using %s", run_dir, MODEL, checkpoint)
    with _global_dtype_policy(precision):
        model = build_model()
    saving.load_weights(model, checkpoint)
    return model


@contextlib.contextmanager
def _global_dtype_policy(name):
    """Keras' global dtype policy set to `name` (None: left alone), and set back after."""
    if name is None:
        yield
        return
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def compile_token_prediction(model, d_model, settings, label_smoothing=0.1):
    """Compile a model that predicts tokens (a translator, a masked or a causal language model).

    The paper's Adam on its warm-up schedule (with the run's scale, moving
    average and gradient accumulation), the cross-entropy over real tokens
    (padding and unpredicted positions are 0 and skipped), masked accuracy
    and perplexity; the optimizer's variables are made now.
    """
    model.compile(
        optimizer=training.transformer_optimizer(
            d_model, settings["warmup_steps"], settings["learning_rate_scale"],
            ema_momentum=settings["ema_momentum"], accumulate_steps=settings["accumulate_steps"],
        ),
        loss=training.MaskedSparseCrossEntropy(label_smoothing),
        metrics=[training.MaskedAccuracy(), training.Perplexity()],
        jit_compile=settings["jit_compile"],
    )
    training.build_optimizer_variables(model)


def has_tokenizer(run_dir, name):
    return os.path.exists(os.path.join(vocab_path(run_dir, name), text.TOKENIZER_SETTINGS))  # written last


def learn_or_load_tokenizer(run_dir, name, texts, vocab_size, lower_case, reserved_tokens=None,
                            sentencepiece_settings=None):
    """The run's tokenizer `name`: loaded when the run has it, else learned from `texts` and saved.

    WordPiece, or with `sentencepiece_settings` (`{"model_type",
    "character_coverage"}`) a SentencePiece model (`text.SentencePieceTokenizer.learn`).
    """
    folder = vocab_path(run_dir, name)
    if has_tokenizer(run_dir, name):
        return text.load_tokenizer(folder)
    started = time.time()
    if sentencepiece_settings is not None:
        tokenizer = text.SentencePieceTokenizer.learn(texts, vocab_size=vocab_size, lower_case=lower_case,
                                                      **sentencepiece_settings)
    else:
        tokenizer = text.WordPieceTokenizer.learn(
            texts, vocab_size=vocab_size, lower_case=lower_case, reserved_tokens=reserved_tokens or text.RESERVED_TOKENS
        )
    tokenizer.save(folder)
    logger.info("learned a vocabulary of %d tokens (%s) in %.0fs", tokenizer.vocab_size, folder, time.time() - started)
    return tokenizer


def load_tokenizer(run_dir, name=""):
    return text.load_tokenizer(vocab_path(run_dir, name))
