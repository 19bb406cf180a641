"""A run directory survives what users and machines do to it: kills, reruns, damaged files.

- A killed run resumes and trains exactly as if it had never stopped, to the last digit.
- A rerun never loses work nor silently ignores what it was asked (the rules in `runs.run_dir.start`).
- A damaged or crafted file gets one line naming it and exit status 2 from every command, never a
  traceback.
"""

import csv
import json
import os
import shutil
import signal
import subprocess
import time
import zipfile

import pytest

from helpers import CLI, ENV, TINY_MODEL, cli, cli_here
from keras_transformer import cli as command_line
from keras_transformer.runs import run_dir, translation

# The same training in this process (`cli_here`) and in a new one (`cli`, the kill tests): one device, and
# no attention maps or BLEU samples each epoch (the TensorBoard tests prove those).
SMALL_RUN = [
    "--dataset", "demo", "--limit-train", "1500", "--limit-val", "20", "--no-evaluate", "--tokens-per-batch", "1024",
    "--attention-samples", "0", "--bleu-samples", "0", "--warmup-steps", "50", *TINY_MODEL,
]


def history(run):
    with open(run / "history.csv", newline="") as file:
        return list(csv.DictReader(file))


def backup_state(run):
    state = run / "backup" / "state.json"
    return json.loads(state.read_text()) if state.exists() else None


FINISHED_RUN = [*SMALL_RUN, "--epochs", 4, "--keep-checkpoints", 3]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """SMALL_RUN trained for 4 epochs in this process, keeping its last 3 epochs' checkpoints: read only."""
    run = tmp_path_factory.mktemp("finished") / "run"
    cli_here("train", *FINISHED_RUN, "--out", run)
    return run


def wait_for_backup(process, run, condition, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None:
        state = backup_state(run)  # replaced whole: never half written
        if state and condition(state):
            return state
        time.sleep(0.05)
    raise AssertionError(f"no backup such that {condition}: the run ended ({process.poll()}) or took too long")


@pytest.mark.slow
def test_a_run_killed_or_stopped_mid_epoch_resumes_exactly_as_if_never_stopped(finished_run, tmp_path):
    # The uninterrupted run trained in this process; the killed and stopped ones in processes of their own.
    run = tmp_path / "killed"
    arguments = CLI + [str(a) for a in ("train", *FINISHED_RUN, "--out", run, "--save-every-steps", 3)]
    # kill -9 in the middle of the second epoch, after a backup written there.
    process = subprocess.Popen(arguments, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    killed_at = wait_for_backup(process, run, lambda state: state["epoch"] == 1 and state["batches_done"] > 0)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert len(history(run)) == 1 and not (run / "model.keras").exists()
    # Until training finishes, the run translates with its best checkpoint so far.
    assert translation.translate(run, ["the dog sees a cat ."], beam_size=1)[0].strip()

    # Rerun, then SIGTERM (a preempted machine) after a later backup: it saves after the step under
    # way, says so in one line and exits with 143.
    process = subprocess.Popen(arguments, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV, text=True)
    wait_for_backup(process, run, lambda state: (state["epoch"], state["batches_done"]) >
                    (killed_at["epoch"], killed_at["batches_done"]))
    process.send_signal(signal.SIGTERM)
    _, errors = process.communicate(timeout=120)
    assert process.returncode == 143, errors[-3000:]
    lines = [line for line in errors.splitlines() if line.startswith("keras-transformer")]
    assert len(lines) == 1 and "stopped by SIGTERM" in lines[0] and "rerun the same command" in lines[0], errors
    assert errors.rstrip().endswith(lines[0]), "no traceback"
    stopped_at = backup_state(run)
    assert stopped_at["batches_done"] > 0 and not (run / "model.keras").exists()

    resumed = cli_here(*arguments[len(CLI):])
    assert f"Epoch {stopped_at['epoch'] + 1}/4" in resumed.stdout and "Epoch 1/4" not in resumed.stdout
    # Same batches in the same order, same dropout, the epoch's metrics carried over: every
    # figure of every epoch is the same.
    assert history(run) == history(finished_run)
    assert (run / "model.keras").exists()
    assert [name for name in os.listdir(run / "backup") if name.endswith(".h5")] == [backup_state(run)["weights"]]


@pytest.mark.slow
def test_reruns_follow_the_rules_and_never_replace_a_better_checkpoint(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    finished = {name: (run / name).read_bytes() for name in ("model.keras", "history.csv", "checkpoints/best.weights.h5")}

    # A finished run is not trained again.
    again = cli_here("train", *FINISHED_RUN, "--out", run)
    assert "has finished its 4 epoch(s): nothing to train" in again.stdout
    assert {name: (run / name).read_bytes() for name in finished} == finished

    # Other settings are refused, naming them; nothing is touched.
    changed = cli_here("train", *FINISHED_RUN, "--d-model", 64, "--out", run, check=False)
    assert changed.returncode == 2
    (line,) = [line for line in changed.stderr.splitlines() if line.startswith("keras-transformer:")]
    assert "model.d_model: 32 saved, 64 given" in line and "--overwrite" in line
    assert "Traceback" not in changed.stderr
    assert {name: (run / name).read_bytes() for name in finished} == finished

    # More epochs train it further. Pretend epoch 0 had been far better: the continued run must
    # keep that checkpoint rather than the best of its own epochs.
    rows = history(run)
    rows[0]["val_loss"] = "0.001"
    with open(run / "history.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    longer = cli_here("train", *FINISHED_RUN, "--epochs", 5, "--out", run)
    assert "Epoch 5/5" in longer.stdout and "Epoch 4/5" not in longer.stdout
    assert [row["epoch"] for row in history(run)] == ["0", "1", "2", "3", "4"]
    assert (run / "checkpoints/best.weights.h5").read_bytes() == finished["checkpoints/best.weights.h5"]

    # --overwrite starts over, and leaves the user's own files alone.
    (run / "notes.txt").write_text("mine")
    cli_here("train", *SMALL_RUN, "--epochs", 1, "--out", run, "--overwrite")
    assert [row["epoch"] for row in history(run)] == ["0"]
    assert (run / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_a_failed_start_can_be_corrected_and_a_foreign_directory_is_refused(tmp_path):
    run = tmp_path / "run"
    pairs = tmp_path / "pairs.tsv"
    failed = cli_here("train", *SMALL_RUN[2:], "--dataset", "files", "--train-tsv", pairs, "--out", run, check=False)
    assert failed.returncode == 2 and (run / "config.json").exists()
    pairs.write_text("".join(f"ein hund {i}\ta dog {i}\n" for i in range(200)), encoding="utf-8")
    cli_here("train", *SMALL_RUN[2:], "--dataset", "files", "--train-tsv", pairs, "--epochs", 1, "--out", run)
    assert [row["epoch"] for row in history(run)] == ["0"]

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    refused = cli_here("train", *SMALL_RUN, "--epochs", 1, "--out", mine, check=False)
    assert refused.returncode == 2 and "is not a run directory" in refused.stderr
    assert sorted(path.name for path in mine.iterdir()) == ["thesis.tex"]


# -- damaged and crafted files ---------------------------------------------------


@pytest.fixture(scope="module")
def trained(finished_run, tmp_path_factory):
    """A finished tiny run and its export, to be copied and damaged by each test."""
    export = tmp_path_factory.mktemp("damaged") / "export"
    translation.export(str(finished_run), str(export))
    return finished_run, export / "1"


def truncate(path):
    content = path.read_bytes()
    path.write_bytes(content[: len(content) // 2])


def truncate_weights_inside(archive):
    with zipfile.ZipFile(archive) as original:
        parts = {name: original.read(name) for name in original.namelist()}
    parts["model.weights.h5"] = parts["model.weights.h5"][: len(parts["model.weights.h5"]) // 2]
    with zipfile.ZipFile(archive, "w") as rewritten:
        for name, content in parts.items():
            rewritten.writestr(name, content)


def carry_code(archive, activation):
    import json

    with zipfile.ZipFile(archive) as original:
        parts = {name: original.read(name) for name in original.namelist()}
    config = json.loads(parts["config.json"])
    config["config"]["activation"] = activation
    parts["config.json"] = json.dumps(config)
    with zipfile.ZipFile(archive, "w") as rewritten:
        for name, content in parts.items():
            rewritten.writestr(name, content)


LAMBDA = {"class_name": "__lambda__", "config": {"value": ["4wEAAAAAAAAA", None, None]}}
FOREIGN = {"module": "os", "class_name": "system", "config": None, "registered_name": "system"}

DAMAGES = {
    "truncated model.keras": ("model.keras", truncate, "is not a Keras model archive"),
    "garbage model.keras": ("model.keras", lambda path: path.write_bytes(b"not a model " * 50), "is not a Keras model archive"),
    "truncated weights inside model.keras": ("model.keras", truncate_weights_inside, "its weights cannot be read"),
    "a lambda in model.keras": ("model.keras", lambda path: carry_code(path, LAMBDA), "refused as unsafe: its config carries code (a lambda"),
    "a foreign class in model.keras": ("model.keras", lambda path: carry_code(path, FOREIGN), "refused as unsafe: its config carries code (os.system)"),
    "broken config.json": ("config.json", lambda path: path.write_text('{"data": {'), "config.json is not valid JSON"),
    "broken tokenizer.json": ("vocab/source/tokenizer.json", truncate, "tokenizer.json is not valid JSON"),
}


def run_command(*arguments, capsys):
    """`keras-transformer ARGUMENTS` in this process: its exit status and its stderr lines."""
    status = command_line.main([str(argument) for argument in arguments])
    return status, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def assert_one_line_naming(status, lines, path, problem):
    assert status == 2, lines
    assert len(lines) == 1, lines
    assert lines[0].startswith("keras-transformer: error: ") and str(path) in lines[0] and problem in lines[0], lines


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_every_command_names_a_damaged_file_in_one_line(damage, trained, tmp_path, capsys):
    source_run, _ = trained
    run = tmp_path / "run"
    shutil.copytree(source_run, run)
    name, spoil, problem = DAMAGES[damage]
    spoil(run / name)
    commands = [
        ("translate", run, "Der Hund schläft."),
        ("evaluate", run, "--beam-size", 1),
        ("export", run, tmp_path / "export"),
        ("plot-attention", run, "Der Hund schläft.", "--out", tmp_path / "attention.png"),
    ]
    if name == "config.json":
        commands.append(("train", *SMALL_RUN, "--out", run))
    for command in commands:
        status, lines = run_command(*command, capsys=capsys)
        assert_one_line_naming(status, lines, run / name, problem)
    assert not (tmp_path / "export").exists() and not (tmp_path / "attention.png").exists()


@pytest.mark.slow
def test_a_damaged_checkpoint_backup_or_export_is_named_in_one_line(trained, tmp_path, capsys):
    source_run, version = trained
    # A run still training has no model.keras: commands read its best checkpoint.
    run = tmp_path / "run"
    shutil.copytree(source_run, run)
    (run / "model.keras").unlink()
    truncate(run / "checkpoints" / "best.weights.h5")
    status, lines = run_command("translate", run, "Der Hund.", capsys=capsys)
    assert_one_line_naming(status, lines, run / "checkpoints" / "best.weights.h5", "is not a readable weights file")

    # A backup is replaced whole, so only a damaged disk damages it: a clear line.
    backup = run / "backup"
    state = json.loads((backup / "state.json").read_text())
    assert run_dir.RunState(str(run), translation.load_config(str(run))).epochs_done == state["epoch"]
    weights = backup / state["weights"]
    shutil.copyfile(weights, tmp_path / "whole.weights.h5")
    truncate(weights)
    status, lines = run_command("train", *SMALL_RUN, "--out", run, capsys=capsys)
    assert_one_line_naming(status, lines, weights, "is damaged")
    # A backup in the layout of Keras' BackupAndRestore (runs made before TrainingBackup) is read,
    # the copy Keras keeps of the one before taking the place of a damaged one.
    shutil.rmtree(backup)
    backup.mkdir()
    shutil.copyfile(tmp_path / "whole.weights.h5", backup / "latest.weights.h5.bkp")
    (backup / "training_metadata.json.bkp").write_text(json.dumps({"epoch": 1, "batch": 0}))
    (backup / "latest.weights.h5").write_bytes(b"half a file")
    (backup / "training_metadata.json").write_text(json.dumps({"epoch": 2, "batch": 0}))
    resumable = run_dir.RunState(str(run), translation.load_config(str(run)))
    assert (resumable.epochs_done, resumable.batches_done) == (1, 0)

    for part in ("saved_model.pb", "variables/variables.data-00000-of-00001"):
        export = tmp_path / part.split("/")[0] / "1"
        shutil.copytree(version, export)
        truncate(export / part)
        status, lines = run_command("translate", "--saved-model", export, "Der Hund.", capsys=capsys)
        assert_one_line_naming(status, lines, export, "is not a loadable SavedModel")


@pytest.mark.slow
def test_the_console_command_prints_one_line_for_a_damaged_model(trained, tmp_path):
    """The same through the installed entry point, in a process of its own: no traceback."""
    source_run, _ = trained
    run = tmp_path / "run"
    shutil.copytree(source_run, run)
    truncate(run / "model.keras")
    result = cli("translate", run, "Der Hund.", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("keras-transformer:")]
    assert str(run / "model.keras") in line


@pytest.mark.slow
def test_averaged_checkpoints_make_a_new_run_that_holds_their_mean(finished_run, tmp_path):
    import h5py
    import numpy as np

    run = finished_run
    kept = sorted(path.name for path in (run / "checkpoints").glob("epoch-*"))
    assert kept == ["epoch-002.weights.h5", "epoch-003.weights.h5", "epoch-004.weights.h5"]
    model_bytes = (run / "model.keras").read_bytes()

    averaged = tmp_path / "averaged"
    result = cli_here("average-checkpoints", run, "--out", averaged, "--last", 2)
    assert "epochs 3, 4" in result.stdout
    assert json.loads((averaged / "metrics.json").read_text())["averaged"]["epochs"] == [3, 4]
    # The new run's model holds the element-wise mean of the two files, weight by weight.
    def arrays(weights_file):
        with h5py.File(weights_file, "r") as file:
            found = {}
            file.visititems(lambda name, item: found.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None)
            return found

    with zipfile.ZipFile(averaged / "model.keras") as archive:
        archive.extract("model.weights.h5", tmp_path)
    mean_of = [arrays(run / "checkpoints" / name) for name in kept[1:]]
    got = arrays(tmp_path / "model.weights.h5")
    # (A checkpoint also holds the optimizer's state, which a model file does not.)
    assert len(got) > 4 and set(got) <= set(mean_of[0])
    for name, value in got.items():
        np.testing.assert_allclose(value, (mean_of[0][name] + mean_of[1][name]) / 2, rtol=1e-6, atol=1e-7)
    # It is a run like any other, and the run it came from is as it was.
    assert cli_here("translate", averaged, "der hund sieht eine katze .", "--beam-size", 1).stdout.strip()
    assert (run / "model.keras").read_bytes() == model_bytes

    # What cannot be done is refused in one line, and nothing is written.
    refusals = {
        "already exists": ("average-checkpoints", run, "--out", averaged),
        "between 1 and 3": ("average-checkpoints", run, "--out", tmp_path / "more", "--last", 4),
        "kept no epoch checkpoints": ("average-checkpoints", averaged, "--out", tmp_path / "again"),
    }
    for reason, arguments in refusals.items():
        refused = cli_here(*arguments, check=False)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        (line,) = [line for line in refused.stderr.splitlines() if line.startswith("keras-transformer:")]
        assert reason in line
    assert not (tmp_path / "more").exists() and not (tmp_path / "again").exists()
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".incomplete")]


def test_a_model_loads_its_large_weights_a_block_of_rows_at_a_time_exactly(monkeypatch, tmp_path):
    """Large weights go from the file into their variables in blocks of rows (the load's memory): the same numbers."""
    import numpy as np

    from keras_transformer import models, saving

    monkeypatch.setattr(saving, "_BY_ROWS_FROM_BYTES", 1024)  # every weight of a tiny model counts as large
    monkeypatch.setattr(saving, "ROWS_AT_ONCE", 3)  # and comes in several blocks
    by_rows = []
    assign_to = saving._StoredRows.assign_to
    monkeypatch.setattr(saving._StoredRows, "assign_to",
                        lambda self, *args: by_rows.append(self.dataset.shape) or assign_to(self, *args))
    model = models.Transformer(src_vocab_size=50, tgt_vocab_size=40, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                               max_length=20)
    model.build(((None, None), (None, None)))
    generator = np.random.default_rng(0)
    for variable in model.weights:  # not the initializers' numbers
        variable.assign(generator.normal(size=variable.shape).astype(np.float32))
    saving.save_model(model, str(tmp_path / "model.keras"))
    loaded = saving.load_model(str(tmp_path / "model.keras"))
    assert (50, 16) in by_rows and len(by_rows) > 5
    for ours, back in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(ours.numpy(), back.numpy(), err_msg=ours.path)
