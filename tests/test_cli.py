"""`keras-transformer` end to end, as a user runs it: real run directories, and the installed command.

Most commands run through the CLI's entry function in this process (`cli_here`);
a new process where the process is the point: `--help` without TensorFlow, the
installed console script's quiet start, the examples' first lines.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import TINY_MODEL, check_run_directory, cli_here, run
from keras_transformer import data


@pytest.mark.slow
@pytest.mark.skipif(not (data.multi30k_directory() / "train.de").exists(), reason="../shared/data/multi30k is not present")
def test_train_on_a_slice_of_multi30k(tmp_path):
    run = tmp_path / "multi30k"
    cli_here(
        "train", "--dataset", "multi30k", "--out", run, "--epochs", 1, "--steps-per-epoch", 4,
        "--limit-train", 1500, "--limit-val", 30, "--vocab-size", 2000, "--tokens-per-batch", 2048,
        # No attention maps or BLEU samples each epoch: the TensorBoard tests prove those.
        *TINY_MODEL, "--no-evaluate", "--attention-samples", 0, "--bleu-samples", 0,
    )
    check_run_directory(run)
    config = json.loads((run / "config.json").read_text())
    assert config["data"]["dataset"] == "multi30k" and config["data"]["direction"] == "de-en"
    source_vocab = (run / "vocab" / "source" / "vocab.txt").read_text(encoding="utf-8")
    assert "ä" in source_vocab or "ü" in source_vocab  # German on the source side
    scores = json.loads(cli_here("evaluate", run, "--beam-size", 1).stdout.strip().splitlines()[-1])
    assert 0.0 <= scores["bleu"] <= 100.0


@pytest.mark.slow
def test_bad_input_gives_a_clear_error_and_exit_code(tmp_path):
    source = tmp_path / "train.de"
    target = tmp_path / "train.en"
    source.write_text("Ein Hund.\nZwei Katzen.\n", encoding="utf-8")
    target.write_text("A dog.\n", encoding="utf-8")
    result = cli_here("train", "--dataset", "files", "--train-source", source, "--train-target", target,
                 "--out", tmp_path / "run", check=False)
    assert result.returncode == 2
    assert "train.de has 2 lines" in result.stderr and "train.en has 1" in result.stderr
    assert "Traceback" not in result.stderr

    missing = cli_here("evaluate", tmp_path / "nowhere", check=False)
    assert missing.returncode == 2 and "not a run directory" in missing.stderr

    no_files = cli_here("train", "--dataset", "files", "--out", tmp_path / "run2", check=False)
    assert no_files.returncode == 2 and "--train-tsv" in no_files.stderr


def test_help_lists_the_commands():
    result = cli_here("--help")
    for command in ("train", "evaluate", "translate", "export", "plot-attention", "train-classifier"):
        assert command in result.stdout


def test_help_answers_without_starting_tensorflow():
    # As the installed `keras-transformer` command runs it: argv[0] is the command's name.
    script = (
        "import sys; sys.argv = ['keras-transformer', 'train', '--help']\n"
        "from keras_transformer import cli\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(name for name in ('tensorflow', 'keras', 'numpy') if name in sys.modules)\n"
        "print('imported:', heavy)\n"
    )
    result = run([sys.executable, "-c", script])
    assert "--tokens-per-batch" in result.stdout and "imported: []" in result.stdout, result.stdout[-500:]


def test_the_options_table_matches_the_library():
    """Each option sets a setting its task has, and its choices are what the library accepts."""
    from keras_transformer import models, training
    from keras_transformer.data.pipeline import LONG_PAIR_POLICIES
    from keras_transformer.layers.embedding import POSITION_KINDS
    from keras_transformer.models.classifier import POOLINGS
    from keras_transformer.runs import options
    from keras_transformer.text.sentencepiece import SENTENCEPIECE_MODEL_TYPES

    for option in options.OPTIONS:
        for task in option.tasks:
            section = options.DEFAULTS[task].get(option.section)
            assert section is not None and (option.key in section or option.section == "model"), (task, option)
    choices = {option.dest: set(option.choices) for option in options.OPTIONS if option.choices}
    assert choices["training.strategy"] == set(training.STRATEGIES)
    assert choices["training.precision"] == set(training.PRECISIONS)
    assert choices["training.long_pairs"] == set(LONG_PAIR_POLICIES)
    assert choices["model.preset"] == set(models.PRESETS)
    (language_model_presets,) = [option.choices for option in options.OPTIONS
                                 if option.dest == "model.preset" and options.LANGUAGE_MODEL in option.tasks]
    assert set(language_model_presets) == set(models.language_model.PRESETS)
    assert choices["model.position"] == set(POSITION_KINDS)
    assert choices["model.pooling"] == set(POOLINGS)
    assert choices["tokenizer.sentencepiece_model"] == set(SENTENCEPIECE_MODEL_TYPES)
    assert set(cli_plot_kinds()) == set(models.attention_maps.KINDS)


def cli_plot_kinds():
    from keras_transformer import cli

    parser = cli.build_parser()
    commands = next(action for action in parser._actions if action.dest == "command")
    kind = next(action for action in commands.choices["plot-attention"]._actions if action.dest == "kind")
    return kind.choices


def test_options_given_become_the_config():
    from keras_transformer import cli
    from keras_transformer.runs import options

    arguments = cli.build_parser().parse_args(["train", "--out", "x", "--epochs", "7", "--shared-vocab"])
    config = options.config_from_options(options.TRANSLATION, vars(arguments))
    assert config["training"]["epochs"] == 7 and config["tokenizer"]["shared"] is True
    assert config["model"]["d_model"] == options.DEMO["model"]["d_model"]  # the demo corpus brings the demo's model
    arguments = cli.build_parser().parse_args(["train", "--out", "x", "--dataset", "multi30k"])
    config = options.config_from_options(options.TRANSLATION, vars(arguments))
    assert config == {"data": {"dataset": "multi30k"}}


def test_the_command_is_quiet_about_tensorflow_starting(tmp_path):
    # The installed command, with no TF_CPP_MIN_LOG_LEVEL: TensorFlow starts
    # (to evaluate), and stderr holds our one line and nothing of its start-up.
    command = Path(sys.executable).with_name("keras-transformer")
    environment = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run(
        [str(command), "evaluate", str(tmp_path / "nowhere")], capture_output=True, text=True, env=environment,
        timeout=300,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"keras-transformer: error: {tmp_path / 'nowhere'} is not a run directory: it has no config.json"
    ], result.stderr


# What TensorFlow's C++ side prints while it starts, whatever TF_CPP_MIN_LOG_LEVEL says (startup.py).
START_UP_NOISE = ("All log messages before absl::InitializeLog", "oneDNN custom operations are on",
                  "Could not find cuda drivers", "failed call to cuInit", "cpu_feature_guard")

# The command as its console script starts it (argv[0] "keras-transformer": the package defers its
# imports to the command), then an op, as every command that goes on runs some; and whether
# TensorFlow was imported, on stdout.
AS_THE_CONSOLE_SCRIPT = """
import sys
sys.argv = ["keras-transformer", "evaluate", sys.argv[1]]
from keras_transformer.cli import main
status = main()
started = "tensorflow" in sys.modules
import tensorflow as tf
tf.constant(1.0) + 1.0
print("the command started TensorFlow:", started)
sys.exit(status)
"""


@pytest.mark.parametrize("level", [None, "2", "3"])
def test_asking_tensorflow_for_quiet_is_never_noisier(tmp_path, level):
    # A user who set TF_CPP_MIN_LOG_LEVEL (the setting users reach for) hears no more of TensorFlow's
    # start-up than one who did not: stderr is the command's one line either way.
    environment = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    if level is not None:
        environment["TF_CPP_MIN_LOG_LEVEL"] = level
    result = subprocess.run(
        [sys.executable, "-c", AS_THE_CONSOLE_SCRIPT, str(tmp_path / "nowhere")], capture_output=True, text=True,
        env=environment, timeout=300,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "the command started TensorFlow: True" in result.stdout, result.stdout
    assert not [line for line in result.stderr.splitlines() if any(noise in line for noise in START_UP_NOISE)], (
        result.stderr
    )
    assert result.stderr.splitlines() == [
        f"keras-transformer: error: {tmp_path / 'nowhere'} is not a run directory: it has no config.json"
    ], result.stderr


# Every command that takes a run directory and then texts, with options before, between and after
# the texts: what the command receives, and the options it got.
OPTIONS_ANYWHERE = {
    "translate": (["--beam-size", "3"], "sentences", {"beam_size": 3}),
    "classify": ([], "texts", {}),
    "generate": (["--seed", "7", "--top-k", "5"], "prompts", {"seed": 7, "top_k": 5}),
}


@pytest.mark.parametrize("command", sorted(OPTIONS_ANYWHERE))
def test_options_go_before_between_or_after_the_texts(command):
    from keras_transformer import cli

    options_given, texts_dest, expected = OPTIONS_ANYWHERE[command]
    texts = ["The dog sees the cat.", "A woman sleeps."]
    for arguments in (
        [command, "runs/demo", *options_given, *texts],
        [command, *options_given, "runs/demo", *texts],
        [command, "runs/demo", texts[0], *options_given, texts[1]],
        [command, "runs/demo", *texts, *options_given],
    ):
        parsed = vars(cli.build_parser().parse_args(arguments))
        assert parsed["run_dir"] == "runs/demo" and parsed[texts_dest] == texts, arguments
        assert {key: parsed[key] for key in expected} == expected, arguments


def test_plot_attention_takes_its_options_anywhere():
    from keras_transformer import cli

    for arguments in (
        # --heads takes a list: the next text goes after another option, or after "--".
        ["runs/demo", "--heads", "0", "1", "--out", "a.png", "A dog."],
        ["--layer", "1", "runs/demo", "--out", "a.png", "--heads", "0", "1", "--", "A dog."],
        ["runs/demo", "A dog.", "--out", "a.png", "--layer", "1"],
    ):
        parsed = cli.build_parser().parse_args(["plot-attention", *arguments])
        assert (parsed.run_dir, parsed.sentence, parsed.out) == ("runs/demo", "A dog.", "a.png"), arguments
    # A text that looks like an option still goes after "--".
    parsed = cli.build_parser().parse_args(["translate", "runs/demo", "--beam-size", "2", "--", "--not-an-option"])
    assert parsed.sentences == ["--not-an-option"] and parsed.beam_size == 2


def test_an_unknown_option_among_the_texts_is_still_refused(capsys):
    from keras_transformer import cli

    with pytest.raises(SystemExit) as exit_status:
        cli.build_parser().parse_args(["translate", "runs/demo", "A dog.", "--beams", "2"])
    assert exit_status.value.code == 2
    assert "unrecognized arguments: --beams 2" in capsys.readouterr().err


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.slow
def test_the_examples_start_without_tensorflows_start_up_lines():
    # Each example that imports the package, as a user starts it (no TF_CPP_MIN_LOG_LEVEL): what it
    # prints first is its own. The three start side by side; each imports TensorFlow.
    environment = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    names = ("translate_multi30k.py", "classify_sentiment.py", "language_model.py")
    started = {
        name: subprocess.Popen([sys.executable, str(EXAMPLES / name), "--help"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=environment)
        for name in names
    }
    for name, process in started.items():
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[-2000:]
        assert stdout.startswith(f"usage: {name}"), stdout[:300]
        assert stderr == "", f"{name} printed on stderr:\n{stderr[:1000]}"


def test_each_export_format_refuses_in_one_line_what_it_cannot_take():
    """`export`'s one table (`runs/exporters.py`): a format's refusals, before any run is loaded."""
    from keras_transformer.runs.exporters import FORMATS

    refusal = lambda name, task, **options: FORMATS[name].refusal(name, task, options)  # noqa: E731
    assert refusal("hf", "translation", beam_size=2).startswith("--format hf writes the run's own decoding")
    assert refusal("hf", "translation", quantization="int8") == (
        "--format hf stores float32, float16 or bfloat16 weights, not int8")
    assert refusal("saved_model", "translation", quantization="int8") == (
        "--quantization is for --format ctranslate2, litert, web or hf")
    assert refusal("ctranslate2", "classification") == (
        "--format ctranslate2 exports a translation run, to a new directory (no --version)")
    assert refusal("litert", "translation", version=2) == "--format litert writes a new directory (no --version)"
    assert refusal("litert", "language_model", max_output_length=8) == (
        "--beam-size, --length-penalty and --max-output-length are for translation runs")
    assert refusal("saved_model", "classification", version=3) is None
    assert refusal("litert", "translation", quantization="int8", beam_size=4) is None
