"""Translation runs: what `keras-transformer train|evaluate|translate|export|plot-attention` do.

    pairs streamed from disk (data) -> WordPiece vocabularies from a sample (text)
      -> tokenized once into shards in the run directory -> length-bucketed batches (data)
      -> Transformer (models) -> model.fit (training) -> model.keras in the run directory
      -> Translator: cached greedy or beam search (inference) -> BLEU (evaluation)
      -> SavedModel for TensorFlow Serving (export)

This module wires those floors together for one task; what a run keeps on
disk, and how a rerun resumes or continues, is `run_dir`'s; the settings and
their defaults are `options`'.
"""

import dataclasses
import logging
import functools
import os
import shutil
import time

from keras_transformer import data, evaluation, inference, models
from keras_transformer.runs import fitting
from keras_transformer.runs import run_dir as runs
from keras_transformer.runs.options import DEFAULTS, TRANSLATION, merge_config
from keras_transformer.runs.translation_data import (  # noqa: F401 (corpus_splits, load_pairs: the task's API too)
    PRETRAINED_TOKENIZERS,
    corpus_splits,
    load_pairs,
    token_shards,
    tokenizers,
    training_batches,
)
from keras_transformer.text.sentencepiece import check_sentencepiece_settings

logger = logging.getLogger("keras_transformer")

# -- a pretrained checkpoint as a run, and runs started from another ---------------------

# What a run started with --init-from takes from the run it starts from.
_INHERITED_SECTIONS = ("tokenizer", "model")


def import_checkpoint(checkpoint_dir, run_dir, source_lang=None, target_lang=None):
    """Write a Hugging Face checkpoint directory as the translation run `run_dir`; returns its config.

    The run is like a trained one with its epochs done: `translate`,
    `evaluate`, `export`, `plot-attention` and `train --init-from` work on it.
    `run_dir` must not exist; the run is written beside it and renamed into
    place, so a failed import leaves nothing behind.
    """
    from keras_transformer import pretrained
    from keras_transformer.pretrained import publish
    from keras_transformer.saving import directory_written_whole, release_freed_memory, save_model, write_json

    if os.path.exists(run_dir):
        raise FileExistsError(f"{run_dir} already exists: pick a new run directory")
    started = time.time()
    model, source_tokenizer, target_tokenizer, decoding = pretrained.load(checkpoint_dir, source_lang, target_lang)
    # What reading freed goes back to the system before saving makes copies of its own.
    release_freed_memory()
    model_config = {key: value for key, value in model.get_config().items()
                    if key in models.Transformer.hyperparameters and key not in ("src_vocab_size", "tgt_vocab_size",
                                                                                "max_length")}
    config = merge_config(DEFAULTS[TRANSLATION], {
        "tokenizer": {"kind": PRETRAINED_TOKENIZERS, "shared": False},
        "model": {"preset": None, **model_config},
        "training": {"epochs": 0, "max_length": model.max_length, "precision": "float32"},
        "evaluation": decoding.to_config(),
        "pretrained": {"checkpoint": os.path.abspath(checkpoint_dir), "source_lang": source_lang,
                       "target_lang": target_lang},
    })
    with directory_written_whole(run_dir) as staging:
        source_tokenizer.save(runs.vocab_path(staging, "source"))
        target_tokenizer.save(runs.vocab_path(staging, "target"))
        publish.keep_checkpoint_files(checkpoint_dir, runs.path(staging, runs.PRETRAINED))
        save_model(model, runs.path(staging, runs.MODEL))
        config["training"]["precision_chosen"], config["training"]["precision_reason"] = "float32", "imported"
        write_json(runs.path(staging, runs.CONFIG), config)
        runs.update_metrics(staging, {"imported": {
            "checkpoint": os.path.abspath(checkpoint_dir), "parameters": model.count_params(),
            "seconds": round(time.time() - started, 1)}})
    logger.info("imported %s into %s (%d parameters, %.0fs)", checkpoint_dir, run_dir, model.count_params(),
                time.time() - started)
    return config


def _with_init_run(config):
    """`config` with what its `training.init_from` run decides: tokenizers, model and sizes, decoding."""
    init_from = config.get("training", {}).get("init_from")
    if not init_from:
        return config
    if runs.task_of(init_from) != TRANSLATION:
        raise ValueError(f"--init-from {init_from}: a translation run needs a translation run (or an import-hf one)")
    init_config = load_config(init_from)
    inherited = {section: init_config[section] for section in _INHERITED_SECTIONS}
    inherited["training"] = {"max_length": init_config["training"]["max_length"]}
    given_evaluation = config.get("evaluation", {})
    inherited["evaluation"] = merge_config(init_config["evaluation"], given_evaluation)
    return merge_config(config, inherited)


def _copy_init_tokenizers(run_dir, init_from):
    """The init run's tokenizers (and checkpoint files, if imported), copied into `run_dir` once (its own from then on)."""
    for name in ("source", "target"):
        if not runs.has_tokenizer(run_dir, name):
            shutil.copytree(runs.vocab_path(init_from, name), runs.vocab_path(run_dir, name), dirs_exist_ok=True)
    init_files = runs.path(init_from, runs.PRETRAINED)
    if os.path.isdir(init_files) and not os.path.exists(runs.path(run_dir, runs.PRETRAINED)):
        shutil.copytree(init_files, runs.path(run_dir, runs.PRETRAINED))


def _load_init_weights(model, init_from, source_tokenizer, target_tokenizer):
    """The init run's trained weights into `model` (before its first step; a resumed run has its own)."""
    init_config = load_config(init_from)
    init_model = runs.load_trained_model(
        init_from, lambda: build_model(init_config, source_tokenizer.vocab_size, target_tokenizer.vocab_size)
    )
    model.set_weights(init_model.get_weights())
    logger.info("weights initialised from %s", init_from)


# -- model ---------------------------------------------------------------------------


def build_model(config, source_vocab_size, target_vocab_size):
    """The run's Transformer, built (weights made), not trained."""
    model_config = config["model"]
    arguments = {key: value for key, value in model_config.items() if key != "preset"}
    arguments.update(
        src_vocab_size=source_vocab_size, tgt_vocab_size=target_vocab_size, max_length=config["training"]["max_length"]
    )
    if model_config.get("preset"):
        model = models.Transformer.from_preset(model_config["preset"], **arguments)
    else:
        model = models.Transformer(**arguments)
    model.build(((None, None), (None, None)))
    return model


def compile_model(model, training_config):
    runs.compile_token_prediction(model, model.d_model, training_config, training_config["label_smoothing"])


# -- the commands ------------------------------------------------------------------


def train(config, run_dir, verbose=1, overwrite=False):
    """Train, resume or continue a translation run in `run_dir`; returns the training metrics.

    Rerunning with the same `run_dir` after an interruption resumes at the
    epoch after the last one completed, exactly as if it had not stopped;
    see `run_dir.start` for what a rerun does with a finished run or new settings.
    """
    _check_tokenizer_settings(merge_config(DEFAULTS[TRANSLATION], config)["tokenizer"])
    # On a cluster, only the chief writes `run_dir` (see `run_dir.written_by_this_process`).
    with runs.written_by_this_process(run_dir) as writable_run_dir:
        return _train(config, writable_run_dir, verbose, overwrite, chief_run_dir=run_dir)


def _check_tokenizer_settings(tokenizer_config):
    """A one-line ValueError for SentencePiece settings that cannot be used, before the run directory is touched."""
    if tokenizer_config["kind"] == "sentencepiece":
        check_sentencepiece_settings(tokenizer_config["sentencepiece_model"], tokenizer_config["character_coverage"])
        return
    defaults = DEFAULTS[TRANSLATION]["tokenizer"]
    given = [key for key in ("sentencepiece_model", "character_coverage") if tokenizer_config[key] != defaults[key]]
    if given and tokenizer_config["kind"] == "wordpiece":
        flags = " and ".join("--" + key.replace("_", "-") for key in given)
        raise ValueError(f"{flags}: for --tokenizer sentencepiece (this run learns WordPiece)")


def _train(config, run_dir, verbose, overwrite, chief_run_dir):
    config, strategy, state = runs.start(run_dir, _with_init_run(config), DEFAULTS[TRANSLATION], overwrite=overwrite)
    settings = config["training"]
    if state.finished:
        return runs.nothing_to_train(run_dir, state)["training"]

    replicas = strategy.num_replicas_in_sync
    if settings["init_from"]:
        _copy_init_tokenizers(run_dir, settings["init_from"])
    splits = corpus_splits(config["data"], ("train", "val"))
    source_tokenizer, target_tokenizer = tokenizers(run_dir, config["tokenizer"], splits["train"], settings["seed"])
    shards = {
        name: token_shards(run_dir, name, split, source_tokenizer, target_tokenizer, chief_run_dir)
        for name, split in splits.items()
    }
    train_dataset, train_batches, val_batches = training_batches(
        strategy, shards, source_tokenizer, target_tokenizer, settings
    )

    with strategy.scope():
        model = build_model(config, source_tokenizer.vocab_size, target_tokenizer.vocab_size)
        if settings["init_from"] and not state.trained:
            _load_init_weights(model, settings["init_from"], source_tokenizer, target_tokenizer)
        imported = config["tokenizer"]["kind"] == PRETRAINED_TOKENIZERS
        files_dir = _checkpoint_files(run_dir, required=False) if imported else None
        if files_dir:
            from keras_transformer.pretrained import publish

            # What the checkpoint's family has no tensor for stays as imported, so the run can go back to it.
            publish.freeze_what_the_family_lacks(model, files_dir)
        compile_model(model, settings)
    logger.info("model: %d parameters, %d replica(s)", model.count_params(), replicas)
    if state.epochs_done:
        logger.info("%s: %d epoch(s) done, training on to %d", run_dir, state.epochs_done, settings["epochs"])

    callbacks = fitting.training_callbacks(
        run_dir, settings, state, epoch_variables=[train_batches.epoch],
        averaged_weights=settings["ema_momentum"] is not None,
    )
    samples_needed = max(settings["attention_samples"], settings["bleu_samples"])
    val_samples = splits["val"].good_pairs_list(limit=samples_needed) if samples_needed else []
    callbacks += _sample_callbacks(run_dir, settings, val_samples, source_tokenizer, target_tokenizer)
    metrics = fitting.fit(
        model, run_dir, state, train_dataset,
        dict(validation_data=val_batches.dataset, epochs=settings["epochs"],
             steps_per_epoch=settings["steps_per_epoch"], verbose=verbose),
        callbacks,
    )
    metrics.update(
        train_pairs=train_batches.num_pairs,
        train_pairs_dropped=train_batches.num_dropped,
        train_pairs_truncated=train_batches.num_truncated,
        train_lines_skipped=shards["train"].skipped,
        replicas=replicas,
    )
    runs.update_metrics(run_dir, {"training": metrics})
    return metrics


def _sample_callbacks(run_dir, settings, val_pairs, source_tokenizer, target_tokenizer):
    from keras_transformer.tensorboard_loggers import AttentionMapLogger, attention_samples

    samples = attention_samples(val_pairs, settings["attention_samples"])
    if not samples:
        return []
    return [
        AttentionMapLogger(
            samples,
            runs.log_path(run_dir, "samples"),
            source_tokenizer,
            target_tokenizer,
            bleu_pairs=val_pairs[: settings["bleu_samples"]],
        )
    ]


def load_config(run_dir):
    return runs.load_config(run_dir, DEFAULTS[TRANSLATION])


def decoding_settings(config, beam_size=None, length_alpha=None, max_extra_length=None, max_output_length=None):
    """The run's `inference.DecodingSettings` (its config's `evaluation`), with the options given on top.

    An imported run's are its checkpoint's, written there at import.
    """
    settings = inference.DecodingSettings.from_config(config["evaluation"])
    penalty = None if length_alpha is None else dataclasses.replace(settings.length_penalty, alpha=length_alpha)
    return settings.replace(beam_size=beam_size or None, length_penalty=penalty, max_extra_length=max_extra_length,
                            max_output_length=max_output_length or None)


def load_translator(run_dir, precision=runs.INFERENCE_PRECISION, **options):
    """The run's model and tokenizers as a `Translator`: its decoding settings with `options` on top
    (`beam_size`, `length_alpha`, `max_extra_length`, `max_output_length`: see `decoding_settings`).

    The model computes in `precision`: float32 unless asked otherwise, whatever
    the run trained in (`run_dir.load_trained_model`), as every road that
    starts here does (translate, evaluate, the exports).
    """
    config = load_config(run_dir)
    source_tokenizer, target_tokenizer = tokenizers(run_dir, config["tokenizer"])
    model = runs.load_trained_model(
        run_dir, lambda: build_model(config, source_tokenizer.vocab_size, target_tokenizer.vocab_size),
        precision=precision,
    )
    return inference.Translator(model, source_tokenizer, target_tokenizer, decoding_settings(config, **options))


def evaluate(run_dir, split="val", beam_size=None, batch_size=None, length_alpha=None, tsv=None,
             precision=runs.INFERENCE_PRECISION):
    """Translate a split (or the pairs of a `tsv` file), write `hypotheses.<split>.txt`, return and record BLEU/chrF."""
    config = load_config(run_dir)
    if tsv:
        split = "tsv-" + os.path.basename(tsv)
        pairs = data.Split(data.ParallelText.from_files(tsv=tsv)).good_pairs_list()
    elif config.get("pretrained"):
        raise ValueError(f"{run_dir} is an imported checkpoint, with no corpus of its own: give --tsv FILE")
    else:
        pairs = load_pairs(config["data"], (split,))[split]
    translator = load_translator(run_dir, beam_size=beam_size, length_alpha=length_alpha, precision=precision)
    started = time.time()
    hypotheses = translator.translate([source for source, _ in pairs], batch_size=batch_size or config["evaluation"]["batch_size"])
    seconds = time.time() - started
    path = runs.hypotheses_path(run_dir, split)
    with open(path, "w", encoding="utf-8") as file:
        file.write("\n".join(hypotheses) + "\n")
    scores = evaluation.translation_scores(hypotheses, [target for _, target in pairs])
    scores.update(beam_size=translator.settings.beam_size, length_alpha=translator.settings.length_penalty.alpha,
                  seconds=round(seconds, 1), hypotheses=path)
    runs.update_metrics(run_dir, {split: scores})
    samples = [
        {"source": source, "reference": reference, "translation": hypothesis}
        for (source, reference), hypothesis in list(zip(pairs, hypotheses))[:3]
    ]
    return scores, samples


def translate(run_dir, sentences, beam_size=None, precision=runs.INFERENCE_PRECISION):
    return load_translator(run_dir, beam_size=beam_size, precision=precision).translate(sentences)


def export(run_dir, export_base, version=None, beam_size=None, length_alpha=None, max_output_length=None):
    """Write the run's translator as `export_base/<version>/` for TensorFlow Serving; returns the path."""
    from keras_transformer.export import export_translator, version_path

    version_path(export_base, version)  # a taken version fails before the model is loaded
    translator = load_translator(
        run_dir, beam_size=beam_size, length_alpha=length_alpha, max_output_length=max_output_length
    )
    return export_translator(translator, export_base, version=version)


def describe_saved_model(path):
    """What `export` tells the user of the export at `path`: its signatures (an M2M100's has translate_between)."""
    from keras_transformer.export.translator import signature_names

    return [f"signatures: {', '.join(signature_names(path))}"]


def export_ctranslate2(run_dir, out_dir, quantization=None, beam_size=None, length_alpha=None,
                       max_output_length=None):
    """Write the run's translator as a CTranslate2 model directory (`export.ctranslate2`); returns its path."""
    from keras_transformer.export.ctranslate2 import QUANTIZATIONS, require_ctranslate2
    from keras_transformer.export.ctranslate2 import export_ctranslate2 as export_to

    # What can be refused is refused before the model is loaded.
    require_ctranslate2()
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS} (or none), got {quantization!r}")
    if os.path.exists(out_dir):
        raise FileExistsError(f"{out_dir} already exists: pick another directory or remove it first")
    translator = load_translator(
        run_dir, beam_size=beam_size, length_alpha=length_alpha, max_output_length=max_output_length
    )
    return export_to(translator, out_dir, quantization=quantization)


def export_litert(run_dir, out_dir, quantization=None, ops="text", beam_size=None, length_alpha=None,
                  max_output_length=None, web=False):
    """Write the run's translator as a LiteRT file in the new directory `out_dir` (`export.litert`); returns it.

    `web`: a page around a builtin file, which answers offline in a browser (`export.web`).
    """
    from keras_transformer.export import litert, web as pages

    litert.check_request(out_dir, quantization, ops)  # before the model is loaded
    translator = load_translator(
        run_dir, beam_size=beam_size, length_alpha=length_alpha, max_output_length=max_output_length
    )
    config = load_config(run_dir)  # an imported checkpoint has no data of its own: probe sentences alone
    pairs = [] if config.get("pretrained") else runs.held_out_texts(lambda: load_pairs(config["data"], ("val",))["val"])
    held_out = {"source": [source for source, _ in pairs], "target": [target for _, target in pairs]}
    if web:
        return pages.export_web(litert.LiteRTTranslation(translator, ops, fixed_rows=1), out_dir, quantization, held_out)
    return litert.export_litert(litert.LiteRTTranslation(translator, ops), out_dir, quantization, held_out)


export_web = functools.partial(export_litert, ops="builtin", web=True)  # `export --format web`


def export_hf(run_dir, out_dir, dtype=None):
    """Write the run as a Hugging Face checkpoint directory `out_dir` (`pretrained.publish`); returns its path.

    An imported run (or one fine-tuned from it) goes back to its family with
    the checkpoint's own files; a run trained here goes out in the family
    `pretrained.publish` writes it as.
    """
    from keras_transformer.pretrained import publish
    from keras_transformer.saving import directory_written_whole

    publish.check_dtype(dtype)
    if os.path.exists(out_dir):
        raise FileExistsError(f"{out_dir} already exists: pick another directory or remove it first")
    config = load_config(run_dir)
    source_tokenizer, target_tokenizer = tokenizers(run_dir, config["tokenizer"])
    imported = config["tokenizer"]["kind"] == PRETRAINED_TOKENIZERS
    files_dir = _checkpoint_files(run_dir) if imported else None
    model = runs.load_trained_model(
        run_dir, lambda: build_model(config, source_tokenizer.vocab_size, target_tokenizer.vocab_size)
    )
    publish.check_run(model, source_tokenizer, target_tokenizer, files_dir)
    # A Multi30k run knows its languages (tokenizer_config.json's); other corpora are not named.
    data = config["data"]
    languages = tuple(data["direction"].split("-")) if data["dataset"] == "multi30k" else (None, None)
    with directory_written_whole(out_dir) as staging:
        publish.write_run(model, (source_tokenizer, target_tokenizer), staging, files_dir, config["evaluation"],
                          languages, dtype)
        for name in os.listdir(staging):  # readable by all, as a published checkpoint (a JSON write is private)
            os.chmod(os.path.join(staging, name), 0o644)
    logger.info("exported %s as a Hugging Face checkpoint: %s", run_dir, out_dir)
    return out_dir


def _checkpoint_files(run_dir, required=True):
    """The folder of an imported run's checkpoint files: its own, or (runs made before runs kept them) the checkpoint's.

    None for none, where not `required`.
    """
    looked_at = []
    while run_dir:
        if os.path.isdir(runs.path(run_dir, runs.PRETRAINED)):
            return runs.path(run_dir, runs.PRETRAINED)
        config = load_config(run_dir)
        checkpoint = (config.get("pretrained") or {}).get("checkpoint")
        if checkpoint and os.path.isdir(checkpoint):
            return checkpoint
        looked_at.append(checkpoint or run_dir)
        run_dir = config["training"].get("init_from")
    if not required:
        return None
    raise FileNotFoundError(f"the run keeps no files of the checkpoint it was imported from, and "
                            f"{looked_at[-1]} is gone: import the checkpoint again")


def translate_with_ctranslate2(model_dir, sentences, beam_size=None):
    """Translate with a CTranslate2 export (`export --format ctranslate2`)."""
    from keras_transformer.export.ctranslate2 import CTranslate2Translator

    return CTranslate2Translator(model_dir).translate(sentences, beam_size=beam_size)


def plot_attention(run_dir, sentence, png=None, html=None, kind="cross", layer=None, beam_size=None, heads=None):
    """Translate `sentence`; save one layer's heatmaps as `png` and/or every map in the explorer page `html`.

    Returns the translation. The HTML file is self-contained (the attention
    explorer of TensorBoard's Attention tab, with this sentence's weights).
    """
    kinds = models.attention_maps.KINDS
    if kind not in kinds:
        raise ValueError(f"kind must be one of {', '.join(kinds)}, got {kind!r}")
    translator = load_translator(run_dir, beam_size=beam_size)
    num_layers = translator.model.num_layers
    layer = num_layers - 1 if layer is None else layer
    if not 0 <= layer < num_layers:
        raise ValueError(f"layer must be between 0 and {num_layers - 1}, got {layer}")
    (result,) = translator.attention_maps([sentence])
    if png:
        from keras_transformer.visualization import plot_attention as plot

        query_tokens, key_tokens = models.queries_and_keys(kind, result["source_tokens"], result["target_tokens"])
        figure = plot(
            result["attention"][models.attention_map_name(kind, layer)],
            query_tokens,
            key_tokens,
            heads=heads,
            title=f"{kind} attention, layer {layer}: {sentence} -> {result['translation']}",
        )
        figure.savefig(png)
    if html:
        sides = models.attention_maps
        tokens = {sides.SOURCE: result["source_tokens"], sides.TARGET: result["target_tokens"]}
        _write_explorer(html, sentence, result["translation"], tokens, sides.maps_with_sides(result["attention"]))
    return result["translation"]


def plot_attention_with_export(path, sentence, html):
    """The explorer page of an export's `translate_with_attention` outputs (cross-attention) for `sentence`."""
    import tensorflow as tf

    from keras_transformer.export import load_export

    signatures = load_export(path).signatures
    if "translate_with_attention" not in signatures:
        raise ValueError(f"{path} has no translate_with_attention signature: is it a translator's export?")
    outputs = signatures["translate_with_attention"](text=tf.constant([sentence]))

    def tokens_of(name):  # padded with "" in the batch
        return [token.decode("utf-8") for token in outputs[name].numpy()[0] if token]

    sides = models.attention_maps
    tokens = {sides.SOURCE: tokens_of("source_tokens"), sides.TARGET: tokens_of("target_tokens")}
    attention = outputs["cross_attention"].numpy()[0]  # (layers, heads, target, source)
    rows, columns = len(tokens[sides.TARGET]), len(tokens[sides.SOURCE])
    maps = [
        (sides.CROSS, layer, *sides.TOKEN_SIDES[sides.CROSS], weights[:, :rows, :columns])
        for layer, weights in enumerate(attention)
    ]
    translation = outputs["translation"].numpy()[0].decode("utf-8")
    _write_explorer(html, sentence, translation, tokens, maps)
    return translation


def _write_explorer(path, sentence, translation, tokens, maps):
    from keras_transformer.visualization import write_explorer

    write_explorer(path, {"source": sentence, "translation": translation}, tokens, maps, title=f"Attention: {sentence}")


def translate_with_export(path, sentences, batch_size=64):
    """Translate through an exported SavedModel, as a server would (`lines.Answers`: one per sentence)."""
    import tensorflow as tf

    from keras_transformer.export import load_export, resolve_export
    from keras_transformer.export.translator import export_settings
    from keras_transformer.lines import Answers, answer_each

    serve = load_export(path).signatures["serving_default"]
    settings = export_settings(resolve_export(path))

    def translate_in_batches(sentences):
        translations, truncated = [], {}
        for start in range(0, len(sentences), batch_size):
            outputs = serve(text=tf.constant(sentences[start : start + batch_size], tf.string))
            translations.extend(value.decode("utf-8") for value in outputs["translation"].numpy())
            if "truncated" in outputs:  # an export made before it was an output says nothing
                for row in outputs["truncated"].numpy().nonzero()[0]:
                    truncated[start + int(row)] = settings.get("max_source_pieces")
        return Answers(translations, truncated)

    return answer_each(sentences, translate_in_batches, "")


__all__ = ["build_model", "evaluate", "export", "export_web", "import_checkpoint", "load_config", "corpus_splits",
           "load_pairs", "load_translator", "plot_attention", "plot_attention_with_export", "token_shards", "tokenizers",
           "train", "translate", "translate_with_export"]
