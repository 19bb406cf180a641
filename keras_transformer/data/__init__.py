"""Corpora and tf.data pipelines: pairs of strings in, batches of ids out.

Nothing here knows the model; tokenizers come from `keras_transformer.text`.
"""

from keras_transformer.data.corpora import (
    CorpusError,
    load_multi30k,
    multi30k_directory,
    read_lines,
    read_parallel_files,
    read_tsv,
)
from keras_transformer.data.demo import demo_corpus
from keras_transformer.data.pipeline import TranslationBatches, make_translation_batches

__all__ = [
    "CorpusError",
    "TranslationBatches",
    "demo_corpus",
    "load_multi30k",
    "make_translation_batches",
    "multi30k_directory",
    "read_lines",
    "read_parallel_files",
    "read_tsv",
]
