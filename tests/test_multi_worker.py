"""Training across machines, as worker processes on 127.0.0.1: `fit` under MultiWorkerMirroredStrategy.

Each worker is a real process told its cluster and task by `TF_CONFIG`,
talking gRPC to the others on free local ports.
"""

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import ENV, TINY_MODEL, assert_same_weights, cli_here
from keras_transformer.runs.run_dir import RUN_FILES
from keras_transformer.training.distribution import local_cluster

HERE = Path(__file__).parent


def cluster_environments(count, tmp_path):
    environments = []
    for index, config in enumerate(local_cluster(count)):
        # Each worker its own temporary folder, to see what it leaves behind.
        temporary = tmp_path / f"tmp-worker-{index}"
        temporary.mkdir(parents=True)
        environments.append({**ENV, "TF_CONFIG": config, "TMPDIR": str(temporary)})
    return environments


def run_workers(commands, environments, timeout=420):
    """Start one process per command (with its environment), wait for all; returns their results."""
    processes = [
        subprocess.Popen([str(part) for part in command], env=environment, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for command, environment in zip(commands, environments)
    ]
    results = []
    deadline = time.time() + timeout
    for process in processes:
        try:
            stdout, stderr = process.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise
        results.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    return results


def test_a_local_cluster_gets_free_ports_no_outgoing_connection_can_take_first():
    # A worker binds its port seconds after `local_cluster` chose it: a port from the ephemeral
    # range (outgoing connections' local ports) could be taken by then.
    lowest_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        configs = [json.loads(config) for config in local_cluster(3)]
        assert [config["task"] for config in configs] == [{"type": "worker", "index": index} for index in range(3)]
        addresses = configs[0]["cluster"]["worker"]
        assert all(config["cluster"]["worker"] == addresses for config in configs)
        ports = [int(address.removeprefix("127.0.0.1:")) for address in addresses]
        assert len(set(ports)) == 3 and all(port < lowest_ephemeral for port in ports), ports
        for port in ports:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", port))  # free


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """The fixed training run alone (here), then on two workers that next write the pairs their batches held.

    One cluster start for two checks (each worker process costs seconds of
    TensorFlow's start); returns the folder with `alone.npz`, `worker{0,1}.npz`,
    `worker{0,1}.json` and the shards' `run`.
    """
    from multi_worker_fit import train

    from keras_transformer.training import make_strategy

    folder = tmp_path_factory.mktemp("two-workers")
    script = HERE / "multi_worker_fit.py"
    weights, history = train(make_strategy("none"))  # one device
    np.savez(folder / "alone.npz", history=json.dumps(history), **weights)
    results = run_workers(
        [[sys.executable, script, folder / f"worker{index}.npz", "--strategy", "multi-worker",
          "--shards", folder / "run", folder / f"worker{index}.json"] for index in (0, 1)],
        cluster_environments(2, folder),
    )
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    return folder


@pytest.mark.slow
def test_two_workers_train_as_one_process_on_the_same_global_batches(two_workers):
    expected = np.load(two_workers / "alone.npz")
    for index in (0, 1):
        trained = np.load(two_workers / f"worker{index}.npz")
        assert_same_weights({name: trained[name] for name in trained.files if name != "history"},
                            {name: expected[name] for name in expected.files if name != "history"})
        # The logs are those of the global batches: the loss and accuracy one process reports.
        history, alone_history = json.loads(str(trained["history"])), json.loads(str(expected["history"]))
        for key, values in alone_history.items():
            np.testing.assert_allclose(history[key], values, rtol=1e-4, err_msg=key)


@pytest.mark.slow
def test_each_worker_reads_its_own_shards_and_an_epoch_sees_every_pair_once(two_workers):
    run = two_workers / "run"
    seen = [json.loads((two_workers / f"worker{index}.json").read_text()) for index in (0, 1)]
    assert seen[0]["steps"] == seen[1]["steps"] > 0, "every worker takes as many steps"
    from keras_transformer.data import TokenShards

    directory = run / "tokens" / "train"
    shards = TokenShards(str(directory), json.loads((directory / "manifest.json").read_text()))

    def pairs_of(shard_indices):
        # The shards hold [START] ... [END]; a batch's labels have no [START].
        return sorted((tuple(int(i) for i in source), tuple(int(i) for i in target[1:]))
                      for source, target in shards.dataset(shard_indices).as_numpy_iterator()
                      if max(len(source), len(target)) <= 24)

    # Worker w got the pairs of shards w, w + 2, ... and nothing else: together, the corpus once.
    for index, worker in enumerate(seen):
        assert sorted(tuple(map(tuple, pair)) for pair in worker["pairs"]) == pairs_of(range(index, shards.num_shards, 2))
    assert sum(len(worker["pairs"]) for worker in seen) == len(pairs_of(None)) > 250
    # That on a cluster's next start every worker reads the chief's shards is proved by the restart of
    # test_a_killed_worker_stops_the_chief_and_both_resume_from_the_last_backup.


@pytest.mark.slow
def test_a_worker_whose_cluster_never_comes_gives_up_with_one_line(tmp_path):
    environment = cluster_environments(2, tmp_path)[0]
    del environment["TF_CPP_MIN_LOG_LEVEL"]  # as a user runs it: quiet by itself
    started = time.time()
    result = run_workers(
        [[Path(sys.executable).with_name("keras-transformer"), "train", "--dataset", "demo", "--out",
          tmp_path / "run", "--strategy", "multi-worker", "--cluster-timeout", 3, "--epochs", 1]],
        [environment], timeout=120,
    )[0]
    # Killed by its watchdog (TensorFlow waits holding the interpreter lock).
    assert result.returncode == -9 and time.time() - started < 100
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "could not reach the rest of the cluster" in lines[0], result.stderr[-2000:]


def start_workers(command, environments):
    return [
        subprocess.Popen([str(part) for part in command], env=environment, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for environment in environments
    ]


def wait_for_backup(run, processes, condition, timeout=300):
    """The chief's backup state once `condition(state)` holds."""
    state_file = run / "backup" / "state.json"
    deadline = time.time() + timeout
    while time.time() < deadline and all(process.poll() is None for process in processes):
        state = json.loads(state_file.read_text()) if state_file.exists() else None
        if state and condition(state):
            return state
        time.sleep(0.1)
    for process in processes:
        process.kill()
    raise AssertionError("\n".join(f"worker {index}, status {process.wait()}: " + process.communicate()[1][-2000:]
                                   for index, process in enumerate(processes)))


def worker_training(run, epochs, *extra):
    """The `keras-transformer train` command each worker runs: a tiny model, a backup every 4 steps."""
    return [
        Path(sys.executable).with_name("keras-transformer"), "train", "--dataset", "demo", "--out", run,
        "--strategy", "multi-worker", "--epochs", epochs, "--steps-per-epoch", 20, "--limit-train", 600,
        "--limit-val", 16, "--vocab-size", 300, *TINY_MODEL, "--max-length", 24, "--tokens-per-batch", 512,
        "--no-evaluate",
        # Generous: a restarted worker's TensorFlow may take long to start on a busy machine.
        "--cluster-timeout", 45,
        "--save-every-steps", 4, *extra,
    ]


@pytest.mark.slow
def test_a_killed_worker_stops_the_chief_and_both_resume_from_the_last_backup(tmp_path):
    run = tmp_path / "run"
    command = worker_training(run, 1, "--bleu-samples", 0, "--attention-samples", 0)
    # kill -9 of a worker in the middle of the epoch, after a backup there.
    processes = start_workers(command, cluster_environments(2, tmp_path))
    killed_at = wait_for_backup(run, processes, lambda state: state["batches_done"] > 0)
    processes[1].kill()
    _, chief_errors = processes[0].communicate(timeout=180)  # the chief notices and stops
    processes[1].communicate()
    assert processes[0].returncode != 0
    lines = [line for line in chief_errors.splitlines() if line.startswith("keras-transformer: error")]
    assert lines and "worker" in lines[-1], chief_errors[-3000:]
    assert not (run / "model.keras").exists()
    # The chief tokenised the corpus into the run directory (the worker, maybe, into its private copy).
    assert f"shards ({run / 'tokens' / 'train'})" in chief_errors, chief_errors[-3000:]

    # Both restarted with the same command: they resume from that backup (the steps since it are
    # what the kill cost) and finish.
    chief, worker = run_workers([command, command], cluster_environments(2, tmp_path / "again"))
    assert chief.returncode == 0 and worker.returncode == 0, chief.stderr[-3000:] + worker.stderr[-3000:]
    resumed = f"resuming from the backup after batch {killed_at['batches_done']} of epoch 1"
    assert resumed in chief.stderr and resumed in worker.stderr, chief.stderr[-3000:]
    # On this next start neither tokenises: the worker, in a private copy made without shards (a new
    # TMPDIR), reads the chief's, which are intact.
    assert "tokenised" not in chief.stderr + worker.stderr, chief.stderr[-3000:] + worker.stderr[-3000:]
    history = (run / "history.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in history[1:]] == ["0"], history
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["training"]["epochs_done"] == 1 and metrics["training"]["replicas"] == 2

    # One writer: the chief's run directory, the worker's private copy gone; and the run translates.
    assert f"run directory: {run}" in chief.stdout and "the chief worker wrote" in worker.stdout
    assert set(os.listdir(run)) <= set(RUN_FILES)
    assert list((tmp_path / "again" / "tmp-worker-1").iterdir()) == [], "the worker removes its private copy"
    assert cli_here("translate", run, "The dog sleeps.").stdout.strip()


@pytest.mark.slow
def test_a_preempted_worker_makes_both_save_after_the_next_step_and_stop_with_one_line(tmp_path):
    run = tmp_path / "run"
    # Through the first epoch's end and its samples (BLEU and attention, which the chief alone
    # decodes), into the second.
    command = worker_training(run, 3, "--bleu-samples", 4, "--attention-samples", 1)
    processes = start_workers(command, cluster_environments(2, tmp_path))
    signalled_at = wait_for_backup(run, processes, lambda state: state["epoch"] == 1 and state["batches_done"] > 0)
    # SIGTERM to the worker alone (its machine is preempted): after the next step both save and
    # stop, each with one line and status 143; no one waits for the other.
    processes[1].terminate()
    last_lines = []
    for process in processes:
        _, errors = process.communicate(timeout=180)
        assert process.returncode == 143, errors[-3000:]
        last_lines.append(errors.rstrip().splitlines()[-1])
        assert last_lines[-1].startswith("keras-transformer: stopped by SIGTERM"), errors[-3000:]
    assert not (run / "model.keras").exists()
    assert list((tmp_path / "tmp-worker-1").iterdir()) == [], "the worker removes its private copy"
    # Both stopped at the same point, and the backup is that point: no step lost.
    stopped_at = json.loads((run / "backup" / "state.json").read_text())
    points = [stop_point(line) for line in last_lines]
    assert points[0] == points[1] == (stopped_at["epoch"], stopped_at["batches_done"]), (last_lines, stopped_at)
    assert points[0] > (signalled_at["epoch"], signalled_at["batches_done"])


def stop_point(line):
    """(epoch index, batches done) where a "stopped by SIGTERM" line says training stopped."""
    mid_epoch = re.search(r"after batch (\d+) of epoch (\d+)", line)
    if mid_epoch:
        return int(mid_epoch[2]) - 1, int(mid_epoch[1])
    return int(re.search(r"at the end of epoch (\d+)", line)[1]), 0
