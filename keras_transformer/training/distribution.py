"""Where and in what precision training runs: strategies and dtype policies.

`MirroredStrategy` copies the model to every device, splits each batch
between them and sums the gradients. On a machine without GPUs,
`split_cpu(n)` divides the CPU into n logical devices first, so the same
code path runs (and is tested) anywhere. It must run before TensorFlow
initialises its devices, that is before the first tensor is made.

`MultiWorkerMirroredStrategy` does the same across machines: every machine
runs the same program, told by the `TF_CONFIG` environment variable which
cluster it is part of and which task it is; the gradients are summed with
collective all-reduces over gRPC (NCCL between GPUs). Our models train
under it with `fit` (see `keras_transformer.models.multi_worker`).
"""

import functools
import json
import os
import random
import socket
import subprocess
import sys

import tensorflow as tf

import keras

from keras_transformer.training.precision import PRECISIONS, choose_precision  # noqa: F401 (PRECISIONS: re-exported)

STRATEGIES = ("auto", "mirrored", "multi-worker", "none")
# How long a worker waits for the rest of its cluster before giving up.
DEFAULT_CLUSTER_TIMEOUT = 300


def split_cpu(num_devices):
    """Make `num_devices` logical CPU devices (call before any TensorFlow op)."""
    if num_devices < 1:
        raise ValueError(f"cpu replicas must be at least 1, got {num_devices}")
    cpu = tf.config.list_physical_devices("CPU")[0]
    existing = tf.config.get_logical_device_configuration(cpu)
    if existing and len(existing) == num_devices:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(num_devices)]
        )
    except RuntimeError as error:
        raise RuntimeError(
            "TensorFlow is already initialised: split the CPU before creating any tensor"
        ) from error


def make_strategy(name="auto", cpu_replicas=None, cluster_timeout=None):
    """A `tf.distribute` strategy by name.

    "auto": MultiWorkerMirroredStrategy when `TF_CONFIG` names more than
    one task; else MirroredStrategy over all GPUs when there are several,
    else the default (one device); with `cpu_replicas`, mirrored over that
    many CPU devices. "mirrored": MirroredStrategy over the GPUs, or the CPU
    devices. "multi-worker": MultiWorkerMirroredStrategy over the cluster in
    `TF_CONFIG` (see `multi_worker_strategy`). "none": the default strategy.
    """
    if name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {name!r}")
    if cpu_replicas:
        split_cpu(cpu_replicas)
    if name == "multi-worker" or (name == "auto" and len(cluster_addresses()) > 1):
        return multi_worker_strategy(cluster_timeout or DEFAULT_CLUSTER_TIMEOUT)
    if name == "none":
        return tf.distribute.get_strategy()
    gpus = tf.config.list_logical_devices("GPU")
    if gpus and (name == "mirrored" or len(gpus) > 1):
        return mirrored_strategy(tuple(gpu.name for gpu in gpus))
    # Logical CPU devices share the same cores: mirroring over them is for trying a strategy out, never
    # faster, so "auto" does it only when `cpu_replicas` asks for replicas.
    cpus = tf.config.list_logical_devices("CPU")
    if name == "mirrored" or (cpu_replicas or 0) > 1:
        return mirrored_strategy(tuple(cpu.name for cpu in cpus))
    return tf.distribute.get_strategy()


@functools.lru_cache(maxsize=None)
def mirrored_strategy(devices):
    """One `MirroredStrategy` per set of devices for the whole process.

    Each MirroredStrategy numbers its collective all-reduces from the same
    start, so a second one over the same devices in one process (a second
    run, a notebook cell run twice) can issue an all-reduce whose key the
    first already used, and fails with "Shape mismatch in the collective
    instance". Sharing one object avoids that.
    """
    return tf.distribute.MirroredStrategy(list(devices))


def cluster_config():
    """`TF_CONFIG` as a dict (`{}` when it is not set); an error naming it when it is not valid JSON."""
    text = os.environ.get("TF_CONFIG", "").strip()
    if not text:
        return {}
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON: {error}") from None
    if not isinstance(config, dict):
        raise ValueError("TF_CONFIG must be a JSON object with 'cluster' and 'task'")
    return config


def cluster_addresses():
    """`[(task type, index, "host:port"), ...]` of every task in `TF_CONFIG`'s cluster."""
    cluster = cluster_config().get("cluster", {})
    return [(kind, index, address) for kind, addresses in cluster.items() for index, address in enumerate(addresses)]


def is_chief():
    """Whether this process is the cluster's chief: the one that writes (a "chief" task, else worker 0).

    True outside a cluster. TensorFlow's convention: the other workers write
    nothing where the chief writes.
    """
    config = cluster_config()
    if not config.get("cluster"):
        return True
    task = config.get("task", {})
    kind, index = task.get("type"), task.get("index", 0)
    if "chief" in config["cluster"]:
        return kind == "chief"
    return kind == "worker" and index == 0


def local_cluster(num_workers):
    """`TF_CONFIG` values (JSON strings) for `num_workers` workers on this machine, on free ports of 127.0.0.1.

    To try multi-worker training on one machine: run the same command in
    `num_workers` processes, the i-th with `TF_CONFIG=local_cluster(n)[i]`.

    The ports lie below the system's ephemeral range, from which outgoing
    connections take their local ports: a worker binds its port seconds
    later (after TensorFlow's start), and an ephemeral port free now could be
    some connection's by then.
    """
    lowest_ephemeral = _lowest_ephemeral_port()
    chooser = random.SystemRandom()
    addresses = []
    while len(addresses) < num_workers:
        port = chooser.randrange(10_000, lowest_ephemeral)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # someone's already
                continue
        if f"127.0.0.1:{port}" not in addresses:
            addresses.append(f"127.0.0.1:{port}")
    return [
        json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}})
        for index in range(num_workers)
    ]


def _lowest_ephemeral_port():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            lowest = int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        lowest = 32_768  # Linux's default
    return max(lowest, 11_000)  # room for a choice even where the range starts low


@functools.lru_cache(maxsize=None)
def multi_worker_strategy(timeout_seconds=DEFAULT_CLUSTER_TIMEOUT):
    """The process's `MultiWorkerMirroredStrategy` over the cluster in `TF_CONFIG`, within a time limit.

    Creating it waits for every task of the cluster to start, and a lost
    worker makes the others wait in their next all-reduce: both wait at
    most `timeout_seconds`. A later all-reduce that times out raises
    `DeadlineExceededError`. The wait while creating it happens inside
    TensorFlow, holding Python's interpreter lock, where no exception, signal
    handler or thread can reach it: a watchdog process ends this one then,
    with one line on stderr naming the tasks it was waiting for (and the
    exit status of a killed process, 137).
    """
    config = cluster_config()
    addresses = cluster_addresses()
    if not addresses or "task" not in config:
        raise ValueError("strategy multi-worker needs TF_CONFIG naming the cluster and this task")
    task = config["task"]
    me = (task.get("type"), task.get("index", 0))
    others = ", ".join(f"{kind} {index} at {address}" for kind, index, address in addresses if (kind, index) != me)
    message = (
        f"keras-transformer: error: {me[0]} {me[1]} could not reach the rest of the cluster in TF_CONFIG within "
        f"{timeout_seconds} s ({others}): is every worker started, with the same TF_CONFIG cluster?"
    )
    watchdog = subprocess.Popen(
        [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(timeout_seconds), message], stdin=subprocess.PIPE
    )
    try:
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout_seconds)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        # One all-reduce: every worker is there, and agrees on the cluster.
        strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
    finally:
        watchdog.stdin.close()  # stands it down
        watchdog.wait()
    return strategy


# The watchdog: waits for its standard input to close; if it is still open
# after the timeout, says why on stderr and kills the waiting process.
_WATCHDOG = """
import os, select, signal, sys
waiting, timeout, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
ready, _, _ = select.select([sys.stdin], [], [], timeout)
if not ready:
    sys.stderr.write(message + "\\n")
    sys.stderr.flush()
    os.kill(waiting, signal.SIGKILL)
"""


def set_precision(policy="float32"):
    """Set the global Keras dtype policy (before building the model); "auto" is chosen by `choose_precision`.

    Returns `(policy, reason)`: the policy set and why.
    """
    policy, reason = choose_precision(policy)
    keras.config.set_dtype_policy(policy)
    return policy, reason
