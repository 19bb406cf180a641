"""Where and in what precision training runs: strategies and dtype policies.

`MirroredStrategy` copies the model to every device, splits each batch
between them and sums the gradients. On a machine without GPUs,
`split_cpu(n)` divides the CPU into n logical devices first, so the same
code path runs (and is tested) anywhere. It must run before TensorFlow
initialises its devices, that is before the first tensor is made.
"""

import functools

import tensorflow as tf

import keras

STRATEGIES = ("auto", "mirrored", "none")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")


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


def make_strategy(name="auto", cpu_replicas=None):
    """A `tf.distribute` strategy by name.

    "auto": MirroredStrategy over all GPUs when there are several, else the
    default (one device); with `cpu_replicas`, mirrored over that many CPU
    devices. "mirrored": MirroredStrategy over the GPUs, or the CPU devices.
    "none": the default strategy.
    """
    if name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {name!r}")
    if cpu_replicas:
        split_cpu(cpu_replicas)
    if name == "none":
        return tf.distribute.get_strategy()
    gpus = tf.config.list_logical_devices("GPU")
    if gpus and (name == "mirrored" or len(gpus) > 1):
        return mirrored_strategy(tuple(gpu.name for gpu in gpus))
    cpus = tf.config.list_logical_devices("CPU")
    if name == "mirrored" or len(cpus) > 1:
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


def set_precision(policy="float32"):
    """Set the global Keras dtype policy (before building the model)."""
    if policy not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {policy!r}")
    keras.config.set_dtype_policy(policy)
