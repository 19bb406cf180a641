"""A run as one LiteRT file: on-device translation, classification and generation.

LiteRT (formerly TensorFlow Lite) is TensorFlow's runtime for phones,
browsers and small machines. `export_litert` writes a run into a new
directory, in one of two forms (`signatures.OPS`):

    OUT/model.tflite     text file: the tokenizer, the model, the search and the detokenizer;
                         builtin file: the framing, the model and the search (ids in, ids out)
    OUT/litert.json      what the file holds (its kind, ops, signature, settings, operators)
    OUT/source/, target/ (or text/): a builtin file's tokenizers, in their host libraries'
                         formats (`device_text`, read by `keras_transformer.device_tokenizers`)

A text file runs on LiteRT's builtin operators plus the tensorflow-text
kernels that `tensorflow_text.tflite_registrar` registers (the WordPiece and
SentencePiece tokenizers, splitting strings into bytes, joining strings); a
builtin file on LiteRT's builtin operators alone, so stock LiteRT runs it
with no TensorFlow on the device. Neither holds a TensorFlow ("Flex")
operator. `check_operators` reads the file's operator table and refuses
anything its form may not hold before OUT is written.

What changes on the way from the SavedModel (`export.translator`):

- the searches are traced with LiteRT's own `decoding.LiteRTDecoding`,
  handed to them explicitly: they run in chunks of `CHUNK_STEPS` steps on
  a self-attention cache in two parts (`cache.TwoPartCache`), written with
  LiteRT's `DYNAMIC_UPDATE_SLICE` and settled once a chunk, when it grows
  by a chunk: the searches' shapes change only between chunks, where they
  drop their finished sentences, so that LiteRT prepares a chunk's loop
  once and hands on, uncopied, what a step leaves alone (the settled
  cache: beam search reorders only the recent part within a chunk). Beam
  search's top-k is sized when the loop is prepared
  (`flatbuffer.top_k_sized_when_prepared`); the candidates come from
  blocks of logits and the log-softmax is spelled out in operators XNNPACK
  runs. The same translations.
- the text ops are the portable ones (`text.portable`): lowercasing from a
  table, the detokenizer's string join. Two things the SavedModel does to
  its input are left to the caller, since LiteRT has no kernel for them:
  Unicode NFC normalisation (text typed on a keyboard is NFC already; the
  runner in `keras_transformer.on_device` normalises, as an Android app does
  with `java.text.Normalizer`) and repairing invalid UTF-8 (the tokenizer
  reads a malformed byte as an unknown word).
- `quantization`: None (float32), "float16" (weights stored in half
  precision), or "int8" (dynamic-range, no calibration data: every weight
  matrix in int8 with a scale per channel, embeddings and output
  projection included; an embedding table looked up only, with one scale
  for the whole table; a tied one stored once, with a scale per row,
  `one_copy_of_each_table`), whose rows are looked up in int8 and
  scaled (`int8_lookups`). The model computes in float32 whatever
  precision it was trained in.

Three kinds of run, three services: `LiteRTTranslation` (`text` ->
`translation`, `score`, `truncated`), `LiteRTClassification` (`text` -> `label`,
`label_id`, `probabilities`) and `LiteRTGeneration` (`text` -> `text`,
`continuation`, `new_tokens`; and `generate` with sampling settings).
"""

from keras_transformer.export.litert.converter import QUANTIZATIONS, check_request, convert, export_litert
from keras_transformer.export.litert.flatbuffer import (
    TEXT_OPERATORS,
    check_operators,
    int8_lookups,
    one_copy_of_each_table,
    operators,
    top_k_sized_when_prepared,
)
from keras_transformer.export.litert.decoding import CHUNK_STEPS, LiteRTDecoding
from keras_transformer.export.litert.signatures import (
    CACHE_BYTES_PER_POSITION,
    ROWS_PER_RUN,
    SOURCE_LANGUAGE,
    TARGET_LANGUAGE,
    TEXT,
    LiteRTClassification,
    LiteRTGeneration,
    LiteRTService,
    LiteRTTranslation,
)
from keras_transformer.export.litert.text import BYTES_PER_POSITION, PROBE_SENTENCES, LiteRTTokenizer
from keras_transformer.on_device import DEFAULT_BATCH_SIZE, MODEL_FILE, SETTINGS_FILE  # what the runner reads

__all__ = [
    "BYTES_PER_POSITION", "CACHE_BYTES_PER_POSITION", "CHUNK_STEPS", "DEFAULT_BATCH_SIZE", "MODEL_FILE",
    "PROBE_SENTENCES", "QUANTIZATIONS", "ROWS_PER_RUN", "SETTINGS_FILE", "SOURCE_LANGUAGE", "TARGET_LANGUAGE",
    "TEXT", "TEXT_OPERATORS", "LiteRTClassification", "LiteRTDecoding", "LiteRTGeneration", "LiteRTService", "LiteRTTokenizer",
    "LiteRTTranslation", "check_operators", "check_request", "convert", "export_litert", "int8_lookups",
    "one_copy_of_each_table", "operators", "top_k_sized_when_prepared",
]
