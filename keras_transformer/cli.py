"""The `keras-transformer` command: train and use translators and text classifiers.

    keras-transformer train --dataset demo --out runs/demo
    keras-transformer evaluate runs/demo --split val --beam-size 4
    keras-transformer translate runs/demo "The dog sees the cat."
    echo "The dog sees the cat." | keras-transformer translate runs/demo
    keras-transformer export runs/demo exports/translator          # -> exports/translator/1
    keras-transformer translate --saved-model exports/translator "The dog sees the cat."
    keras-transformer plot-attention runs/demo "The dog sees the cat." --out attention.png
    keras-transformer train-classifier --dataset sst2 --out runs/sst2
    keras-transformer classify runs/sst2 "a gripping, funny film"
    keras-transformer evaluate runs/sst2 --csv reviews.csv
    keras-transformer export runs/sst2 exports/sentiment
    keras-transformer pretrain --dataset sst2 --out runs/sst2-mlm          # masked language modelling
    keras-transformer train-classifier --dataset sst2 --init-from runs/sst2-mlm --out runs/sst2-pretrained
    keras-transformer import-hf opus-mt-en-de/ runs/opus-mt-en-de      # a pretrained Hugging Face checkpoint

This module parses and prints; `keras_transformer.runs` does the work. The
parser is built from the options table (`runs/options.py`) without
importing TensorFlow, so `--help` answers at once; TensorFlow starts, quietly,
once a command runs.
"""

import argparse
import functools
import json
import logging
import os
import re
import sys

from keras_transformer import startup
from keras_transformer.lines import read_lines, valid_text
from keras_transformer.runs import options

# -- the parser, from the options table ------------------------------------------------


def _add_config_options(parser, task):
    """One argparse flag per row of the options table that `task` takes, grouped by config section."""
    groups = {}
    for option in options.options_for(task):
        if option.section not in groups:
            groups[option.section] = parser.add_argument_group(option.section)
        keywords = dict(dest=option.dest, help=_help(option, task), default=None)
        if option.type is bool:
            keywords["action"] = "store_true"
        else:
            metavar = option.metavar or (None if option.choices else option.key.upper())
            keywords.update(type=option.type, choices=option.choices, metavar=metavar)
        groups[option.section].add_argument(option.flag_name, **keywords)


def _help(option, task):
    default = options.default_of(option, task)
    demo = options.default_of(option, task, demo=True) if task == options.TRANSLATION else default
    shown = "" if default is None else f"default {default}"
    if demo != default:
        shown = f"{shown}; demo {demo}" if shown else f"demo {demo}"
    # argparse formats help with %: a literal percent sign is written %%.
    return f"{option.help} ({shown})" if shown else option.help


def _add_run_directory_arguments(parser):
    parser.add_argument(
        "--out", required=True,
        help="the run directory: a new one starts a run; rerun on a stopped run to resume it exactly, "
        "with more --epochs to train a finished one further",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="remove the run already in --out (its files only) and start over"
    )


class _CommandParser(argparse.ArgumentParser):
    """A command's parser that takes its options anywhere among its positionals, as users type them.

    Plain argparse fills every positional from the first run of them:
    `translate runs/demo --beam-size 1 "A dog."` would leave "A dog." unrecognised.
    Intermixed parsing reads the options first, then the positionals in order.
    """

    _intermixing = False

    def parse_known_args(self, args=None, namespace=None):
        # parse_known_intermixed_args calls parse_known_args itself: only the outer call intermixes.
        if self._intermixing:
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def build_parser():
    parser = argparse.ArgumentParser(prog="keras-transformer", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_CommandParser)
    for add_command in COMMANDS:
        add_command(commands)
    return parser


def _add_training_command(commands, name, task, handler, summary):
    """A command that trains a run of `task`: its config options and the run directory's arguments."""
    command = commands.add_parser(name, help=summary)
    _add_config_options(command, task)
    _add_run_directory_arguments(command)
    command.set_defaults(handler=handler)
    return command


def _add_train_command(commands):
    train = _add_training_command(commands, "train", options.TRANSLATION, _train,
                                  "train a translation model into a run directory")
    train.add_argument("--no-evaluate", action="store_true", help="skip the validation BLEU at the end")


def _add_train_classifier_command(commands):
    _add_training_command(commands, "train-classifier", options.CLASSIFICATION,
                          functools.partial(_train_and_report, task=options.CLASSIFICATION),
                          "train an encoder-only text classifier")


def _add_pretrain_command(commands):
    _add_training_command(commands, "pretrain", options.PRETRAINING,
                          functools.partial(_train_and_report, task=options.PRETRAINING),
                          "pre-train a classifier's encoder on unlabelled text (masked language modelling)")


def _add_train_lm_command(commands):
    _add_training_command(commands, "train-lm", options.LANGUAGE_MODEL,
                          functools.partial(_train_and_report, task=options.LANGUAGE_MODEL),
                          "train a GPT-style language model (the decoder alone)")


def _add_generate_command(commands):
    generate = commands.add_parser("generate", help="continue prompts with a language model run's sampled text")
    generate.add_argument("run_dir", nargs="?", help="the run directory (omit with --litert)")
    generate.add_argument("prompts", nargs="*", help="the prompts (default: stdin, one a line)")
    generate.add_argument("--litert", metavar="DIR", help="generate with a LiteRT export (export --format litert)")
    generate.add_argument("--temperature", type=float, help="0: greedy; default the run's (1.0)")
    generate.add_argument("--top-k", type=int, help="draw among the K most probable tokens only")
    generate.add_argument("--top-p", type=float, help="draw among the most probable tokens that add up to P")
    generate.add_argument("--seed", type=int, default=0, help="the same seed, the same text")
    generate.add_argument("--max-new-tokens", type=int, help="default the run's (60)")
    generate.set_defaults(handler=_generate)


def _add_evaluate_command(commands):
    evaluate = commands.add_parser(
        "evaluate", help="a run's scores: BLEU and chrF (translation), accuracy and F1 (classification), "
        "perplexity and bits per character (language model)"
    )
    evaluate.add_argument("run_dir")
    evaluate.add_argument("--split", choices=["val", "test"], default="val", help="translation: the split")
    evaluate.add_argument("--beam-size", type=int, help="translation: default the run's")
    evaluate.add_argument("--length-penalty", type=float, metavar="ALPHA", help="translation: default the run's")
    evaluate.add_argument("--csv", metavar="FILE", help="classification: a file with text and label columns "
                          "(default: the run's validation set)")
    evaluate.add_argument("--tsv", metavar="FILE", help="translation: source<TAB>reference lines (default: the "
                          "run's --split; an imported checkpoint has none)")
    evaluate.add_argument("--text", metavar="FILES", help="language model: these files' lines (default: the run's "
                          "validation texts)")
    evaluate.add_argument("--batch-size", type=int)
    evaluate.set_defaults(handler=_evaluate)


def _add_translate_command(commands):
    translate = commands.add_parser("translate", help="translate sentences (arguments or stdin, one a line)")
    translate.add_argument("run_dir", nargs="?", help="the run directory (omit with --saved-model)")
    translate.add_argument("sentences", nargs="*")
    translate.add_argument("--beam-size", type=int)
    translate.add_argument(
        "--saved-model", metavar="EXPORT", help="translate with an export (a version directory or its base)"
    )
    translate.add_argument(
        "--ctranslate2", metavar="DIR", help="translate with a CTranslate2 export (export --format ctranslate2)"
    )
    translate.add_argument("--litert", metavar="DIR", help="translate with a LiteRT export (export --format litert)")
    translate.set_defaults(handler=_translate)


def _add_classify_command(commands):
    classify = commands.add_parser(
        "classify", help="label texts with a classifier run (arguments, or stdin one a line): label<TAB>probability"
    )
    classify.add_argument("run_dir", nargs="?", help="the run directory (omit with --litert)")
    classify.add_argument("texts", nargs="*")
    classify.add_argument("--litert", metavar="DIR", help="classify with a LiteRT export (export --format litert)")
    classify.set_defaults(handler=_classify)


def _add_export_command(commands):
    export = commands.add_parser("export", help="export a run as a SavedModel for TensorFlow Serving")
    export.add_argument("run_dir")
    export.add_argument(
        "export_base",
        help="the directory TensorFlow Serving watches (writes EXPORT_BASE/N/); with --format ctranslate2, a new directory",
    )
    export.add_argument("--format", choices=["saved_model", "ctranslate2", "litert", "hf"], default="saved_model",
                        help="a SavedModel (default), a CTranslate2 model with our tokenizers (translation), one "
                        "LiteRT file for on-device use, or a Hugging Face checkpoint (translation: an imported run "
                        "as its family, a SentencePiece run as Marian)")
    export.add_argument("--quantization", choices=["int8", "int8_float32", "int8_float16", "int8_bfloat16", "float16",
                                                   "bfloat16"],
                        help="--format ctranslate2 or litert (int8, float16), hf (float16, bfloat16; default "
                        "float32, or an imported checkpoint's own): how its weights are stored")
    export.add_argument("--version", type=int, help="N (default: one more than the highest there)")
    export.add_argument("--beam-size", type=int, help="translation: default the run's evaluation setting")
    export.add_argument("--length-penalty", type=float, metavar="ALPHA", help="translation: default the run's (0.6)")
    export.add_argument(
        "--max-output-length", type=int, metavar="L",
        help="translation: cap on output tokens (default: the model's max_length)",
    )
    export.set_defaults(handler=_export)


def _add_plot_attention_command(commands):
    plot = commands.add_parser(
        "plot-attention",
        help="translate a sentence (or continue a prompt) and save its attention: heatmaps (PNG), or the explorer (HTML)",
    )
    plot.add_argument("run_dir", nargs="?", help="the run directory (omit with --saved-model)")
    plot.add_argument("sentence", nargs="?")
    plot.add_argument("--out", help="the PNG to write: one layer's heatmaps, a panel per head")
    plot.add_argument(
        "--html", metavar="FILE",
        help="the HTML to write: every map in the interactive explorer, one self-contained file",
    )
    plot.add_argument(
        "--saved-model", metavar="EXPORT", help="with --html: the cross-attention an export computes"
    )
    plot.add_argument("--kind", choices=["cross", "decoder_self", "encoder"],
                      help="translation: default cross (a language model has decoder_self only)")
    plot.add_argument("--layer", type=int, help="default: the last")
    plot.add_argument("--heads", type=int, nargs="+", help="default: all")
    plot.add_argument("--beam-size", type=int, help="translation: default the run's evaluation setting")
    plot.add_argument("--seed", type=int, help="language model: the sampling seed (default 0)")
    plot.set_defaults(handler=_plot_attention)


def _add_import_hf_command(commands):
    imported = commands.add_parser(
        "import-hf", help="a pretrained Hugging Face translation checkpoint (OPUS-MT, M2M100, NLLB) as a run directory"
    )
    imported.add_argument("checkpoint_dir", help="a directory as Hugging Face saves a checkpoint (config.json, "
                          "model.safetensors or pytorch_model.bin, the tokenizer files)")
    imported.add_argument("run_dir", help="the new run directory (must not exist yet)")
    imported.add_argument("--source-lang", metavar="CODE", help="M2M100, NLLB: the language of the texts (en; "
                          "eng_Latn)")
    imported.add_argument("--target-lang", metavar="CODE", help="the language to translate into: M2M100's or NLLB's "
                          "code (de; deu_Latn), or a multilingual OPUS-MT model's >>CODE<< token put before every text")
    # An import computes nothing, and oneDNN keeps every buffer TensorFlow frees for reuse: for an
    # import, the weights' transient copies held to the end (docs/pretrained.md, "Memory").
    imported.set_defaults(handler=_import_hf, tensorflow_environment={"TF_ENABLE_ONEDNN_OPTS": "0"})


def _add_average_checkpoints_command(commands):
    average = commands.add_parser(
        "average-checkpoints",
        help="a new run whose model averages a run's last epoch checkpoints (trained with --keep-checkpoints N)",
    )
    average.add_argument("run_dir")
    average.add_argument("--out", required=True, help="the new run directory (must not exist yet)")
    average.add_argument("--last", type=int, metavar="N", help="average the newest N kept (default: all)")
    average.set_defaults(handler=_average_checkpoints)


# Each adds one command, with its arguments and handler; `--help` lists them in this order.
COMMANDS = (
    _add_train_command,
    _add_train_classifier_command,
    _add_pretrain_command,
    _add_train_lm_command,
    _add_generate_command,
    _add_evaluate_command,
    _add_translate_command,
    _add_classify_command,
    _add_export_command,
    _add_plot_attention_command,
    _add_import_hf_command,
    _add_average_checkpoints_command,
)


# -- the commands --------------------------------------------------------------------------


def _config_from_arguments(arguments, task):
    return options.config_from_options(task, vars(arguments))


def _split_cpu_first(arguments):
    # Splitting the CPU must come before TensorFlow makes its first tensor.
    replicas = getattr(arguments, "training.cpu_replicas", None)
    if replicas:
        from keras_transformer.training import split_cpu

        split_cpu(replicas)


def _finished(metrics, out):
    if not metrics.get("nothing_to_train"):
        return False
    print(
        f"\n{out} has finished its {metrics['epochs_done']} epoch(s): nothing to train. Give --epochs above "
        f"{metrics['epochs_done']} to train it further, or --overwrite to start over."
    )
    return True


def _trained(arguments, task):
    """Train (or continue) the run `arguments` describe: its metrics, or None when there is nothing to report."""
    _split_cpu_first(arguments)
    from keras_transformer.runs import task_module

    metrics = task_module(task).train(_config_from_arguments(arguments, task), arguments.out,
                                      overwrite=arguments.overwrite)
    # A translation run's are its training's alone; the others' have a section per split.
    training = metrics if task == options.TRANSLATION else metrics["training"]
    if _finished(training, arguments.out) or not _reports():
        return None
    return metrics


def _train(arguments):
    training = _trained(arguments, options.TRANSLATION)
    if training is None:
        return
    from keras_transformer.runs import translation

    print(
        f"\ntrained {training['epochs_this_session']} epoch(s) in {training['seconds_this_session']:.0f}s "
        f"({training['seconds_per_epoch']:.0f}s/epoch, {training['parameters']:,} parameters)"
    )
    if not arguments.no_evaluate:
        _report_translation(*translation.evaluate(arguments.out, "val"))
    print(f"\nrun directory: {arguments.out}")
    print(f"TensorBoard:   tensorboard --logdir {arguments.out}/logs")


def _import_hf(arguments):
    from keras_transformer.runs import translation

    config = translation.import_checkpoint(
        arguments.checkpoint_dir, arguments.run_dir, arguments.source_lang, arguments.target_lang
    )
    model, decoding = config["model"], config["evaluation"]
    print(f"imported {arguments.checkpoint_dir} into {arguments.run_dir}: {model['num_layers']} + "
          f"{model['num_layers']} layers, d_model {model['d_model']}, beam {decoding['beam_size']}, "
          f"at most {decoding['max_output_length']} tokens out")
    print(f"try it:        keras-transformer translate {arguments.run_dir} \"...\"")
    print(f"fine-tune it:  keras-transformer train --init-from {arguments.run_dir} --dataset files ... --out ...")


def _train_and_report(arguments, task):
    """`train-classifier`, `pretrain`, `train-lm`: train, then print the result, the run directory, what next."""
    metrics = _trained(arguments, task)
    if metrics is None:
        return
    val, training, out = metrics.get("val", {}), metrics["training"], arguments.out
    per_epoch = f"{training['seconds_per_epoch']:.0f}s/epoch"
    if task == options.CLASSIFICATION:
        lines = (f"validation accuracy {val['accuracy']:.4f} on {val['examples']} examples; {per_epoch}",
                 f"run directory: {out}",
                 f"try it:        keras-transformer classify {out} \"...\"",
                 f"TensorBoard:   tensorboard --logdir {out}/logs   (Projector: the [CLS] embeddings)")
    elif task == options.PRETRAINING:
        lines = (f"validation: {val['masked_accuracy']:.4f} of the hidden tokens guessed, on {val['texts']} texts; "
                 f"{per_epoch}",
                 f"run directory: {out}",
                 f"next:          keras-transformer train-classifier --init-from {out} --dataset ... --out ...")
    else:
        lines = (f"validation perplexity {training['final']['val_perplexity']:.2f} (per token); {per_epoch}",
                 f"run directory: {out}",
                 f"try it:        keras-transformer generate {out} \"...\" --seed 1")
    print("\n" + "\n".join(lines))


def _generate(arguments):
    settings = dict(seed=arguments.seed, temperature=arguments.temperature, top_k=arguments.top_k,
                    top_p=arguments.top_p, max_new_tokens=arguments.max_new_tokens)
    if not (arguments.litert or arguments.run_dir):
        raise ValueError("generate needs a run directory or --litert DIR")
    # With --litert there is no run directory: the first positional is a text.
    positionals = ([arguments.run_dir] if arguments.litert and arguments.run_dir is not None else [])
    positionals += arguments.prompts
    if not arguments.litert:
        _task_of(arguments.run_dir, "generate", (options.LANGUAGE_MODEL,))
    prompts, names = _texts_given(positionals)
    if not prompts:
        raise ValueError("give prompts as arguments or on stdin, one a line")
    if arguments.litert:
        from keras_transformer.on_device import LiteRTModel

        texts = LiteRTModel(arguments.litert).generate(prompts, **settings)
    else:
        from keras_transformer.runs import language_model

        texts = language_model.generate(arguments.run_dir, prompts, **settings)
    _print_answers(texts, names)


def _reports():
    """Whether this process reports a training run: yes, but on a cluster's workers other than the chief."""
    from keras_transformer.training import is_chief

    if is_chief():
        return True
    print("\ntraining done; the chief worker wrote the run directory and reports it")
    return False


def _report_translation(scores, samples):
    print(
        f"\nvalidation BLEU {scores['bleu']:.1f} (lowercased {scores['bleu_lowercase']:.1f}), "
        f"chrF {scores['chrf']:.1f} on {scores['sentences']} sentences, beam size {scores['beam_size']}"
    )
    for sample in samples:
        print(f"\n  source:      {sample['source']}\n  reference:   {sample['reference']}\n  translation: {sample['translation']}")


def _report_classification(scores):
    names = list(scores["classes"])
    width = max(len(name) for name in names + ["class"])
    print(f"accuracy {scores['accuracy']:.4f} on {scores['examples']} examples ({scores['data']})\n")
    print(f"{'class':<{width}}  precision  recall  f1      support")
    for name, row in scores["classes"].items():
        print(f"{name:<{width}}  {row['precision']:<9.4f}  {row['recall']:<6.4f}  {row['f1']:<6.4f}  {row['support']}")
    print(f"\nconfusion matrix (rows: true class, columns: predicted), in the order {', '.join(names)}:")
    for name, row in zip(names, scores["confusion"]):
        print(f"{name:<{width}}  " + "  ".join(f"{count:>6}" for count in row))


def _task_of(run_dir, command, allowed=options.TASKS):
    from keras_transformer.runs import run_dir as runs

    task = runs.task_of(run_dir)
    if task not in allowed:
        raise ValueError(f"{command} works on {' or '.join(allowed)} runs; {run_dir} is a {task} run")
    return task


def _evaluate(arguments):
    from keras_transformer.runs import task_module

    task = _task_of(arguments.run_dir, "evaluate")
    if task == options.TRANSLATION:
        if arguments.csv:
            raise ValueError(f"--csv is for classifier runs; {arguments.run_dir} is a translation run")
        scores, samples = task_module(task).evaluate(
            arguments.run_dir, arguments.split, arguments.beam_size, arguments.batch_size, arguments.length_penalty,
            tsv=arguments.tsv,
        )
        _report_translation(scores, samples)
        print(f"\nhypotheses: {scores['hypotheses']}")
        print(json.dumps({key: scores[key] for key in ("bleu", "bleu_lowercase", "chrf")}))
    elif arguments.beam_size or arguments.length_penalty is not None or arguments.split != "val" or arguments.tsv:
        raise ValueError(
            f"--beam-size, --length-penalty, --split and --tsv are for translation runs; {arguments.run_dir} is a "
            f"{task} run"
        )
    elif task == options.LANGUAGE_MODEL:
        if arguments.csv:
            raise ValueError(f"--csv is for classifier runs; {arguments.run_dir} is a language model (use --text)")
        scores = task_module(task).evaluate(arguments.run_dir, arguments.text, arguments.batch_size or 32)
        print(
            f"perplexity {scores['perplexity']:.2f} per token, {scores['bits_per_character']:.3f} bits per character "
            f"on {scores['texts']} texts ({scores['data']})"
        )
        print(json.dumps({key: scores[key] for key in ("perplexity", "bits_per_character")}))
    else:
        if arguments.text:
            raise ValueError(f"--text is for language-model runs; {arguments.run_dir} is a {task} run")
        _report_classification(task_module(task).evaluate(arguments.run_dir, arguments.csv, arguments.batch_size))


def _texts_given(positionals):
    """`(texts, names)`: the texts a command answers, one each, and how a message names each.

    The arguments, or else every line of stdin, blank ones included (`lines`):
    one answer per line, line N answering line N. Bytes that are not UTF-8
    become U+FFFD, with one line on stderr naming where they were.
    """
    if positionals:
        given = [valid_text(text) for text in positionals]
        names = [f"argument {number}" for number in range(1, len(given) + 1)]
    else:
        given = read_lines(sys.stdin)
        names = [f"line {number}" for number in range(1, len(given) + 1)]
    for name, (_, repaired) in zip(names, given):
        if repaired:
            _warn(f"{name}: bytes that are not UTF-8 were read as U+FFFD")
    return [text for text, _ in given], names


def _print_answers(answers, names, unit="translated"):
    """Each answer on its own line; then, on stderr, each text the model read only part of."""
    for answer in answers:
        print(answer)
    for index, pieces in sorted(getattr(answers, "truncated", {}).items()):
        read = f"its first {pieces} pieces" if pieces else "its beginning"
        _warn(f"{names[index]} is longer than the model reads: only {read} were {unit}")


def _warn(message):
    print(f"keras-transformer: {message}", file=sys.stderr)


def _translate(arguments):
    if sum(bool(road) for road in (arguments.saved_model, arguments.ctranslate2, arguments.litert)) > 1:
        raise ValueError("give one of --saved-model, --ctranslate2 and --litert")
    if (arguments.litert or arguments.saved_model) and arguments.beam_size:
        raise ValueError("--beam-size cannot change an export: its beam size was fixed by `export`")
    exported = arguments.litert or arguments.ctranslate2 or arguments.saved_model
    if not (exported or arguments.run_dir):
        raise ValueError("translate needs a run directory or --saved-model EXPORT")
    # With an export there is no run directory: the first positional is a sentence.
    positionals = ([arguments.run_dir] if exported and arguments.run_dir is not None else []) + arguments.sentences
    if not exported:
        _task_of(arguments.run_dir, "translate", (options.TRANSLATION,))
    sentences, names = _texts_given(positionals)
    if arguments.litert:
        # No TensorFlow in this process: the LiteRT runtime alone (keras_transformer.on_device).
        from keras_transformer.on_device import LiteRTModel

        translations = LiteRTModel(arguments.litert).translate(sentences)
    else:
        from keras_transformer.runs import translation

        if arguments.ctranslate2:
            translations = translation.translate_with_ctranslate2(arguments.ctranslate2, sentences,
                                                                  arguments.beam_size)
        elif arguments.saved_model:
            translations = translation.translate_with_export(arguments.saved_model, sentences)
        else:
            translations = translation.translate(arguments.run_dir, sentences, arguments.beam_size)
    _print_answers(translations, names)


def _average_checkpoints(arguments):
    from keras_transformer.runs import run_dir as runs

    epochs = runs.average_checkpoints(arguments.run_dir, arguments.out, arguments.last)
    print(f"{arguments.out}: the mean of epochs {', '.join(map(str, epochs))} of {arguments.run_dir}")
    print(f"evaluate it: keras-transformer evaluate {arguments.out}")


def _classify(arguments):
    if not (arguments.litert or arguments.run_dir):
        raise ValueError("classify needs a run directory or --litert DIR")
    # With --litert there is no run directory: the first positional is a text.
    positionals = ([arguments.run_dir] if arguments.litert and arguments.run_dir is not None else [])
    positionals += arguments.texts
    if arguments.litert:
        from keras_transformer.on_device import LiteRTModel

        texts, names = _texts_given(positionals)
        labels = LiteRTModel(arguments.litert).classify(texts)
    else:
        _task_of(arguments.run_dir, "classify", (options.CLASSIFICATION,))
        from keras_transformer.runs import classification

        texts, names = _texts_given(positionals)
        labels = classification.classify(arguments.run_dir, texts)
    # A blank text has nothing to classify: a blank line answers it.
    lines = ["" if label is None else f"{label}\t{probability:.4f}" for label, probability in labels]
    _print_answers(lines, names)


def _export(arguments):
    from keras_transformer.runs import task_module

    task = _task_of(arguments.run_dir, "export", (options.TRANSLATION, options.CLASSIFICATION, options.LANGUAGE_MODEL))
    if arguments.quantization and arguments.format == "saved_model":
        raise ValueError("--quantization is for --format ctranslate2 or litert")
    if arguments.format == "litert":
        if arguments.version:
            raise ValueError("--format litert writes a new directory (no --version)")
        if task == options.TRANSLATION:
            path = task_module(task).export_litert(
                arguments.run_dir, arguments.export_base, quantization=arguments.quantization,
                beam_size=arguments.beam_size, length_alpha=arguments.length_penalty,
                max_output_length=arguments.max_output_length,
            )
        else:
            if arguments.beam_size or arguments.length_penalty is not None or arguments.max_output_length:
                raise ValueError("--beam-size, --length-penalty and --max-output-length are for translation runs")
            path = task_module(task).export_litert(arguments.run_dir, arguments.export_base, arguments.quantization)
        command = {options.TRANSLATION: "translate", options.CLASSIFICATION: "classify",
                   options.LANGUAGE_MODEL: "generate"}[task]
        print(f"exported LiteRT model: {path}")
        print(f"try it:     keras-transformer {command} --litert {path} \"...\"")
        return
    if arguments.format in ("hf", "ctranslate2") and (task != options.TRANSLATION or arguments.version):
        raise ValueError(f"--format {arguments.format} exports a translation run, to a new directory (no --version)")
    if arguments.format == "hf":
        if arguments.beam_size or arguments.length_penalty is not None or arguments.max_output_length:
            raise ValueError("--format hf writes the run's own decoding settings (no --beam-size, --length-penalty "
                             "or --max-output-length)")
        if arguments.quantization not in (None, "float16", "bfloat16"):
            raise ValueError(f"--format hf stores float32, float16 or bfloat16 weights, not {arguments.quantization}")
        path = task_module(task).export_hf(arguments.run_dir, arguments.export_base, dtype=arguments.quantization)
        print(f"exported Hugging Face checkpoint: {path}")
        print(f"try it:     keras-transformer import-hf {path} RUN_DIR, or from_pretrained({path!r}) in transformers")
        return
    if arguments.format == "ctranslate2":
        path = task_module(task).export_ctranslate2(
            arguments.run_dir, arguments.export_base, quantization=arguments.quantization,
            beam_size=arguments.beam_size, length_alpha=arguments.length_penalty,
            max_output_length=arguments.max_output_length,
        )
        print(f"exported CTranslate2 model: {path}")
        print(f"try it:     keras-transformer translate --ctranslate2 {path} \"...\"")
        return
    if task == options.TRANSLATION:
        path = task_module(task).export(
            arguments.run_dir,
            arguments.export_base,
            version=arguments.version,
            beam_size=arguments.beam_size,
            length_alpha=arguments.length_penalty,
            max_output_length=arguments.max_output_length,
        )
        print(f"exported SavedModel: {path}")
        with open(os.path.join(path, "assets.extra", "translator.json"), encoding="utf-8") as file:
            print(f"signatures: {', '.join(json.load(file)['signatures'])}")  # an M2M100's has translate_between
        print(f"try it:     keras-transformer translate --saved-model {path} \"...\"")
    else:
        if arguments.beam_size or arguments.length_penalty is not None or arguments.max_output_length:
            raise ValueError("--beam-size, --length-penalty and --max-output-length are for translation runs")
        path = task_module(task).export(arguments.run_dir, arguments.export_base, version=arguments.version)
        print(f"exported SavedModel: {path}")
        if task == options.LANGUAGE_MODEL:
            print("signatures: serving_default (text -> text, continuation, new_tokens), "
                  "generate (text, seed, temperature, top_k, top_p, max_new_tokens -> the same)")
        else:
            print("signature: serving_default (text -> label, label_id, probabilities, embedding)")


def _plot_attention(arguments):
    if not (arguments.out or arguments.html):
        raise ValueError("plot-attention needs --out FILE.png, --html FILE.html, or both")
    from keras_transformer.runs import translation

    if arguments.saved_model:
        # No run directory with an export: the positional is the sentence.
        sentence = arguments.sentence or arguments.run_dir
        if arguments.out or arguments.sentence or not sentence:
            raise ValueError(
                "with --saved-model, give one sentence and --html: an export gives its cross-attention "
                "(for PNGs and the other kinds, use its run directory)"
            )
        translated = translation.plot_attention_with_export(arguments.saved_model, sentence, arguments.html)
    else:
        if not (arguments.run_dir and arguments.sentence):
            raise ValueError("plot-attention needs a run directory and a sentence (or --saved-model EXPORT)")
        task = _task_of(arguments.run_dir, "plot-attention", (options.TRANSLATION, options.LANGUAGE_MODEL))
        if task == options.LANGUAGE_MODEL:
            if arguments.kind not in (None, "decoder_self") or arguments.beam_size:
                raise ValueError("a language model has --kind decoder_self only, and samples instead of --beam-size")
            from keras_transformer.runs import language_model

            translated = language_model.plot_attention(
                arguments.run_dir, arguments.sentence, png=arguments.out, html=arguments.html, layer=arguments.layer,
                heads=arguments.heads, seed=arguments.seed or 0,
            )
        else:
            if arguments.seed is not None:
                raise ValueError("--seed is for language-model runs: a translation is searched, not sampled")
            translated = translation.plot_attention(
                arguments.run_dir, arguments.sentence, png=arguments.out, html=arguments.html,
                kind=arguments.kind or "cross", layer=arguments.layer, beam_size=arguments.beam_size,
                heads=arguments.heads,
            )
    print(translated)
    for path in (arguments.out, arguments.html):
        if path:
            print(f"attention: {path}")


# -- running -----------------------------------------------------------------------------


# The exit status of a run stopped by SIGTERM after saving its state (128 + 15,
# what a shell reports for a process that SIGTERM ended).
INTERRUPTED = 143


def _use_tensorflow_backend():
    """The commands run on TensorFlow (tf.data, tensorflow-text, tf.distribute, SavedModels).

    A KERAS_BACKEND naming another backend is set aside, with one line that
    says so; returns an error message when Keras already started on another.
    """
    keras = sys.modules.get("keras")
    if keras is not None:
        backend = keras.backend.backend()
        if backend != "tensorflow":
            return f"the command line runs on TensorFlow, and Keras already started on {backend}: unset KERAS_BACKEND"
        return None
    requested = os.environ.get("KERAS_BACKEND", "tensorflow")
    if requested != "tensorflow":
        print(
            f"keras-transformer: commands run on TensorFlow (tf.data, tensorflow-text, tf.distribute, "
            f"SavedModels); KERAS_BACKEND={requested} is set aside for this one",
            file=sys.stderr,
        )
    os.environ["KERAS_BACKEND"] = "tensorflow"
    return None


def main(argv=None):
    arguments = build_parser().parse_args(argv)
    problem = _use_tensorflow_backend()
    if problem:
        print(f"keras-transformer: error: {problem}", file=sys.stderr)
        return 2
    for name, value in getattr(arguments, "tensorflow_environment", {}).items():
        os.environ.setdefault(name, value)  # read once, when TensorFlow starts: a user's setting wins
    # A LiteRT export runs without TensorFlow (keras_transformer.on_device): nothing of it is started.
    on_device = bool(getattr(arguments, "litert", None))
    if not on_device:
        startup.start_tensorflow_quietly()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    TrainingInterrupted = ()  # noqa: N806  (the exception class below, where training can run)
    if not on_device:
        from keras_transformer.training import TrainingInterrupted

    try:
        arguments.handler(arguments)
    except (ValueError, FileNotFoundError, FileExistsError, ImportError) as error:
        # ImportError: an optional extra that is not installed (its message says which).
        print(f"keras-transformer: error: {error}", file=sys.stderr)
        return 2
    except TrainingInterrupted as error:
        print(f"keras-transformer: {error}", file=sys.stderr)
        return INTERRUPTED
    except Exception as error:
        message = _lost_worker(error)
        if message is None:
            raise
        print(f"keras-transformer: error: {message}", file=sys.stderr)
        return 3
    return 0


def _lost_worker(error):
    """What to tell the user when a worker of the cluster stopped (else None)."""
    tensorflow = sys.modules.get("tensorflow")
    lost = (tensorflow.errors.UnavailableError, tensorflow.errors.DeadlineExceededError) if tensorflow else ()
    if not lost or not isinstance(error, lost) or not os.environ.get("TF_CONFIG"):
        return None
    tasks = sorted(set(re.findall(r"/job:(\w+)/replica:\d+/task:(\d+)", str(error).partition("unhealthy")[2])))
    who = ", ".join(f"{kind} {index}" for kind, index in tasks) or "a worker"
    return (
        f"{who} of the cluster stopped answering; restart every worker with the same command: "
        "training resumes from its last backup"
    )


if __name__ == "__main__":
    sys.exit(main())
