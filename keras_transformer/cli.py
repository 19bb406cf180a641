"""The `keras-transformer` command: train | evaluate | translate | export | plot-attention | train-classifier.

    keras-transformer train --dataset demo --out runs/demo
    keras-transformer evaluate runs/demo --split val --beam-size 4
    keras-transformer translate runs/demo "The dog sees the cat."
    echo "The dog sees the cat." | keras-transformer translate runs/demo
    keras-transformer export runs/demo exports/translator          # -> exports/translator/1
    keras-transformer translate --saved-model exports/translator "The dog sees the cat."
    keras-transformer plot-attention runs/demo "The dog sees the cat." --out attention.png
    keras-transformer train-classifier --dataset sst2 --out runs/sst2
"""

import argparse
import json
import logging
import sys

MODEL_OVERRIDES = {
    "num_layers": int,
    "d_model": int,
    "num_heads": int,
    "d_ff": int,
    "dropout": float,
    "position": str,
}


def _add_train_arguments(parser):
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", choices=["demo", "multi30k", "files"], default="demo")
    data.add_argument("--data-dir", help="Multi30k directory (default $KERAS_TRANSFORMER_DATA/multi30k or ../shared/data/multi30k)")
    data.add_argument("--direction", default=None, help="Multi30k direction: de-en (default) or en-de")
    for split in ("train", "val"):
        data.add_argument(f"--{split}-source", help=f"dataset files: {split} source text, one sentence a line")
        data.add_argument(f"--{split}-target", help=f"dataset files: {split} target text, aligned with the source")
        data.add_argument(f"--{split}-tsv", help=f"dataset files: {split} pairs as source<TAB>target lines")
    data.add_argument("--limit-train", type=int, help="use only the first N training pairs")
    data.add_argument("--limit-val", type=int, help="use only the first N validation pairs")

    tokens = parser.add_argument_group("tokenizer")
    tokens.add_argument("--vocab-size", type=int)
    tokens.add_argument("--shared-vocab", action="store_true", default=None, help="one vocabulary for both languages")
    tokens.add_argument("--lower-case", action="store_true", default=None)

    model = parser.add_argument_group("model")
    model.add_argument("--preset", choices=["small", "base", "big"])
    for name, kind in MODEL_OVERRIDES.items():
        model.add_argument(f"--{name.replace('_', '-')}", type=kind)
    model.add_argument("--share-embeddings", action="store_true", default=None)
    model.add_argument("--tie-output", action="store_true", default=None)
    model.add_argument("--norm-first", action="store_true", default=None)

    fit = parser.add_argument_group("training")
    fit.add_argument("--epochs", type=int)
    fit.add_argument("--max-length", type=int)
    fit.add_argument("--long-pairs", choices=["drop", "truncate"])
    fit.add_argument("--tokens-per-batch", type=int)
    fit.add_argument("--batch-size", type=int)
    fit.add_argument("--warmup-steps", type=int)
    fit.add_argument("--learning-rate-scale", type=float)
    fit.add_argument("--label-smoothing", type=float)
    fit.add_argument("--steps-per-epoch", type=int)
    fit.add_argument("--early-stopping", type=int, metavar="PATIENCE")
    fit.add_argument("--strategy", choices=["auto", "mirrored", "none"])
    fit.add_argument("--cpu-replicas", type=int, help="split the CPU into N devices for MirroredStrategy")
    fit.add_argument("--precision", choices=["float32", "mixed_float16", "mixed_bfloat16"])
    fit.add_argument("--jit-compile", action="store_true", default=None)
    fit.add_argument("--seed", type=int)
    fit.add_argument("--attention-samples", type=int, help="validation pairs whose attention maps go to TensorBoard (3)")
    fit.add_argument("--bleu-samples", type=int, help="validation pairs for the per-epoch BLEU in TensorBoard (200)")
    fit.add_argument("--beam-size", type=int, help="beam size used when evaluating this run")
    _add_run_directory_arguments(parser)
    parser.add_argument("--no-evaluate", action="store_true", help="skip the validation BLEU at the end")


def _add_run_directory_arguments(parser):
    parser.add_argument(
        "--out", required=True,
        help="the run directory: a new one starts a run; rerun on a stopped run to resume it exactly, "
        "with more --epochs to train a finished one further",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="remove the run already in --out (its files only) and start over"
    )


def _finished(metrics, out):
    if not metrics.get("nothing_to_train"):
        return False
    print(
        f"\n{out} has finished its {metrics['epochs_done']} epoch(s): nothing to train. Give --epochs above "
        f"{metrics['epochs_done']} to train it further, or --overwrite to start over."
    )
    return True


def _config_from_arguments(arguments):
    from keras_transformer import runs

    config = runs.DEMO_CONFIG if arguments.dataset == "demo" else {}
    config = runs.merge_config({"data": {"dataset": arguments.dataset}}, config)

    def put(section, key, value):
        if value is not None:
            config.setdefault(section, {})[key] = value

    for key in ("data_dir", "direction", "limit_train", "limit_val"):
        put("data", key, getattr(arguments, key))
    for split in ("train", "val"):
        for kind in ("source", "target", "tsv"):
            put("data", f"{split}_{kind}", getattr(arguments, f"{split}_{kind}"))
    put("tokenizer", "vocab_size", arguments.vocab_size)
    put("tokenizer", "shared", arguments.shared_vocab)
    put("tokenizer", "lower_case", arguments.lower_case)
    put("model", "preset", arguments.preset)
    for key in list(MODEL_OVERRIDES) + ["share_embeddings", "tie_output", "norm_first"]:
        put("model", key, getattr(arguments, key))
    for key in (
        "epochs", "max_length", "long_pairs", "tokens_per_batch", "batch_size", "warmup_steps",
        "learning_rate_scale", "label_smoothing", "steps_per_epoch", "early_stopping", "strategy",
        "cpu_replicas", "precision", "jit_compile", "seed", "attention_samples", "bleu_samples",
    ):
        put("training", key, getattr(arguments, key))
    put("evaluation", "beam_size", arguments.beam_size)
    return config


def _train(arguments):
    # Splitting the CPU must come before TensorFlow makes its first tensor.
    if arguments.cpu_replicas:
        from keras_transformer.training import split_cpu

        split_cpu(arguments.cpu_replicas)
    from keras_transformer import runs

    training = runs.train(_config_from_arguments(arguments), arguments.out, overwrite=arguments.overwrite)
    if _finished(training, arguments.out):
        return
    print(
        f"\ntrained {training['epochs_this_session']} epoch(s) in {training['seconds_this_session']:.0f}s "
        f"({training['seconds_per_epoch']:.0f}s/epoch, {training['parameters']:,} parameters)"
    )
    if not arguments.no_evaluate:
        _report(*runs.evaluate(arguments.out, "val"))
    print(f"\nrun directory: {arguments.out}")
    print(f"TensorBoard:   tensorboard --logdir {arguments.out}/logs")


def _report(scores, samples):
    print(
        f"\nvalidation BLEU {scores['bleu']:.1f} (lowercased {scores['bleu_lowercase']:.1f}), "
        f"chrF {scores['chrf']:.1f} on {scores['sentences']} sentences, beam size {scores['beam_size']}"
    )
    for sample in samples:
        print(f"\n  source:      {sample['source']}\n  reference:   {sample['reference']}\n  translation: {sample['translation']}")


def _evaluate(arguments):
    from keras_transformer import runs

    scores, samples = runs.evaluate(arguments.run_dir, arguments.split, arguments.beam_size, arguments.batch_size)
    _report(scores, samples)
    print(f"\nhypotheses: {scores['hypotheses']}")
    print(json.dumps({key: scores[key] for key in ("bleu", "bleu_lowercase", "chrf")}))


def _translate(arguments):
    from keras_transformer import runs

    sentences = arguments.sentences
    if arguments.saved_model:
        # No run directory with an export: the first positional is a sentence.
        if arguments.beam_size:
            raise ValueError("--beam-size cannot change an export: its beam size was fixed by `export`")
        sentences = ([arguments.run_dir] if arguments.run_dir else []) + sentences
    elif not arguments.run_dir:
        raise ValueError("translate needs a run directory or --saved-model EXPORT")
    sentences = sentences or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if arguments.saved_model:
        translations = runs.translate_with_export(arguments.saved_model, sentences)
    else:
        translations = runs.translate(arguments.run_dir, sentences, arguments.beam_size)
    for translation in translations:
        print(translation)


def _export(arguments):
    from keras_transformer import runs

    path = runs.export(
        arguments.run_dir,
        arguments.export_base,
        version=arguments.version,
        beam_size=arguments.beam_size,
        length_alpha=arguments.length_penalty,
        max_output_length=arguments.max_output_length,
    )
    print(f"exported SavedModel: {path}")
    print("signatures: serving_default, translate_with_attention, score_tokens")
    print(f"try it:     keras-transformer translate --saved-model {path} \"...\"")


def _plot_attention(arguments):
    from keras_transformer import runs

    translation = runs.plot_attention(
        arguments.run_dir, arguments.sentence, arguments.out, kind=arguments.kind, layer=arguments.layer,
        beam_size=arguments.beam_size, heads=arguments.heads,
    )
    print(translation)
    print(f"attention map: {arguments.out}")


def _train_classifier(arguments):
    if arguments.cpu_replicas:
        from keras_transformer.training import split_cpu

        split_cpu(arguments.cpu_replicas)
    from keras_transformer import classifier_runs

    dataset, _, path = arguments.dataset.partition(":")
    if dataset not in ("sst2", "imdb", "csv") or (dataset == "csv") != bool(path):
        raise ValueError(f"--dataset must be sst2, imdb or csv:PATH, got {arguments.dataset!r}")
    config = {"data": {"dataset": dataset, "csv": path or None}}

    def put(section, key, value):
        if value is not None:
            config.setdefault(section, {})[key] = value

    for key in ("data_dir", "val_csv", "limit_train", "limit_val"):
        put("data", key, getattr(arguments, key))
    put("tokenizer", "vocab_size", arguments.vocab_size)
    for key in ("num_layers", "d_model", "num_heads", "d_ff", "dropout", "pooling"):
        put("model", key, getattr(arguments, key))
    for key in ("epochs", "max_length", "batch_size", "warmup_steps", "steps_per_epoch", "early_stopping",
                "strategy", "cpu_replicas", "precision", "projector_samples"):
        put("training", key, getattr(arguments, key))
    metrics = classifier_runs.train_classifier(config, arguments.out, overwrite=arguments.overwrite)
    if _finished(metrics["training"], arguments.out):
        return
    print(
        f"\nvalidation accuracy {metrics['val']['accuracy']:.4f} on {metrics['val']['examples']} examples; "
        f"{metrics['training']['seconds_per_epoch']:.0f}s/epoch"
    )
    print(f"run directory: {arguments.out}")
    print(f"TensorBoard:   tensorboard --logdir {arguments.out}/logs   (Projector: the [CLS] embeddings)")


def build_parser():
    parser = argparse.ArgumentParser(prog="keras-transformer", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train a translation model into a run directory")
    _add_train_arguments(train)
    train.set_defaults(handler=_train)

    evaluate = commands.add_parser("evaluate", help="BLEU and chrF of a run on a split")
    evaluate.add_argument("run_dir")
    evaluate.add_argument("--split", choices=["val", "test"], default="val")
    evaluate.add_argument("--beam-size", type=int)
    evaluate.add_argument("--batch-size", type=int)
    evaluate.set_defaults(handler=_evaluate)

    translate = commands.add_parser("translate", help="translate sentences (arguments or stdin, one a line)")
    translate.add_argument("run_dir", nargs="?", help="the run directory (omit with --saved-model)")
    translate.add_argument("sentences", nargs="*")
    translate.add_argument("--beam-size", type=int)
    translate.add_argument(
        "--saved-model", metavar="EXPORT", help="translate with an export (a version directory or its base)"
    )
    translate.set_defaults(handler=_translate)

    export = commands.add_parser("export", help="export a run as a SavedModel for TensorFlow Serving")
    export.add_argument("run_dir")
    export.add_argument("export_base", help="the directory TensorFlow Serving watches; writes EXPORT_BASE/N/")
    export.add_argument("--version", type=int, help="N (default: one more than the highest there)")
    export.add_argument("--beam-size", type=int, help="default: the run's evaluation setting")
    export.add_argument("--length-penalty", type=float, metavar="ALPHA", help="default: the run's (0.6)")
    export.add_argument(
        "--max-output-length", type=int, metavar="L", help="cap on output tokens (default: the model's max_length)"
    )
    export.set_defaults(handler=_export)

    plot = commands.add_parser("plot-attention", help="translate a sentence and save its attention heatmaps (PNG)")
    plot.add_argument("run_dir")
    plot.add_argument("sentence")
    plot.add_argument("--out", required=True, help="the PNG to write")
    plot.add_argument("--kind", choices=["cross", "decoder_self", "encoder"], default="cross")
    plot.add_argument("--layer", type=int, help="default: the last")
    plot.add_argument("--heads", type=int, nargs="+", help="default: all")
    plot.add_argument("--beam-size", type=int, help="default: the run's evaluation setting")
    plot.set_defaults(handler=_plot_attention)

    classify = commands.add_parser("train-classifier", help="train an encoder-only sentiment classifier")
    classify.add_argument("--dataset", default="sst2", help="sst2, imdb or csv:PATH (columns text,label)")
    classify.add_argument("--data-dir", help="default $KERAS_TRANSFORMER_DATA/<name> or ../shared/data/<name>")
    classify.add_argument("--val-csv", help="csv: validation file (default: 10%% held back)")
    classify.add_argument("--limit-train", type=int)
    classify.add_argument("--limit-val", type=int)
    classify.add_argument("--vocab-size", type=int)
    for name, kind in {**MODEL_OVERRIDES, "pooling": str}.items():
        if name != "position":
            classify.add_argument(f"--{name.replace('_', '-')}", type=kind)
    for name, kind in {"epochs": int, "max_length": int, "batch_size": int, "warmup_steps": int,
                       "steps_per_epoch": int, "early_stopping": int, "cpu_replicas": int,
                       "projector_samples": int}.items():
        classify.add_argument(f"--{name.replace('_', '-')}", type=kind)
    classify.add_argument("--strategy", choices=["auto", "mirrored", "none"])
    classify.add_argument("--precision", choices=["float32", "mixed_float16", "mixed_bfloat16"])
    _add_run_directory_arguments(classify)
    classify.set_defaults(handler=_train_classifier)
    return parser


def main(argv=None):
    arguments = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        arguments.handler(arguments)
    except (ValueError, FileNotFoundError, FileExistsError) as error:
        print(f"keras-transformer: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
