"""From a service to a LiteRT file on disk: `convert` (TensorFlow's converter, then `flatbuffer`'s rewrites), `export_litert`."""

import os
import shutil
import tempfile

import tensorflow as tf

from keras_transformer.export.versions import save_quietly
from keras_transformer.export.litert import device_text
from keras_transformer.export.litert.flatbuffer import (
    TEXT_OPERATORS,
    check_operators,
    int8_lookups,
    one_copy_of_each_table,
    operators,
    top_k_sized_when_prepared,
)
from keras_transformer.export.litert.signatures import check_ops
from keras_transformer.on_device import MODEL_FILE, SETTINGS_FILE  # what the runner reads
from keras_transformer.saving import directory_written_whole, write_json

QUANTIZATIONS = ("float16", "int8")


def check_request(out_dir, quantization, ops="text"):
    """A ValueError or FileExistsError for what `export_litert` would refuse: checked before any model is loaded."""
    check_ops(ops)
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS} (or none, for float32), got {quantization!r}")
    if os.path.exists(out_dir):
        raise FileExistsError(f"{out_dir} already exists: pick another directory or remove it first")


def convert(service, quantization=None):
    """The LiteRT file (bytes) of `service`'s signatures: builtin operators, and tensorflow-text's for `ops="text"`."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS} (or none, for float32), got {quantization!r}")
    with tempfile.TemporaryDirectory() as directory:
        save_quietly(service.root, directory, service.signatures())
        converter = tf.lite.TFLiteConverter.from_saved_model(directory, signature_keys=service.signature_keys())
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        converter.allow_custom_ops = service.ops == "text"  # tensorflow-text's kernels, checked by name below
        if quantization is not None:
            converter.optimizations = [tf.lite.Optimize.DEFAULT]  # without data: dynamic-range int8 weights
        if quantization == "float16":
            converter.target_spec.supported_types = [tf.float16]
        model = converter.convert()
    check_operators(model, allowed=TEXT_OPERATORS if service.ops == "text" else ())
    model = top_k_sized_when_prepared(model)
    return int8_lookups(one_copy_of_each_table(model)) if quantization == "int8" else model


def export_litert(service, out_dir, quantization=None, held_out_texts=None, beside=None):
    """Write `service` (e.g. `LiteRTTranslation`) into the new directory `out_dir`; returns `out_dir`.

    Converted into a temporary directory beside `out_dir` and renamed when
    whole: a failed conversion leaves nothing, and an existing `out_dir` is
    refused before any work. A builtin file (`service.ops`) gets its
    tokenizers beside it (`device_text`), each checked first on
    `held_out_texts` (`{name: texts}`, by `service.tokenizers()`'s names)
    and `text.PROBE_SENTENCES`. `beside(directory)` writes what else goes
    into it (a web page's files, `export.web`).
    """
    check_request(out_dir, quantization, service.ops)
    with tempfile.TemporaryDirectory() as checked:
        # A host tokenizer that reads otherwise refuses the export before the (long) conversion.
        tokenizers = (device_text.write_checked_tokenizers(service.tokenizers(), checked, held_out_texts or {})
                      if service.ops == "builtin" else {})
        model = convert(service, quantization)
        with directory_written_whole(out_dir) as partial:
            _write_litert(service, partial, model, quantization, tokenizers, checked)
            if beside is not None:
                beside(partial)
    return out_dir


def _write_litert(service, directory, model, quantization, tokenizers, tokenizers_dir):
    """The file, its tokenizers (from `tokenizers_dir`) and `litert.json`, into `directory`."""
    with open(os.path.join(directory, MODEL_FILE), "wb") as file:
        file.write(model)
    for name in tokenizers:
        shutil.copytree(os.path.join(tokenizers_dir, name), os.path.join(directory, name))
    signatures = service.signatures()
    write_json(os.path.join(directory, SETTINGS_FILE), {
        **service.settings(), "ops": service.ops, **({"tokenizers": tokenizers} if tokenizers else {}),
        **({"input_rows": service.fixed_rows} if service.fixed_rows else {}),
        "quantization": quantization or "float32", "operators": operators(model),
        "signature": {name: {"inputs": [spec.name for spec in function.structured_input_signature[0]],
                             "outputs": sorted(function.structured_outputs)}
                      for name, function in signatures.items()},
    })
