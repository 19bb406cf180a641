"""Run an `export --format litert` directory with the LiteRT runtime, as an app on a phone would.

    >>> from keras_transformer.on_device import LiteRTModel
    >>> LiteRTModel("exports/demo-litert").translate(["The dog sees the cat."])
    ['Der Hund sieht die Katze.']

The interpreter is `ai-edge-litert`'s (the `litert` extra). A file of
builtin operators (`--ops builtin`, `litert.json`'s `"ops"`) runs on it as
it is: the host's tokenizer libraries (`device_tokenizers`) turn texts into
the file's ids and its ids back into text, and nothing of TensorFlow or
Keras is needed. A text file (`--ops text`, the default) runs with
tensorflow-text's kernels registered (`tensorflow_text.tflite_registrar`).
TensorFlow's Python package is never imported here: the kernels' library is
loaded on its own, and it links TensorFlow's C++ framework library
(`libtensorflow_framework.so.2`), which is loaded too (about a tenth of what
importing TensorFlow costs). An Android app does the same with the
`Interpreter` of `com.google.ai.edge.litert` and tensorflow-text's ops
registered (docs/on-device.md).

Before a text goes in, it is made what the file expects (see
`export.litert`): valid UTF-8 (bad bytes replaced by U+FFFD) in Unicode NFC.
A request that is not a list of strings gets one `ValueError` line; the
interpreter serves the next request as before.
"""

import ctypes
import importlib.machinery
import importlib.util
import json
import os
import re
import sys
import unicodedata

import numpy as np

from keras_transformer import device_tokenizers
from keras_transformer.lines import Answers, answer_each, valid_text
from keras_transformer.startup import start_up_lines_dropped

# A LiteRT export's two files (`export.litert` writes them; this module imports no TensorFlow to read them).
MODEL_FILE, SETTINGS_FILE = "model.tflite", "litert.json"
# The texts a runner gives the file at once, unless the export says fewer (`translate`).
DEFAULT_BATCH_SIZE = 32


# tensorflow-text's registrar, under the name `import tensorflow_text` gives it: loaded once per process
# whoever loads it first (two copies of one pybind11 module corrupt the heap at exit).
_REGISTRAR = "tensorflow_text.core.pybinds.tflite_registrar"


def text_operator_registerers():
    """tensorflow-text's LiteRT kernels, as the functions that register them, loaded without TensorFlow's Python."""
    registrar = sys.modules.get(_REGISTRAR)
    if registrar is None:
        text_directory = os.path.dirname(importlib.util.find_spec("tensorflow_text").origin)
        tensorflow_directory = os.path.dirname(importlib.util.find_spec("tensorflow").origin)
        ctypes.CDLL(os.path.join(tensorflow_directory, "libtensorflow_framework.so.2"), mode=ctypes.RTLD_GLOBAL)
        binaries = os.path.join(text_directory, "core", "pybinds")
        ctypes.CDLL(os.path.join(binaries, "libpybinds_library_common.so"), mode=ctypes.RTLD_GLOBAL)
        path = os.path.join(binaries, "tflite_registrar.so")
        loader = importlib.machinery.ExtensionFileLoader(_REGISTRAR, path)
        registrar = importlib.util.module_from_spec(importlib.util.spec_from_file_location(_REGISTRAR, path,
                                                                                          loader=loader))
        loader.exec_module(registrar)
        sys.modules[_REGISTRAR] = registrar
    return [getattr(registrar, name) for name in dir(registrar) if name.startswith("Add")]


# Whether `keep_freed_memory_for_reuse` has told this process's malloc already.
_KEEPING_FREED_MEMORY = False


def keep_freed_memory_for_reuse():
    """Have the C library keep the memory it is given back, for the next allocation (glibc only; once per process).

    LiteRT frees the memory of a loop's body each time the loop ends, and
    re-plans a loop whose shapes change: a search in chunks of steps gives
    back and takes again tens of megabytes at every chunk. By default glibc
    hands large blocks back to the system, and the next chunk's first
    writes fault every page in again, zeroed: a quarter of beam search's
    time at batch 32 at OPUS-MT-base's size (docs/on-device.md). Kept in the
    heap, the same pages serve every chunk; the peak memory grew by a fifth there.
    It is set for the whole process and cannot be undone: a long-running
    process keeps its peak memory (`LiteRTModel(..., keep_freed_memory=False)`
    leaves malloc as it is).
    """
    global _KEEPING_FREED_MEMORY
    if _KEEPING_FREED_MEMORY or not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
        ctypes.CDLL(None).gnu_get_libc_version  # glibc: musl's mallopt does nothing
    except (OSError, AttributeError):
        return
    no_mmap_allocations, trim_threshold = -4, -1  # M_MMAP_MAX, M_TRIM_THRESHOLD in glibc's malloc.h
    mallopt(no_mmap_allocations, 0)
    mallopt(trim_threshold, 2**31 - 1)
    _KEEPING_FREED_MEMORY = True


def require_litert():
    try:
        import ai_edge_litert  # noqa: F401
    except ImportError:
        raise ImportError("the LiteRT runtime is an optional extra: pip install 'keras-transformer[litert]'") from None


class LiteRTModel:
    """A LiteRT export (a directory from `export --format litert`), ready to run.

    Args:
        directory: the export's directory.
        num_threads: the interpreter's CPU threads (default: all cores).
        keep_freed_memory: have glibc keep freed memory for reuse, for the
            whole process (`keep_freed_memory_for_reuse`: faster searches,
            a higher peak).
    """

    def __init__(self, directory, num_threads=None, keep_freed_memory=True):
        require_litert()
        model_path, settings_path = os.path.join(directory, MODEL_FILE), os.path.join(directory, SETTINGS_FILE)
        for path in (model_path, settings_path):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{directory} is not a LiteRT export: it has no {os.path.basename(path)}")
        with open(settings_path, encoding="utf-8") as file:
            self.settings = json.load(file)
        self.kind, self.ops = self.settings["kind"], self.settings.get("ops", "text")
        if keep_freed_memory:
            keep_freed_memory_for_reuse()
        with start_up_lines_dropped(_START_UP_NOISE):
            self.interpreter = _interpreter(model_path, self.ops, num_threads or os.cpu_count())
            self.tokenizers = {name: device_tokenizers.load(directory, recorded)
                               for name, recorded in self.settings.get("tokenizers", {}).items()}
            self._runner = self.interpreter.get_signature_runner("serving_default")
            self._generate = self.interpreter.get_signature_runner("generate") if self.kind == "language_model" else None
            # The delegate announces itself on the first run: one empty text, one token at most.
            if self._generate is None:
                self.run([""])
            else:
                self._answer(self._generate, _checked_texts([""]), seed=np.int32(0), temperature=np.float32(0),
                             top_k=np.int32(0), top_p=np.float32(1), max_new_tokens=np.int32(1))

    def run(self, texts, **inputs):
        """The signature's outputs for `texts` (a list of strings) and any other `inputs`, as NumPy arrays.

        A builtin file's outputs come with the text a text file gives
        (`translation`, `label`, `text`), written by the host's tokenizer.
        """
        return self._answer(self._runner, _checked_texts(texts), **inputs)

    def _answer(self, runner, texts, **inputs):
        """`runner`'s outputs; for an empty batch, empty outputs without running (LiteRT's kernels refuse one)."""
        if self.ops == "builtin":
            return self._answer_with_ids(runner, texts, **inputs)
        if len(texts):
            return runner(text=texts, **inputs)
        return _empty_outputs(runner)

    def _answer_with_ids(self, runner, texts, **inputs):
        """A builtin file's outputs for `texts`: the host tokenizes, the file searches, the host writes the text."""
        tokenizer = self.tokenizers.get("source") or self.tokenizers["text"]
        limit = self.settings.get("max_source_length") or self.settings["max_length"]
        # A prompt is continued from its last pieces; a text to translate or classify is read from its first.
        cut = (lambda row: row[-limit:]) if self.kind == "language_model" else (lambda row: row[:limit])
        rows = [cut(row) for row in tokenizer.pieces([text.decode("utf-8") for text in texts])]
        fixed_rows = self.settings.get("input_rows")  # a web page's file: inputs of one shape (`export.web`)
        pieces = np.zeros([len(rows), limit if fixed_rows else max([1, *map(len, rows)])], np.int32)
        for index, row in enumerate(rows):
            pieces[index, :len(row)] = row
        inputs = self._language_ids(inputs)
        if not len(rows):
            outputs = _empty_outputs(runner)
        elif fixed_rows:
            outputs = _run_in_fixed_rows(runner, fixed_rows, pieces=pieces, **inputs)
        else:
            outputs = runner(pieces=pieces, **inputs)
        if self.kind == "translation":
            target = self.tokenizers["target"]
            outputs["translation"] = _strings(target.text(row) for row in outputs["tokens"])
        elif self.kind == "classification":
            outputs["label"] = _strings(self.settings["labels"][index] for index in outputs["label_id"])
        else:
            outputs["text"] = _strings(tokenizer.text(row[:length]) for row, length in
                                       zip(outputs["tokens"], outputs["lengths"]))
        return outputs

    def _language_ids(self, inputs):
        """A builtin file's inputs: a request's language codes as the ids of their tokens, each side's own."""
        converted = {}
        for name, side in (("source_language", "source"), ("target_language", "target")):
            if name in inputs:
                codes = inputs.pop(name)
                converted[f"{name}_id"] = np.array(
                    [self.tokenizers[side].language_id(code.decode("utf-8")) for code in codes], np.int32)
        return {**inputs, **converted}

    def translate(self, texts, batch_size=None, source_language=None, target_language=None):
        """Python strings in, translations out, in batches.

        `batch_size`: the sentences the file translates at once; default:
        the export's `sentences_per_run`, `DEFAULT_BATCH_SIZE` or, for a
        beam search on a large model, fewer (`export.litert.ROWS_PER_RUN`:
        16 at beam 4 at OPUS-MT-base's size).
        A multilingual export (M2M100, NLLB: `settings["languages"]`) takes
        `source_language` and `target_language`, each a code for every text
        or a list of one code per text; without them it translates the pair
        it was imported for.
        """
        self._require("translation", "translate")
        batch_size = _checked_batch_size(self.settings.get("sentences_per_run", DEFAULT_BATCH_SIZE)
                                         if batch_size is None else batch_size)
        if source_language is None and target_language is None:
            return answer_each(texts, lambda asked: self._translate_in_batches(self._runner, asked, batch_size), "")
        # Each text keeps its own codes, so every text goes in: the file answers a blank one "" itself.
        texts = _checked_texts(texts)
        codes = [self._language_codes(value, name, len(texts))
                 for name, value in (("source_language", source_language), ("target_language", target_language))]
        runner = self.interpreter.get_signature_runner("translate_between")
        return self._translate_in_batches(runner, texts, batch_size, source_language=codes[0],
                                          target_language=codes[1])

    def _translate_in_batches(self, runner, texts, batch_size, **codes):
        """`lines.Answers`: each text's translation, and those cut at the model's length in `truncated`."""
        texts = _checked_texts(texts)
        translations, truncated = [], {}
        for start in range(0, len(texts), batch_size):
            part = {name: value[start:start + batch_size] for name, value in codes.items()}
            outputs = self._answer(runner, texts[start:start + batch_size], **part)
            translations.extend(text.decode("utf-8") for text in outputs["translation"])
            for row in np.flatnonzero(outputs.get("truncated", [])):  # an export made before it says nothing
                truncated[start + int(row)] = self.settings.get("max_source_pieces")
        return Answers(translations, truncated)

    def _language_codes(self, codes, name, count):
        """`codes` (one for all texts, or one per text) as the file's input, or a one-line ValueError."""
        languages = self.settings.get("languages")
        if not languages:
            raise ValueError("this export translates the one language pair it was made for: it takes no "
                             "source_language or target_language")
        if codes is None:
            raise ValueError(f"{name} is missing: give both languages, or neither")
        codes = [codes] * count if isinstance(codes, str) else list(codes)
        if len(codes) != count:
            raise ValueError(f"{name} must be one code, or one code per text ({count}); got {len(codes)}")
        unknown = sorted({str(code) for code in codes if code not in languages})
        if unknown:
            raise ValueError(f"{name} must be a language code of this model ({len(languages)} codes: "
                             f"{', '.join(languages[:4])}, ...); got {', '.join(unknown[:4])}")
        return np.array([code.encode("utf-8") for code in codes], dtype=object).reshape([count])

    def classify(self, texts, batch_size=None):
        """`[(label, its probability)]`, one per text (as `keras-transformer classify` prints them).

        A blank text has nothing to classify: `(None, None)`, without running the file.
        `batch_size`: the texts the file classifies at once; default: `DEFAULT_BATCH_SIZE`.
        """
        self._require("classification", "classify")
        batch_size = _checked_batch_size(DEFAULT_BATCH_SIZE if batch_size is None else batch_size)

        def classify_in_batches(texts):
            results = []
            for batch in _batches(_checked_texts(texts), batch_size):
                outputs = self._answer(self._runner, batch)
                results.extend((label.decode("utf-8"), float(row.max()))
                               for label, row in zip(outputs["label"], outputs["probabilities"]))
            return results

        return answer_each(texts, classify_in_batches, (None, None))

    def generate(self, prompts, seed=0, temperature=None, top_k=None, top_p=None, max_new_tokens=None):
        """Each prompt continued: the whole texts, as `keras-transformer generate` prints them.

        Settings default to the export's (`litert.json`); `seed` makes the
        draws repeat. A setting out of range is refused in one line.
        """
        self._require("language_model", "generate")
        prompts = _checked_texts(prompts)
        settings = {name: self.settings[name] if value is None else value for name, value in
                    (("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                     ("max_new_tokens", max_new_tokens))}
        problem = _setting_problem(settings, self.settings["max_length"])
        if problem:
            raise ValueError(problem)
        inputs = {"seed": np.int32(seed), "temperature": np.float32(settings["temperature"]),
                  "top_k": np.int32(settings["top_k"]), "top_p": np.float32(settings["top_p"]),
                  "max_new_tokens": np.int32(settings["max_new_tokens"])}
        return [text.decode("utf-8") for batch in _batches(prompts, DEFAULT_BATCH_SIZE)
                for text in self._answer(self._generate, batch, **inputs)["text"]]

    def _require(self, kind, command):
        if self.kind != kind:
            raise ValueError(f"{command} needs a {kind} export; this one holds a {self.kind}")


# What the runtimes print while they start: TensorFlow's C++ library's logger preamble, INFO/WARNING
# lines and "failed call to cuInit" as it loads, and LiteRT's "INFO: Created TensorFlow Lite XNNPACK
# delegate for CPU." Any other line (an error) is passed on.
_START_UP_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\)|[IW]\d{4} |E\d{4} .*failed call to cuInit|INFO: Created "
    r"TensorFlow Lite XNNPACK delegate)"
)


def _interpreter(model_path, ops, num_threads):
    """LiteRT's interpreter of the file: stock for builtin operators, with tensorflow-text's kernels for text."""
    if ops == "builtin":
        from ai_edge_litert.interpreter import Interpreter

        return Interpreter(model_path=model_path, num_threads=num_threads)
    from ai_edge_litert.interpreter import InterpreterWithCustomOps

    return InterpreterWithCustomOps(model_path=model_path, custom_op_registerers=text_operator_registerers(),
                                    num_threads=num_threads)


def _run_in_fixed_rows(runner, fixed_rows, **inputs):
    """`runner`'s outputs for inputs of any number of rows, given to it `fixed_rows` at a time (0s after the last)."""
    count = len(inputs["pieces"])
    parts = []
    for start in range(0, count, fixed_rows):
        part = {name: value[start:start + fixed_rows] if np.ndim(value) else value for name, value in inputs.items()}
        missing = fixed_rows - len(part["pieces"])
        part = {name: np.pad(value, [(0, missing)] + [(0, 0)] * (np.ndim(value) - 1)) if np.ndim(value) else value
                for name, value in part.items()}
        parts.append(runner(**part))
    return {name: np.concatenate([part[name] for part in parts])[:count] for name in parts[0]}


def _empty_outputs(runner):
    """Each of `runner`'s outputs with no rows."""
    return {name: np.zeros([0, *detail["shape"][1:]], object if detail["dtype"] is np.bytes_ else detail["dtype"])
            for name, detail in runner.get_output_details().items()}


def _strings(texts):
    """Python strings as a text file answers them: a `[batch]` array of UTF-8 bytes."""
    encoded = [text.encode("utf-8") for text in texts]
    return np.array(encoded, dtype=object).reshape([len(encoded)])


def _setting_problem(settings, max_length):
    """What is wrong with sampling `settings` (the rules of `inference.generator.settings_rules`), or None."""
    if not settings["temperature"] >= 0:
        return "temperature must be >= 0"
    if settings["top_k"] < 0:
        return "top_k must be >= 0 (0: no limit)"
    if not 0 < settings["top_p"] <= 1:
        return "top_p must be in (0, 1] (1: no limit)"
    if not 1 <= settings["max_new_tokens"] < max_length:
        return f"max_new_tokens must be in [1, {max_length - 1}] (below the model's max_length {max_length})"
    return None


def _checked_texts(texts):
    """`texts` as the file's input: a string array of shape [batch], valid UTF-8 in NFC, or a one-line ValueError."""
    if isinstance(texts, (str, bytes)) or not hasattr(texts, "__iter__"):
        raise ValueError(f"texts must be a list of strings, got {type(texts).__name__}")
    checked = [unicodedata.normalize("NFC", valid_text(text)[0]).encode("utf-8") for text in texts]
    return np.array(checked, dtype=object).reshape([len(checked)])


def _checked_batch_size(batch_size):
    """`batch_size` if it is a whole number of texts, at least 1, or a one-line ValueError."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        shown = repr(batch_size) if isinstance(batch_size, (int, float, str, np.generic)) else type(batch_size).__name__
        raise ValueError(f"batch_size must be a whole number of texts, at least 1; got {shown}")
    return int(batch_size)


def _batches(texts, batch_size):
    """`texts` (a checked array) in slices of `batch_size`."""
    return [texts[start:start + batch_size] for start in range(0, len(texts), batch_size)]
