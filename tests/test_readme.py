"""The README's and docs/' code is what a user pastes: it must run as written.

The quickstart runs and learns (the suite's proof that a Transformer learns a
task); every `keras-transformer` command of a shell block is one the parser
accepts; every Python block compiles; what cannot run on a plain machine
(Docker, a running TensorFlow Serving) says so beside it.
"""

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
FENCED = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
SHELL_LANGUAGES = ("bash", "sh", "shell", "console")


def code_blocks(languages):
    """(where, text) of each fenced block in one of `languages`, `where` as "docs/x.md:LINE"."""
    for path in DOCUMENTS:
        text = path.read_text(encoding="utf-8")
        for match in FENCED.finditer(text):
            if match.group(1) in languages:
                line = text.count("\n", 0, match.start()) + 2
                yield f"{path.relative_to(ROOT)}:{line}", match.group(2)


def shell_commands():
    """(where, command line) of each shell block's lines: continuations joined, quotes spanning lines kept whole."""
    for where, text in code_blocks(SHELL_LANGUAGES):
        pending = ""
        for line in text.replace("\\\n", " ").splitlines():
            pending = f"{pending}\n{line}" if pending else line
            try:
                shlex.split(pending, comments=True)
            except ValueError:  # a quotation still open: the command goes on
                continue
            if pending.strip() and not pending.strip().startswith("#"):
                yield where, pending
            pending = ""
        assert not pending, f"{where}: an unclosed quotation: {pending!r}"


def words_of(command):
    """The words of a shell command line, its comment left out; operators (|, &&, ;, >) as words of their own."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def keras_transformer_invocations():
    """(where, command, arguments) of every `keras-transformer ...` in the shell blocks, up to a pipe or the like."""
    for where, command in shell_commands():
        words = words_of(command)
        for start, word in enumerate(words):
            if word != "keras-transformer":
                continue
            arguments = []
            for argument in words[start + 1:]:
                if set(argument) <= set("();<>|&"):
                    break
                arguments.append(argument)
            yield where, command, arguments


@pytest.mark.slow
def test_quickstart_runs_and_learns():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    quickstart = blocks[0]
    assert "model.fit" in quickstart
    namespace = {}
    exec(compile(quickstart, "README quickstart", "exec"), namespace)
    model, np = namespace["model"], namespace["np"]
    assert model.history.history["accuracy"][-1] > 0.8
    # It learned the task, not the examples: sequences it never saw come out reversed.
    unseen = np.random.default_rng(1).integers(3, 20, size=(256, 10))
    decoder_input = np.concatenate([np.ones((256, 1), int), unseen[:, ::-1][:, :-1]], axis=1)
    predicted = np.asarray(model.predict([unseen, decoder_input], verbose=0)).argmax(-1)
    assert np.mean(predicted == unseen[:, ::-1]) > 0.8


def test_every_documented_command_is_one_the_parser_accepts():
    from keras_transformer import cli

    invocations = list(keras_transformer_invocations())
    # Not vacuous: the README and most docs show commands, every command of the CLI among them.
    assert len(invocations) >= 40 and len({where.split(":")[0] for where, _, _ in invocations}) >= 8
    assert {arguments[0] for _, _, arguments in invocations} >= {
        "train", "evaluate", "translate", "export", "import-hf", "train-classifier", "classify", "pretrain",
        "train-lm", "generate", "plot-attention", "average-checkpoints",
    }
    refused = []
    for where, command, arguments in invocations:
        assert arguments and not any(argument.startswith("[") for argument in arguments), (where, command)
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):
                cli.build_parser().parse_args(arguments)
        except SystemExit:
            refused.append(f"{where}: {command.strip()}\n    {errors.getvalue().strip().splitlines()[-1]}")
    assert not refused, "\n".join(refused)


def test_what_cannot_run_on_a_plain_machine_says_so():
    # Docker, and a TensorFlow Serving it runs: marked on the line, the rest runs as written.
    for where, command in shell_commands():
        words = words_of(command)
        if words[0] == "docker":
            assert "# needs Docker" in command, (where, command)
        if any("localhost:" in word for word in words) or "examples/serving_client.py" in words:
            assert re.search(r"# .*needs the server", command), (where, command)


def test_every_python_block_compiles():
    blocks = list(code_blocks(("python",)))
    assert len(blocks) >= 8
    for where, source in blocks:
        compile(source, where, "exec")
    # A block of Python needs its language named, or this test would not see it.
    for where, source in code_blocks(("",)):
        assert not re.search(r"^(import |from \w[\w.]* import |\w+ = )", source, re.M), (where, source)
