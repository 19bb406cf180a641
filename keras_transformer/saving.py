"""Reading a run's files back, with one clear sentence when a file cannot be trusted.

Files on disk get truncated (a full disk, a copy cut short), overwritten by
something else, or crafted. The libraries underneath answer such files with
errors that name the wrong thing: Keras calls a truncated `.keras` archive
"File not found", h5py raises `OSError: truncated file` from deep inside,
and Keras' safe mode, when it refuses a model whose config carries code,
only warns and hands back a model with most of its weights missing, which
then fails somewhere unrelated.

Each reader here checks what it reads and raises `DamagedFileError` (a
`ValueError`, so the CLI prints it as one line and exits with status 2)
naming the file and what is wrong with it. The writers write a whole new
file beside the old one and rename it into place, so a kill mid-write never
leaves half a file behind.
"""

import contextlib
import ctypes
import hashlib
import io
import json
import os
import shutil
import tempfile
import threading
import warnings
import zipfile

import h5py
import keras
import numpy as np

# The packages whose classes a model file of this project may name.
TRUSTED_PACKAGES = ("keras", "keras_transformer")


class DamagedFileError(ValueError):
    """A file exists but cannot be read as what it should be."""


def read_json(path):
    """The JSON object in `path`; a `DamagedFileError` naming the file if it is not valid JSON."""
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DamagedFileError(f"{path} is not valid JSON ({first_line(error)})") from None


def write_json(path, content):
    """Write `content` as JSON to `path`; a kill leaves the old file or the new one (`replace_whole`)."""

    def write(staging):
        with open(staging, "w", encoding="utf-8") as file:
            json.dump(content, file, indent=2, ensure_ascii=False)

    replace_whole(path, write)


def file_sha256(path):
    """The SHA-256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def save_model(model, path):
    """`model.save(path)`; a kill leaves the old file or the new one (`replace_whole`).

    The weights go through a file beside `path`, not through memory: Keras
    otherwise builds the whole weights file in memory before writing it into
    the archive, a second copy of every weight at once (saving an imported
    OPUS-MT-base model peaked 100 MiB lower without it). And each variable is
    copied into NumPy once, not twice (`_variables_copied_once`). The archive
    is the same.
    """
    with _weights_through_disk(), _variables_copied_once():
        replace_whole(path, model.save)


def release_freed_memory():
    """Hand memory the process has freed back to the system (glibc's `malloc_trim`; elsewhere nothing).

    glibc keeps freed blocks below its mmap threshold (TensorFlow's
    weights of a few MiB each) for reuse; a step that frees many before
    one that allocates as many keeps both in resident memory.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


@contextlib.contextmanager
def _weights_through_disk():
    """Make Keras' `.keras` writer take its low-memory road: the weights file on disk, then into the zip.

    Keras takes it by itself when memory is short (`is_memory_sufficient`);
    here it is taken always. Should a later Keras lack that function, the
    save works as Keras' own does.
    """
    from keras.src.saving import saving_lib

    chooses = getattr(saving_lib, "is_memory_sufficient", None)
    if chooses is None:
        yield
        return
    saving_lib.is_memory_sufficient = lambda model: False
    try:
        yield
    finally:
        saving_lib.is_memory_sufficient = chooses


# A weight at least this large goes from a weights file into its variable a block of rows at a time.
_BY_ROWS_FROM_BYTES = 16 * 2**20
ROWS_AT_ONCE = 8192  # 16 MiB of an embedding table at d_model 512
# Keras' classes are patched for the length of one load at a time (`_large_weights_read_by_rows`).
_PATCHING = threading.Lock()


def scatter_rows(variable, blocks):
    """Write `(first row, rows)` blocks into a TensorFlow-backed variable, scattered in.

    So that a large table is never whole in memory beside its variable: a
    sliced `assign` would read the variable first, and TensorFlow copies a
    variable that something else reads before writing into it.
    """
    import tensorflow as tf

    table = variable.value  # the backend's variable, which takes a scatter
    for start, rows in blocks:
        table.scatter_update(tf.IndexedSlices(rows, tf.range(start, start + rows.shape[0])))


class _StoredRows:
    """A weight in a weights file, for `Variable.assign`, read and written a block of rows at a time.

    Keras reads each weight whole (h5py's array) and `assign` converts it to
    a tensor (another copy) beside the variable: for an OPUS-MT-base
    embedding table, 226 MiB above the model's own at the load's peak.
    """

    def __init__(self, dataset):
        self.dataset = dataset

    def assign_to(self, variable, keras_assign):
        if tuple(variable.shape) != self.dataset.shape or np.dtype(variable.dtype) != self.dataset.dtype:
            return keras_assign(variable, np.asarray(self.dataset))  # Keras' own road, and its own refusals
        rows = self.dataset.shape[0]
        scatter_rows(variable, ((start, self.dataset[start : start + ROWS_AT_ONCE])
                                for start in range(0, rows, ROWS_AT_ONCE)))
        return variable


@contextlib.contextmanager
def _large_weights_read_by_rows():
    """Keras' weights reader (`H5IOStore`) hands large float32 weights to `assign` as `_StoredRows`.

    TensorFlow's backend only (others read as Keras does). A weight is
    looked up as Keras looks it up (`safe_get_h5_dataset`, which refuses
    links out of the file). Should a later Keras lack what this leans on,
    the load works as Keras' own does.
    """
    from keras.src.saving import saving_lib

    store = getattr(saving_lib, "H5IOStore", None)
    safe_dataset = getattr(saving_lib, "safe_get_h5_dataset", None)
    if keras.backend.backend() != "tensorflow" or store is None or safe_dataset is None:
        yield
        return

    with _PATCHING:
        keras_getitem, keras_assign = store.__getitem__, keras.Variable.assign
        own_assign = "assign" in vars(keras.Variable)  # else inherited, and put back by deleting ours

        def getitem(self, key):
            group = getattr(self, "_h5_entry_group", None)
            dataset = safe_dataset(group, key) if hasattr(group, "get") else None
            if (getattr(dataset, "ndim", 0) >= 1 and dataset.dtype == np.float32 and "dtype" not in dataset.attrs
                    and dataset.size * dataset.dtype.itemsize >= _BY_ROWS_FROM_BYTES):
                return _StoredRows(dataset)
            return keras_getitem(self, key)

        def assign(variable, value):
            if isinstance(value, _StoredRows):
                return value.assign_to(variable, keras_assign)
            return keras_assign(variable, value)

        store.__getitem__, keras.Variable.assign = getitem, assign
        try:
            yield
        finally:
            store.__getitem__ = keras_getitem
            if own_assign:
                keras.Variable.assign = keras_assign
            else:
                del keras.Variable.assign


class _CopiedOnce:
    """A variable that NumPy reads with one copy: `np.array(_CopiedOnce(variable))` is a read's array.

    Keras converts each variable with `np.array(variable)`, and TensorFlow
    answers that with two or three copies (a read, NumPy's copy of it, and a
    copy more for a table updated by rows, as `import-hf` writes the
    embeddings): for an OPUS-MT-base model's 107 MiB table, 100-200 MiB more
    at the save's peak. A tensor read from the variable is one copy, and its
    array a view of it; NumPy takes `__array__`'s answer as the copy it asked for.
    """

    def __init__(self, variable):
        self.variable = variable

    def __array__(self, dtype=None, copy=None):
        return variable_as_array(self.variable, dtype)


def variable_as_array(variable, dtype=None):
    """A variable's value as a NumPy array, copied once (`_CopiedOnce`: `variable.numpy()` may copy it twice or three times)."""
    value = variable
    if keras.backend.backend() == "tensorflow" and isinstance(value, keras.Variable):
        import tensorflow as tf

        value = tf.convert_to_tensor(value.value)
    return np.asarray(value, dtype)


@contextlib.contextmanager
def _variables_copied_once():
    """Keras' weights writer (`H5IOStore`, which converts with `np.array`) handed `_CopiedOnce` variables.

    Should a later Keras lack `H5IOStore`, the save works as Keras' own does.
    """
    from keras.src.saving import saving_lib

    store = getattr(saving_lib, "H5IOStore", None)
    if store is None:
        yield
        return
    keras_setitem = store.__setitem__
    store.__setitem__ = lambda self, key, value: keras_setitem(self, key, _CopiedOnce(value))
    try:
        yield
    finally:
        store.__setitem__ = keras_setitem


def replace_whole(path, write):
    """Call `write(staging_path)` on a file beside `path`, then rename it to `path`.

    A rename within a directory is atomic, so a reader (or a run killed
    mid-write) sees the old file or the new one, never half of one.
    """
    directory = os.path.dirname(os.path.abspath(path))
    # The whole suffix (".weights.h5", not ".h5"): Keras reads the file's kind from it.
    suffix = "." + os.path.basename(path).partition(".")[2]
    handle, staging = tempfile.mkstemp(prefix=".incomplete-", suffix=suffix, dir=directory)
    os.close(handle)
    try:
        write(staging)
        os.replace(staging, path)
    except BaseException:
        if os.path.exists(staging):
            os.remove(staging)
        raise


@contextlib.contextmanager
def directory_written_whole(path):
    """Yield a new directory beside `path`, renamed to `path` when the block ends, removed if it fails.

    A reader (TensorFlow Serving watching an export base, a user listing
    runs) sees no directory or the whole one, and a kill leaves only a
    hidden `.NAME-incomplete-*` behind, never half of `path`. The directory
    is readable by all (mkdtemp's 0700 would hide an export from a server
    running as another user).
    """
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(path))}-incomplete-", dir=parent)
    try:
        yield staging
        os.chmod(staging, 0o755)
        os.rename(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def load_model(path, dtype_policy=None):
    """The model saved in the `.keras` archive `path`, complete, or a `DamagedFileError`.

    Refuses an archive that is not a zip file, whose parts fail their
    checksums, whose config names code from outside Keras and this package
    (a `lambda`, or a class from another module: Keras' safe mode refuses to
    run those), or that loads only in part.

    `dtype_policy` (a Keras policy name: "float32", "mixed_bfloat16", ...)
    rebuilds the model under that policy instead of the one it was saved
    with: the same weights, computed in another type. A model trained in
    mixed precision keeps its weights in float32, so "float32" changes only
    the arithmetic. None keeps the saved policy.
    """
    archive = _open_archive(path)
    with archive:
        config = _archive_json(path, archive, "config.json")
        stored = _stored_weight_count(path, archive)
    code = _code_in_config(config)
    if code:
        raise DamagedFileError(
            f"{path} was refused as unsafe: its config carries code ({code}), which Keras' safe mode does not run"
        )
    rebuilt = None if dtype_policy is None else _with_dtype_policy(config, dtype_policy)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model = _load_with_config(path, config if rebuilt is None else rebuilt)
        except Exception as error:  # Keras and h5py raise many kinds; the message says which
            raise DamagedFileError(f"{path} could not be loaded: {first_line(error)}") from None
    loaded = len(model.weights)
    unbuilt = [layer.name for layer in model._flatten_layers() if not layer.built]
    if loaded != stored or unbuilt:
        reason = first_line(caught[0].message) if caught else f"layers left unbuilt: {', '.join(unbuilt[:3])}"
        raise DamagedFileError(
            f"{path} was loaded only in part ({loaded} of its {stored} weights): {reason}"
        )
    return model


# The policies a model of floating-point weights is saved with; `load_model(dtype_policy=...)` swaps them.
MIXED_POLICIES = ("mixed_float16", "mixed_bfloat16")
FLOAT_POLICIES = ("float32", "float16", "bfloat16", *MIXED_POLICIES)


def _with_dtype_policy(config, name):
    """`config` (a saved model's) with each floating-point dtype policy in it replaced by the policy `name`.

    A model of this package names its policy once, at its top (its layers
    take their parent's); Keras' own layers name theirs each (a mixed one
    as a plain string in configs of older Keras).
    """
    if isinstance(config, list):
        return [_with_dtype_policy(value, name) for value in config]
    if not isinstance(config, dict):
        return config
    policy = str(config.get("class_name", "")).endswith("DTypePolicy")
    if policy and config.get("config", {}).get("name") in FLOAT_POLICIES:
        return {**config, "config": {**config["config"], "name": name}}
    return {
        key: name if key == "dtype" and value in MIXED_POLICIES else _with_dtype_policy(value, name)
        for key, value in config.items()
    }


def _load_with_config(path, config):
    """The model of the archive `path` made from `config` (its own, or changed), with the archive's weights.

    What `keras.saving.load_model` does, in Keras' public calls: the model
    made from the config (safe mode; built by its `build_config`), then the
    weights, taken out of the archive first (as Keras does with a large
    model): read from the archive directly, h5py's small reads through
    the zip file make an OPUS-MT-sized model load 7x slower. Large weights
    go in a block of rows at a time (`_large_weights_read_by_rows`).
    """
    model = keras.saving.deserialize_keras_object({**config, "compile_config": None}, safe_mode=True)
    with zipfile.ZipFile(path) as archive, tempfile.TemporaryDirectory(prefix="keras-transformer-") as directory:
        weights = archive.extract("model.weights.h5", directory)
        with _large_weights_read_by_rows():
            model.load_weights(weights)
    return model


def load_weights(model, path):
    """Load the weights file `path` (`.weights.h5`) into `model`, or raise a `DamagedFileError`."""
    try:
        with h5py.File(path, "r"):
            pass
    except OSError as error:
        raise DamagedFileError(f"{path} is not a readable weights file ({first_line(error)})") from None
    try:
        with _large_weights_read_by_rows():
            model.load_weights(path)
    except Exception as error:  # a readable file whose contents do not fit the model
        raise DamagedFileError(f"{path} does not hold this model's weights ({first_line(error)})") from None


def average_weights(model, paths):
    """Put the mean of the weights files `paths` (`.weights.h5` of `model`) into `model`.

    Checkpoint averaging (the paper, section 6.1). Floating-point weights
    are averaged (in float64, then cast back); any other variable (a seed
    generator's state, a counter) takes the last file's value. Raises a
    `DamagedFileError` naming a file that does not hold this model's weights.
    """
    if not paths:
        raise ValueError("no weights files to average")
    sums = None
    for path in paths:
        load_weights(model, path)
        values = [keras.ops.convert_to_numpy(weight) for weight in model.weights]
        if sums is None:
            sums = [value.astype("float64") for value in values]
        else:
            for total, value in zip(sums, values):
                total += value
    for weight, total in zip(model.weights, sums):
        if keras.backend.is_float_dtype(weight.dtype):
            weight.assign((total / len(paths)).astype(weight.dtype))
    return model


def _open_archive(path):
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise DamagedFileError(
            f"{path} is not a Keras model archive (not a zip file: truncated, or overwritten by something else)"
        ) from None
    damaged = _first_damaged_member(archive)
    if damaged:
        archive.close()
        raise DamagedFileError(f"{path} is damaged: its part {damaged} fails its checksum (truncated or altered)")
    return archive


def _first_damaged_member(archive):
    try:
        return archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        return f"({first_line(error)})"


def _archive_json(path, archive, name):
    try:
        return json.loads(archive.read(name))
    except KeyError:
        raise DamagedFileError(f"{path} is not a Keras model archive: it has no {name}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DamagedFileError(f"{path} is damaged: its {name} is not valid JSON ({first_line(error)})") from None


def _stored_weight_count(path, archive):
    """How many weight arrays the archive's `model.weights.h5` holds for the model's layers."""
    try:
        weights = io.BytesIO(archive.read("model.weights.h5"))
    except KeyError:
        raise DamagedFileError(f"{path} is not a Keras model archive: it has no model.weights.h5") from None
    arrays = []
    try:
        with h5py.File(weights, "r") as file:
            file.visititems(lambda name, item: arrays.append(name) if isinstance(item, h5py.Dataset) else None)
    except OSError as error:
        raise DamagedFileError(f"{path} is damaged: its weights cannot be read ({first_line(error)})") from None
    # Optimizer state is saved beside the layers' weights; a model loaded
    # without compiling does not take it.
    return sum(1 for name in arrays if not name.startswith("optimizer/"))


def _code_in_config(config):
    """A description of the first piece of code the config would run, or None."""
    if isinstance(config, dict):
        if config.get("class_name") == "__lambda__":
            return "a lambda function"
        module = config.get("module")
        if isinstance(module, str) and module.split(".")[0] not in TRUSTED_PACKAGES:
            return f"{module}.{config.get('class_name')}"
        values = config.values()
    elif isinstance(config, list):
        values = config
    else:
        return None
    for value in values:
        found = _code_in_config(value)
        if found:
            return found
    return None


def first_line(error):
    """The first non-empty line of an error's message: libraries' messages run to many lines."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


__all__ = [
    "DamagedFileError", "first_line", "load_model", "load_weights", "read_json", "replace_whole", "save_model",
    "write_json",
]
