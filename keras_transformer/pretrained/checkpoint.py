"""Reading and writing a Hugging Face checkpoint directory: its settings and its weights, as NumPy.

A directory as `save_pretrained` writes it:

    config.json               the architecture (`model_type` names the family)
    generation_config.json    how it decodes (optional: config.json then says it)
    model.safetensors         the weights, read with safetensors' NumPy API (no PyTorch)
      or model.safetensors.index.json and its shards
      or pytorch_model.bin    the older format: a pickle only PyTorch reads
    tokenizer files           per family (Marian: source.spm, target.spm, vocab.json)

Every refusal here is a `CheckpointError`, one line naming the file or the
setting, raised before anything is written.
"""

import json
import os
import shutil
import struct

import ml_dtypes  # noqa: F401  (gives NumPy the bfloat16 dtype, so safetensors can hand such tensors over)
import numpy as np

from keras_transformer.saving import first_line

CONFIG, GENERATION_CONFIG = "config.json", "generation_config.json"
# Files every family's tokenizer may have beside its own (`save_pretrained` writes them).
SPECIAL_TOKENS_MAP, ADDED_TOKENS = "special_tokens_map.json", "added_tokens.json"
SAFETENSORS, SAFETENSORS_INDEX, PYTORCH_BIN = "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"


class CheckpointError(ValueError):
    """A checkpoint directory this package cannot read or cannot express; the message is one line."""


def read_json_file(directory, name, required=True):
    """`directory/name` as a dict; `{}` for a missing optional file."""
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        if required:
            raise CheckpointError(f"{directory} is not a Hugging Face checkpoint directory: it has no {name}")
        return {}
    try:
        with open(path, encoding="utf-8") as file:
            content = json.load(file)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path} is not valid JSON ({error})") from None
    if not isinstance(content, dict):
        raise CheckpointError(f"{path} holds a JSON {type(content).__name__}, not an object")
    return content


def read_config(directory):
    if not os.path.isdir(directory):
        raise CheckpointError(f"no checkpoint directory {directory}")
    return read_json_file(directory, CONFIG)


def generation_settings(directory, config):
    """How the checkpoint decodes: `generation_config.json` when there is one, else the same keys of `config.json`.

    This is what Hugging Face's `generate` reads (`GenerationConfig.from_model_config`
    for a checkpoint saved before generation configs existed).
    """
    generation = read_json_file(directory, GENERATION_CONFIG, required=False)
    return generation if generation else dict(config)


def weights_file(directory):
    """The weights file `read_weights` will read (refused in one line when there is none)."""
    for name in (SAFETENSORS, SAFETENSORS_INDEX, PYTORCH_BIN):
        if os.path.exists(os.path.join(directory, name)):
            return name
    raise CheckpointError(f"{directory} has no weights: neither {SAFETENSORS} nor {PYTORCH_BIN}")


def check_weights_readable(directory):
    """Refuse, before any work, a `pytorch_model.bin` without PyTorch to read it."""
    if weights_file(directory) == PYTORCH_BIN:
        try:
            import torch  # noqa: F401  (only: is it there?)
        except ImportError:
            raise CheckpointError(
                f"{os.path.join(directory, PYTORCH_BIN)} is a PyTorch pickle: install PyTorch to read it "
                "(pip install torch; the CPU build will do), or save the checkpoint as model.safetensors"
            ) from None


class LazyWeights:
    """`{name: float32 array}` over safetensors files, each tensor read from disk when asked for.

    Holding every tensor at once would double an import's memory (the
    checkpoint's arrays beside the model's variables); read one at a time,
    each is freed once copied into its variable. Each read opens its file
    anew: safetensors maps the whole file, and the pages a read touched
    would otherwise stay resident until the last tensor is read (another
    copy of the weights, by the end).
    """

    def __init__(self, files):
        from safetensors import safe_open

        self._files = {}
        for file in files:
            try:
                with safe_open(file, framework="np") as handle:
                    self._files.update({name: file for name in handle.keys()})
            except Exception as error:  # safetensors raises its own error types for damaged files
                raise CheckpointError(f"{file} cannot be read as safetensors ({first_line(error)})") from None

    def __contains__(self, name):
        return name in self._files

    def __getitem__(self, name):
        from safetensors import safe_open

        with safe_open(self._files[name], framework="np") as handle:
            return _widened(handle.get_tensor(name))

    def keys(self):
        return self._files.keys()

    def shape(self, name):
        from safetensors import safe_open

        with safe_open(self._files[name], framework="np") as handle:
            return tuple(handle.get_slice(name).get_shape())

    def row_blocks(self, name, rows_at_once):
        """`(first row, float32 rows)` of the tensor `name`, `rows_at_once` rows read from disk at a time.

        The largest tensor (an embedding table) is never whole in memory
        beside the variable it goes into.
        """
        from safetensors import safe_open

        rows = self.shape(name)[0]
        for start in range(0, rows, rows_at_once):
            with safe_open(self._files[name], framework="np") as handle:
                yield start, _widened(handle.get_slice(name)[start : min(start + rows_at_once, rows)])


def read_weights(directory):
    """`{name: float32 array}` of the checkpoint's tensors (float16 and bfloat16 ones widened), read lazily."""
    name = weights_file(directory)
    path = os.path.join(directory, name)
    if name == PYTORCH_BIN:
        check_weights_readable(directory)
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return {key: value.float().numpy() if value.is_floating_point() else value.numpy()
                for key, value in state.items()}
    files = [path]
    if name == SAFETENSORS_INDEX:
        index = read_json_file(directory, SAFETENSORS_INDEX)
        files = [os.path.join(directory, shard) for shard in sorted(set(index.get("weight_map", {}).values()))]
    return LazyWeights(files)


def _widened(array):
    """float16 and bfloat16 (NumPy's through ml_dtypes, which TensorFlow brings) as float32."""
    return array.astype(np.float32) if array.dtype.name in ("float16", "bfloat16") else array


# -- writing ---------------------------------------------------------------------------------------

# safetensors' names of the dtypes a checkpoint may be written in.
SAFETENSORS_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def checkpoint_dtype(config):
    """The dtype a checkpoint's `config.json` says its weights are stored in (float32 when it says none)."""
    dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    return dtype if dtype in SAFETENSORS_DTYPES else "float32"


def write_weights(path, tensors, dtype="float32"):
    """Write `model.safetensors`: `tensors()` yields `(name, float32 array)`, the same each time it is called.

    The file is an 8-byte header length, a JSON header (each tensor's dtype,
    shape and byte range, and `{"format": "pt"}`, which `from_pretrained`
    asks for), then the tensors' bytes. `tensors()` is called twice, once
    for the header and once for the bytes, so that only one tensor is in
    memory at a time beside the model (safetensors' own `save_file` would
    hold all of them).
    """
    numpy_dtype = np.dtype(dtype)  # bfloat16 is ml_dtypes'
    header, offset = {}, 0
    for name, array in tensors():
        if name in header:
            raise ValueError(f"two tensors named {name!r}")  # a wrong mapping, never a user's doing
        size = array.size * numpy_dtype.itemsize
        header[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(array.shape), "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = {"format": "pt"}
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # the tensors start 8-byte aligned, as safetensors writes them
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for name, array in tensors():
            # As bytes (a view, not a copy): the buffer protocol knows no bfloat16.
            file.write(np.ascontiguousarray(array.astype(numpy_dtype, copy=False)).reshape(-1).view(np.uint8))


def copy_files(from_directory, to_directory, names):
    """Copy those of `names` that `from_directory` has (a checkpoint's settings and tokenizer files)."""
    os.makedirs(to_directory, exist_ok=True)
    for name in names:
        if os.path.exists(os.path.join(from_directory, name)):
            shutil.copyfile(os.path.join(from_directory, name), os.path.join(to_directory, name))
