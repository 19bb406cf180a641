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
import logging
import os
import re
import sys

from keras_transformer import commands as handlers
from keras_transformer import startup
from keras_transformer.runs import exporters, options

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
    train = _add_training_command(commands, "train", options.TRANSLATION, handlers.train,
                                  "train a translation model into a run directory")
    train.add_argument("--no-evaluate", action="store_true", help="skip the validation BLEU at the end")


def _add_train_classifier_command(commands):
    _add_training_command(commands, "train-classifier", options.CLASSIFICATION,
                          functools.partial(handlers.train_and_report, task=options.CLASSIFICATION),
                          "train an encoder-only text classifier")


def _add_pretrain_command(commands):
    _add_training_command(commands, "pretrain", options.PRETRAINING,
                          functools.partial(handlers.train_and_report, task=options.PRETRAINING),
                          "pre-train a classifier's encoder on unlabelled text (masked language modelling)")


def _add_train_lm_command(commands):
    _add_training_command(commands, "train-lm", options.LANGUAGE_MODEL,
                          functools.partial(handlers.train_and_report, task=options.LANGUAGE_MODEL),
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
    generate.set_defaults(handler=handlers.generate)


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
    evaluate.set_defaults(handler=handlers.evaluate)


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
    translate.set_defaults(handler=handlers.translate)


def _add_classify_command(commands):
    classify = commands.add_parser(
        "classify", help="label texts with a classifier run (arguments, or stdin one a line): label<TAB>probability"
    )
    classify.add_argument("run_dir", nargs="?", help="the run directory (omit with --litert)")
    classify.add_argument("texts", nargs="*")
    classify.add_argument("--litert", metavar="DIR", help="classify with a LiteRT export (export --format litert)")
    classify.set_defaults(handler=handlers.classify)


def _add_export_command(commands):
    export = commands.add_parser("export", help="export a run as a SavedModel for TensorFlow Serving")
    export.add_argument("run_dir")
    export.add_argument(
        "export_base",
        help="the directory TensorFlow Serving watches (writes EXPORT_BASE/N/); with --format ctranslate2, a new directory",
    )
    export.add_argument("--format", choices=list(exporters.FORMATS), default="saved_model", help=exporters.FORMAT_HELP)
    export.add_argument("--quantization", choices=["int8", "int8_float32", "int8_float16", "int8_bfloat16", "float16",
                                                   "bfloat16"],
                        help="--format ctranslate2, litert or web (int8, float16), hf (float16, bfloat16; default "
                        "float32, or an imported checkpoint's own): how its weights are stored")
    export.add_argument("--ops", choices=["text", "builtin"],
                        help="--format litert: text in and out on tensorflow-text's kernels (default), or ids in and "
                        "out on builtin operators only, with the tokenizers beside the file (stock LiteRT, no TensorFlow)")
    export.add_argument("--version", type=int, help="N (default: one more than the highest there)")
    export.add_argument("--beam-size", type=int, help="translation: default the run's evaluation setting")
    export.add_argument("--length-penalty", type=float, metavar="ALPHA", help="translation: default the run's (0.6)")
    export.add_argument(
        "--max-output-length", type=int, metavar="L",
        help="translation: cap on output tokens (default: the model's max_length)",
    )
    export.set_defaults(handler=handlers.export)


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
    plot.set_defaults(handler=handlers.plot_attention)


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
    imported.set_defaults(handler=handlers.import_hf, tensorflow_environment={"TF_ENABLE_ONEDNN_OPTS": "0"})


def _add_average_checkpoints_command(commands):
    average = commands.add_parser(
        "average-checkpoints",
        help="a new run whose model averages a run's last epoch checkpoints (trained with --keep-checkpoints N)",
    )
    average.add_argument("run_dir")
    average.add_argument("--out", required=True, help="the new run directory (must not exist yet)")
    average.add_argument("--last", type=int, metavar="N", help="average the newest N kept (default: all)")
    average.set_defaults(handler=handlers.average_checkpoints)


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
