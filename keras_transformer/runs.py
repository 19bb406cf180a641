"""A training run on disk: what `keras-transformer train|evaluate|translate|export` work on.

    RUN_DIR/
      config.json      everything needed to rebuild data, tokenizers and model
      vocab/source/    vocab/target/   (one folder, vocab/shared/, when shared)
      model.keras      the trained model (the best validation checkpoint)
      checkpoints/     best.weights.h5, updated during training
      backup/          BackupAndRestore: a killed run resumes where it stopped
      logs/            TensorBoard
      history.csv      one row per epoch
      metrics.json     validation BLEU and friends

This module is the one place (with the CLI on top of it) that wires data,
tokenizers, model, training and inference together.
"""

import copy
import csv
import logging
import os
import random
import shutil
import time
import warnings

import h5py
import keras

from keras_transformer import data, evaluation, inference, models, saving, text, training

logger = logging.getLogger("keras_transformer")

DATASETS = ("demo", "multi30k", "files")

DEFAULT_CONFIG = {
    "data": {
        "dataset": "demo",
        "data_dir": None,
        "direction": "de-en",  # Multi30k only
        "train_source": None,  # dataset "files": two aligned files or one TSV
        "train_target": None,
        "train_tsv": None,
        "val_source": None,
        "val_target": None,
        "val_tsv": None,
        "limit_train": None,  # use only the first N training pairs
        "limit_val": None,
    },
    "tokenizer": {"vocab_size": 8000, "shared": False, "lower_case": False},
    "model": {"preset": "small"},  # plus any Transformer argument
    "training": {
        "epochs": 10,
        "max_length": 128,
        "long_pairs": "drop",
        "tokens_per_batch": 4096,
        "batch_size": None,
        "warmup_steps": 4000,
        "learning_rate_scale": 1.0,
        "label_smoothing": 0.1,
        "steps_per_epoch": None,
        "early_stopping": None,
        "strategy": "auto",
        "cpu_replicas": None,
        "precision": "float32",
        "jit_compile": False,
        "seed": 0,
        # TensorBoard: attention maps of this many validation pairs, and the
        # greedy BLEU of this many, after every epoch (0 turns either off).
        "attention_samples": 3,
        "bleu_samples": 200,
    },
    "evaluation": {"beam_size": 4, "length_alpha": 0.6, "max_extra_length": 50, "batch_size": 64},
}

# The demo: small enough to train in a few minutes on two CPU cores. bfloat16
# matmuls are ~1.4x faster than float32 on CPUs with AMX (and on GPUs).
DEMO_CONFIG = {
    "data": {"dataset": "demo"},
    "tokenizer": {"vocab_size": 1000},
    "model": {"preset": None, "num_layers": 2, "d_model": 128, "num_heads": 4, "d_ff": 512, "dropout": 0.1},
    "training": {
        "epochs": 4,
        "max_length": 40,
        "tokens_per_batch": 3072,
        "warmup_steps": 300,
        "precision": "mixed_bfloat16",
    },
    "evaluation": {"beam_size": 1},
}


def merge_config(base, overrides):
    """Nested dict update that returns a new dict."""
    merged = copy.deepcopy(base)
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_config(merged[key], value)
        else:
            merged[key] = value
    return merged


# -- data ---------------------------------------------------------------------


def load_pairs(data_config, splits=("train", "val")):
    """`{split: [(source, target), ...]}` for the configured corpus."""
    dataset = data_config["dataset"]
    if dataset not in DATASETS:
        raise ValueError(f"dataset must be one of {DATASETS}, got {dataset!r}")
    if dataset == "demo":
        corpus = data.demo_corpus()
        pairs = {split: corpus[split] for split in splits}
    elif dataset == "multi30k":
        pairs = data.load_multi30k(data_config["data_dir"], data_config["direction"], splits=splits)
    else:
        pairs = {}
        for split in splits:
            tsv, source, target = (data_config.get(f"{split}_{kind}") for kind in ("tsv", "source", "target"))
            if tsv:
                pairs[split] = data.read_tsv(tsv)
            elif source and target:
                pairs[split] = data.read_parallel_files(source, target)
            elif split == "val" and "train" in pairs:
                # No validation files: hold back 2% of training (at most 1000 pairs).
                shuffled = list(pairs["train"])
                random.Random(0).shuffle(shuffled)
                held = max(1, min(1000, len(shuffled) // 50))
                pairs["val"], pairs["train"] = shuffled[:held], shuffled[held:]
            else:
                raise ValueError(
                    f"dataset 'files' needs --{split}-tsv, or --{split}-source with --{split}-target"
                )
    for split in splits:
        limit = data_config.get(f"limit_{split}")
        if limit:
            pairs[split] = pairs[split][:limit]
    return pairs


def _vocab_dirs(run_dir, shared):
    vocab = os.path.join(run_dir, "vocab")
    if shared:
        return os.path.join(vocab, "shared"), os.path.join(vocab, "shared")
    return os.path.join(vocab, "source"), os.path.join(vocab, "target")


def learn_or_load_tokenizers(run_dir, tokenizer_config, train_pairs):
    """The run's tokenizers: loaded when the run has them, else learned from training text and saved."""
    source_dir, target_dir = _vocab_dirs(run_dir, tokenizer_config["shared"])
    if os.path.exists(os.path.join(target_dir, "vocab.txt")):
        return text.WordPieceTokenizer.load(source_dir), text.WordPieceTokenizer.load(target_dir)
    settings = dict(vocab_size=tokenizer_config["vocab_size"], lower_case=tokenizer_config["lower_case"])
    started = time.time()
    if tokenizer_config["shared"]:
        shared = text.WordPieceTokenizer.learn([s for s, _ in train_pairs] + [t for _, t in train_pairs], **settings)
        source, target = shared, shared
    else:
        source = text.WordPieceTokenizer.learn([s for s, _ in train_pairs], **settings)
        target = text.WordPieceTokenizer.learn([t for _, t in train_pairs], **settings)
    source.save(source_dir)
    target.save(target_dir)
    logger.info(
        "learned vocabularies (source %d, target %d tokens) in %.0fs",
        source.vocab_size, target.vocab_size, time.time() - started,
    )
    return source, target


def load_tokenizers(run_dir, config):
    source_dir, target_dir = _vocab_dirs(run_dir, config["tokenizer"]["shared"])
    return text.WordPieceTokenizer.load(source_dir), text.WordPieceTokenizer.load(target_dir)


# -- model --------------------------------------------------------------------


def build_model(model_config, source_vocab_size, target_vocab_size, max_length):
    arguments = {key: value for key, value in model_config.items() if key != "preset"}
    arguments.update(src_vocab_size=source_vocab_size, tgt_vocab_size=target_vocab_size, max_length=max_length)
    if model_config.get("preset"):
        return models.Transformer.from_preset(model_config["preset"], **arguments)
    return models.Transformer(**arguments)


def compile_model(model, training_config):
    model.compile(
        optimizer=training.transformer_optimizer(
            model.d_model, training_config["warmup_steps"], training_config["learning_rate_scale"]
        ),
        loss=training.MaskedSparseCrossEntropy(training_config["label_smoothing"]),
        metrics=[training.MaskedAccuracy(), training.Perplexity()],
        jit_compile=training_config["jit_compile"],
    )
    training.build_optimizer_variables(model)


# -- the run directory -------------------------------------------------------

# Everything a run writes into its directory, and so everything `overwrite`
# removes; anything else there is the user's and is never touched.
RUN_FILES = ("config.json", "vocab", "model.keras", "checkpoints", "backup", "logs", "history.csv", "metrics.json")
# Settings a trained run may be given anew when it is continued: how long it
# trains, what it logs, how it is evaluated. Any other change needs a new run.
CONTINUABLE_SETTINGS = {"training": ("epochs", "attention_samples", "bleu_samples"), "evaluation": None}


class RunState:
    """Where a run directory stands, read from its files before training.

    `epochs_done`: epochs trained (from the backup written after each epoch);
    `finished`: those epochs reach the configured number, or early stopping
    ended the run; `best_so_far`: the best monitored value of those epochs
    (from `history.csv`), so a continued run keeps a better checkpoint.
    """

    def __init__(self, run_dir, config):
        monitor = config["training"].get("monitor", "val_loss")
        self.epochs_done = _epochs_done(run_dir)
        self.trained = self.epochs_done > 0 or any(
            os.path.exists(os.path.join(run_dir, name))
            for name in ("model.keras", os.path.join("checkpoints", "best.weights.h5"))
        )
        metrics_path = os.path.join(run_dir, "metrics.json")
        metrics = saving.read_json(metrics_path) if os.path.exists(metrics_path) else {}
        stopped_early = metrics.get("training", {}).get("stopped_early_after")
        # A run killed after its last epoch but before writing model.keras
        # is not finished: fitting it for no more epochs writes the file.
        self.finished = os.path.exists(os.path.join(run_dir, "model.keras")) and (
            self.epochs_done >= config["training"]["epochs"] or stopped_early == self.epochs_done
        )
        self.best_so_far = _best_in_history(run_dir, monitor, self.epochs_done)


def load_config(run_dir):
    path = os.path.join(run_dir, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{run_dir} is not a run directory: it has no config.json")
    return merge_config(DEFAULT_CONFIG, saving.read_json(path))


def start_run(run_dir, config, defaults, overwrite=False):
    """Create, restart or reopen `run_dir`; returns its config, the distribution strategy and its `RunState`.

    The rules, so that a rerun never loses work nor silently ignores what it
    was asked:
    - a new directory (or an empty one) starts a run with `config`;
    - a run that never finished an epoch (a failed start) starts again with
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
    _check_is_run_directory(run_dir)
    if overwrite:
        _remove_run_files(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    config_path = os.path.join(run_dir, "config.json")
    requested = merge_config(defaults, config)
    if os.path.exists(config_path):
        saved = merge_config(defaults, saving.read_json(config_path))
        state = RunState(run_dir, saved)
        if not state.trained:
            if saved != requested:
                logger.info("%s never finished an epoch: starting it again with the new settings", run_dir)
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
    saving.write_json(config_path, requested)
    config = requested
    state = RunState(run_dir, config)
    settings = config["training"]
    keras.utils.set_random_seed(settings["seed"])
    training.set_precision(settings["precision"])
    return config, training.make_strategy(settings["strategy"], settings["cpu_replicas"]), state


def _check_is_run_directory(run_dir):
    if not os.path.isdir(run_dir):
        if os.path.exists(run_dir):
            raise FileExistsError(f"{run_dir} exists and is not a directory: choose another --out")
        return
    foreign = sorted(name for name in os.listdir(run_dir) if name not in RUN_FILES and not name.startswith("hypotheses."))
    if foreign and not os.path.exists(os.path.join(run_dir, "config.json")):
        raise FileExistsError(
            f"{run_dir} is not a run directory (no config.json) and holds other files ({', '.join(foreign[:3])}): "
            "choose another --out"
        )


def _remove_run_files(run_dir):
    if not os.path.isdir(run_dir):
        return
    for name in os.listdir(run_dir):
        path = os.path.join(run_dir, name)
        if name in RUN_FILES or name.startswith("hypotheses."):
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def _changed_settings(saved, requested):
    """'section.key: saved -> requested' for each setting that differs and may not change."""
    changes = []
    for section in sorted(set(saved) | set(requested)):
        continuable = CONTINUABLE_SETTINGS.get(section, ())
        if continuable is None:
            continue
        old, new = saved.get(section, {}), requested.get(section, {})
        for key in sorted(set(old) | set(new)):
            if key not in continuable and old.get(key) != new.get(key):
                changes.append(f"{section}.{key}: {old.get(key)!r} saved, {new.get(key)!r} given")
    return "; ".join(changes)


def _continued_config(saved, requested):
    config = copy.deepcopy(saved)
    for section, keys in CONTINUABLE_SETTINGS.items():
        for key in requested.get(section, {}) if keys is None else keys:
            if key in requested.get(section, {}):
                config.setdefault(section, {})[key] = requested[section][key]
    return config


def _epochs_done(run_dir):
    """Epochs trained so far: the backup's count (validated), else the rows of `history.csv`."""
    backup = os.path.join(run_dir, "backup")
    metadata = os.path.join(backup, "training_metadata.json")
    if os.path.exists(metadata):
        weights = os.path.join(backup, "latest.weights.h5")
        if not _readable_h5(weights):
            # Killed while writing the backup: Keras falls back to the one before it.
            previous = weights + ".bkp"
            if not _readable_h5(previous):
                raise saving.DamagedFileError(
                    f"{weights} is damaged and there is no earlier backup to resume from; "
                    "pass --overwrite to start the run over"
                )
            shutil.copyfile(previous, weights)
            if os.path.exists(metadata + ".bkp"):
                shutil.copyfile(metadata + ".bkp", metadata)
        return int(saving.read_json(metadata)["epoch"])
    return len(_history_rows(run_dir))


def _readable_h5(path):
    try:
        with h5py.File(path, "r"):
            return True
    except OSError:
        return False


def _history_rows(run_dir):
    path = os.path.join(run_dir, "history.csv")
    if not os.path.exists(path):
        return []
    with open(path, newline="", encoding="utf-8") as file:
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
    path = os.path.join(run_dir, "history.csv")
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows[:epochs_done])


def fit_run(model, run_dir, state, train_dataset, fit_arguments, callbacks):
    """`model.fit` for a run in `state`: resumed where it stopped, its history kept, `model.keras` written.

    Returns `(history, seconds, stopped_early)`; the model ends with the best
    checkpoint's weights, as `model.keras` holds them.
    """
    _keep_history_of_done_epochs(run_dir, state.epochs_done)
    started = time.time()
    with warnings.catch_warnings():
        # A dataset of unknown length (a shuffle_each_epoch one) ends its
        # first epoch by running out of data, as it should.
        warnings.filterwarnings("ignore", message="Your input ran out of data")
        history = model.fit(train_dataset, shuffle=False, callbacks=callbacks, **fit_arguments)  # the pipeline shuffles
    seconds = time.time() - started
    epochs_done = state.epochs_done + len(history.epoch)
    stopped_early = any(
        isinstance(callback, keras.callbacks.EarlyStopping) and callback.stopped_epoch > 0 for callback in callbacks
    )
    best = os.path.join(run_dir, "checkpoints", "best.weights.h5")
    if os.path.exists(best):
        saving.load_weights(model, best)
    saving.save_model(model, os.path.join(run_dir, "model.keras"))
    return history, seconds, epochs_done if stopped_early else None


# -- the three commands -------------------------------------------------------


def train(config, run_dir, verbose=1, overwrite=False):
    """Train, resume or continue a translation run in `run_dir`; returns the metrics dict.

    Rerunning with the same `run_dir` after an interruption resumes at the
    epoch after the last one completed, exactly as if it had not stopped;
    see `start_run` for what a rerun does with a finished run or new settings.
    """
    config, strategy, state = start_run(run_dir, config, DEFAULT_CONFIG, overwrite=overwrite)
    settings = config["training"]
    if state.finished:
        return nothing_to_train(run_dir, state)["training"]

    replicas = strategy.num_replicas_in_sync
    pairs = load_pairs(config["data"], ("train", "val"))
    source_tokenizer, target_tokenizer = learn_or_load_tokenizers(run_dir, config["tokenizer"], pairs["train"])
    batching = dict(
        max_length=settings["max_length"],
        tokens_per_batch=settings["tokens_per_batch"] if not settings["batch_size"] else None,
        batch_size=settings["batch_size"],
        long_pairs=settings["long_pairs"],
        batch_multiple=replicas,
    )
    train_batches = data.make_translation_batches(
        pairs["train"], source_tokenizer, target_tokenizer, shuffle=True, seed=settings["seed"], **batching
    )
    val_batches = data.make_translation_batches(
        pairs["val"], source_tokenizer, target_tokenizer, shuffle=False, **batching
    )
    logger.info(
        "training pairs: %d kept, %d dropped and %d truncated for max_length=%d",
        train_batches.num_pairs, train_batches.num_dropped, train_batches.num_truncated, settings["max_length"],
    )

    with strategy.scope():
        model = build_model(config["model"], source_tokenizer.vocab_size, target_tokenizer.vocab_size, settings["max_length"])
        model.build(((None, None), (None, None)))
        compile_model(model, settings)
    logger.info("model: %d parameters, %d replica(s)", model.count_params(), strategy.num_replicas_in_sync)
    if state.epochs_done:
        logger.info("%s: %d epoch(s) done, training on to %d", run_dir, state.epochs_done, settings["epochs"])

    train_dataset = train_batches.dataset
    if settings["steps_per_epoch"]:
        train_dataset = train_dataset.repeat()
    callbacks = training.training_callbacks(
        run_dir, settings["early_stopping"], epoch_variables=[train_batches.epoch], best_so_far=state.best_so_far
    ) + _sample_callbacks(run_dir, settings, pairs["val"], source_tokenizer, target_tokenizer)
    history, seconds, stopped_early_after = fit_run(
        model, run_dir, state, train_dataset,
        dict(validation_data=val_batches.dataset, epochs=settings["epochs"],
             steps_per_epoch=settings["steps_per_epoch"], verbose=verbose),
        callbacks,
    )

    epochs_run = len(history.epoch)
    metrics = {
        "train_pairs": train_batches.num_pairs,
        "train_pairs_dropped": train_batches.num_dropped,
        "train_pairs_truncated": train_batches.num_truncated,
        "epochs_done": state.epochs_done + epochs_run,
        "stopped_early_after": stopped_early_after,
        "epochs_this_session": epochs_run,
        "seconds_this_session": round(seconds, 1),
        "seconds_per_epoch": round(seconds / max(epochs_run, 1), 1),
        "parameters": model.count_params(),
        "replicas": strategy.num_replicas_in_sync,
        "final": {key: float(values[-1]) for key, values in history.history.items()} if epochs_run else {},
    }
    _update_metrics(run_dir, {"training": metrics})
    return metrics


def nothing_to_train(run_dir, state):
    """A finished run's saved metrics, its training part marked as not trained this session."""
    path = os.path.join(run_dir, "metrics.json")
    metrics = saving.read_json(path) if os.path.exists(path) else {}
    metrics["training"] = {
        **metrics.get("training", {}), "epochs_done": state.epochs_done, "epochs_this_session": 0,
        "nothing_to_train": True,
    }
    return metrics


def _sample_callbacks(run_dir, settings, val_pairs, source_tokenizer, target_tokenizer):
    from keras_transformer.callbacks import AttentionMapLogger, attention_samples

    samples = attention_samples(val_pairs, settings["attention_samples"])
    if not samples:
        return []
    return [
        AttentionMapLogger(
            samples,
            os.path.join(run_dir, "logs", "samples"),
            source_tokenizer,
            target_tokenizer,
            bleu_pairs=val_pairs[: settings["bleu_samples"]],
        )
    ]


def _update_metrics(run_dir, update):
    path = os.path.join(run_dir, "metrics.json")
    metrics = saving.read_json(path) if os.path.exists(path) else {}
    metrics.update(update)
    saving.write_json(path, metrics)
    return metrics


def _load_trained_model(run_dir, config, source_vocab_size, target_vocab_size):
    """`model.keras` once training has finished; before that, the best checkpoint so far.

    So a run that is still training (or was killed) can be evaluated and
    tried out without stopping it.
    """
    model_path = os.path.join(run_dir, "model.keras")
    if os.path.exists(model_path):
        return saving.load_model(model_path)
    checkpoint = os.path.join(run_dir, "checkpoints", "best.weights.h5")
    if not os.path.exists(checkpoint):
        raise FileNotFoundError(f"{run_dir} has neither model.keras nor a checkpoint: has its first epoch finished?")
    logger.warning("%s has no model.keras (training not finished): using %s", run_dir, checkpoint)
    model = build_model(config["model"], source_vocab_size, target_vocab_size, config["training"]["max_length"])
    model.build(((None, None), (None, None)))
    saving.load_weights(model, checkpoint)
    return model


def load_translator(run_dir, beam_size=None, length_alpha=None, max_extra_length=None, max_output_length=None):
    """The run's model and tokenizers as a `Translator` (settings default to the config's)."""
    config = load_config(run_dir)
    source_tokenizer, target_tokenizer = load_tokenizers(run_dir, config)
    model = _load_trained_model(run_dir, config, source_tokenizer.vocab_size, target_tokenizer.vocab_size)
    settings = config["evaluation"]
    return inference.Translator(
        model,
        source_tokenizer,
        target_tokenizer,
        beam_size=beam_size or settings["beam_size"],
        length_alpha=settings["length_alpha"] if length_alpha is None else length_alpha,
        max_extra_length=settings["max_extra_length"] if max_extra_length is None else max_extra_length,
        max_output_length=max_output_length,
    )


def evaluate(run_dir, split="val", beam_size=None, batch_size=None):
    """Translate a split, write `hypotheses.<split>.txt`, return and record BLEU/chrF."""
    config = load_config(run_dir)
    translator = load_translator(run_dir, beam_size=beam_size)
    pairs = load_pairs(config["data"], (split,))[split]
    started = time.time()
    hypotheses = translator.translate([source for source, _ in pairs], batch_size=batch_size or config["evaluation"]["batch_size"])
    seconds = time.time() - started
    path = os.path.join(run_dir, f"hypotheses.{split}.txt")
    with open(path, "w", encoding="utf-8") as file:
        file.write("\n".join(hypotheses) + "\n")
    scores = evaluation.translation_scores(hypotheses, [target for _, target in pairs])
    scores.update(beam_size=translator.beam_size, seconds=round(seconds, 1), hypotheses=path)
    _update_metrics(run_dir, {f"{split}": scores})
    samples = [
        {"source": source, "reference": reference, "translation": hypothesis}
        for (source, reference), hypothesis in list(zip(pairs, hypotheses))[:3]
    ]
    return scores, samples


def translate(run_dir, sentences, beam_size=None):
    return load_translator(run_dir, beam_size=beam_size).translate(sentences)


def export(run_dir, export_base, version=None, beam_size=None, length_alpha=None, max_output_length=None):
    """Write the run's translator as `export_base/<version>/` for TensorFlow Serving; returns the path."""
    from keras_transformer.export import export_translator, version_path

    version_path(export_base, version)  # a taken version fails before the model is loaded
    translator = load_translator(
        run_dir, beam_size=beam_size, length_alpha=length_alpha, max_output_length=max_output_length
    )
    return export_translator(translator, export_base, version=version)


ATTENTION_KINDS = {
    "cross": ("decoder/layer_{}/cross_attention", "target_tokens", "source_tokens"),
    "decoder_self": ("decoder/layer_{}/self_attention", "target_tokens", "target_tokens"),
    "encoder": ("encoder/layer_{}/self_attention", "source_tokens", "source_tokens"),
}


def plot_attention(run_dir, sentence, path, kind="cross", layer=None, beam_size=None, heads=None):
    """Translate `sentence` and save one layer's attention heatmaps as `path` (PNG); returns the translation."""
    from keras_transformer.visualization import plot_attention as plot

    if kind not in ATTENTION_KINDS:
        raise ValueError(f"kind must be one of {sorted(ATTENTION_KINDS)}, got {kind!r}")
    translator = load_translator(run_dir, beam_size=beam_size)
    num_layers = translator.model.num_layers
    layer = num_layers - 1 if layer is None else layer
    if not 0 <= layer < num_layers:
        raise ValueError(f"layer must be between 0 and {num_layers - 1}, got {layer}")
    (result,) = translator.attention_maps([sentence])
    name, queries, keys = ATTENTION_KINDS[kind]
    figure = plot(
        result["attention"][name.format(layer)],
        result[queries],
        result[keys],
        heads=heads,
        title=f"{kind} attention, layer {layer}: {sentence} -> {result['translation']}",
    )
    figure.savefig(path)
    return result["translation"]


def translate_with_export(path, sentences, batch_size=64):
    """Translate through an exported SavedModel, as a server would."""
    import tensorflow as tf

    from keras_transformer.export import load_export

    serve = load_export(path).signatures["serving_default"]
    sentences = list(sentences)
    translations = []
    for start in range(0, len(sentences), batch_size):
        outputs = serve(text=tf.constant(sentences[start : start + batch_size], tf.string))
        translations.extend(value.decode("utf-8") for value in outputs["translation"].numpy())
    return translations


__all__ = [
    "DEFAULT_CONFIG",
    "DEMO_CONFIG",
    "evaluate",
    "export",
    "load_config",
    "load_pairs",
    "load_translator",
    "merge_config",
    "plot_attention",
    "train",
    "translate",
    "translate_with_export",
]
