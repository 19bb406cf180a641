"""Which precision to train in: the one the hardware runs fastest, chosen once per run.

Mixed precision (Micikevicius et al. 2018) keeps the weights in float32 and
computes in a 16-bit type. Which 16-bit type, if any, pays depends on the
chip:

* GPUs from Ampere on (compute capability 8.0 and up) multiply bfloat16 at
  full speed, and bfloat16 has float32's exponent range: `mixed_bfloat16`.
* Older GPUs have float16 tensor cores but no fast bfloat16:
  `mixed_float16`, with dynamic loss scaling so that small gradients do not
  underflow float16's range (Keras wraps the optimizer in a
  `LossScaleOptimizer` when it compiles the model).
* CPUs with native bfloat16 (AVX-512 BF16 or AMX; the `avx512_bf16` or
  `amx_bf16` flags of /proc/cpuinfo): `mixed_bfloat16`.
* Every other CPU emulates bfloat16 in float32 arithmetic, 1.5-2x slower
  than plain `float32`, which is then the choice.

`--precision auto` (the default) asks `choose_precision`; an explicit
precision always wins.
"""

AUTO = "auto"
PRECISIONS = (AUTO, "float32", "mixed_float16", "mixed_bfloat16")
NATIVE_BFLOAT16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# Ampere (A100, compute capability 8.0) is the first GPU with fast bfloat16.
BFLOAT16_GPU_CAPABILITY = (8, 0)


def cpu_flags(cpuinfo="/proc/cpuinfo"):
    """The CPU's feature flags (a set of names), or an empty set where /proc/cpuinfo is not there."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as file:
            for line in file:
                if line.startswith(("flags", "Features")):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def gpu_capabilities():
    """The compute capability `(major, minor)` of each GPU TensorFlow sees."""
    import tensorflow as tf

    capabilities = []
    for gpu in tf.config.list_physical_devices("GPU"):
        capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
        capabilities.append(tuple(capability) if capability else (0, 0))
    return capabilities


def choose_precision(requested=AUTO, flags=None, gpus=None):
    """`(policy, reason)`: `requested` itself unless it is "auto", else the hardware's fastest.

    Args:
        requested: one of `PRECISIONS`.
        flags: the CPU's feature flags (default: read from /proc/cpuinfo).
        gpus: each GPU's compute capability (default: those TensorFlow sees).

    Example:
    >>> choose_precision("auto", flags={"avx2"}, gpus=[])
    ('float32', 'the CPU has no native bfloat16 (no avx512_bf16 or amx_bf16 flag), where bfloat16 is emulated')
    """
    if requested not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {requested!r}")
    if requested != AUTO:
        return requested, "as asked"
    gpus = gpu_capabilities() if gpus is None else list(gpus)
    if gpus:
        oldest = min(gpus)
        name = f"compute capability {oldest[0]}.{oldest[1]}"
        if oldest >= BFLOAT16_GPU_CAPABILITY:
            return "mixed_bfloat16", f"{len(gpus)} GPU(s), {name}: bfloat16 at full speed (Ampere or newer)"
        return "mixed_float16", f"{len(gpus)} GPU(s), {name}: float16 tensor cores, no fast bfloat16 (older than Ampere)"
    flags = cpu_flags() if flags is None else set(flags)
    native = sorted(flag for flag in NATIVE_BFLOAT16_CPU_FLAGS if flag in flags)
    if native:
        return "mixed_bfloat16", f"the CPU has native bfloat16 ({', '.join(native)})"
    return "float32", "the CPU has no native bfloat16 (no avx512_bf16 or amx_bf16 flag), where bfloat16 is emulated"
