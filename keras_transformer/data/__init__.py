"""Corpora and tf.data pipelines: pairs of strings in, batches of ids out.

Nothing here knows the model; tokenizers come from `keras_transformer.text`.
A corpus of any size streams from disk (`streaming`) and is tokenized once
into shards (`token_shards`) that the batches are read from (`pipeline`).
"""

from keras_transformer.data.corpora import (
    CorpusError,
    load_multi30k,
    multi30k_directory,
    multi30k_files,
    read_lines,
    read_parallel_files,
    read_tsv,
)
from keras_transformer.data.demo import demo_corpus
from keras_transformer.data.sentiment import (
    dataset_directory,
    hold_out,
    load_imdb,
    load_imdb_sentences,
    load_labelled_csv,
    load_sst2,
    read_labelled,
    sentence_pieces,
)
from keras_transformer.data.streaming import PairsInMemory, ParallelText, Split
from keras_transformer.data.token_shards import TokenShards, open_token_shards, tokenize_once
from keras_transformer.data.pipeline import (
    SHUFFLE_BUFFER,
    Batching,
    TranslationBatches,
    WorkerShare,
    count_batches,
    each_epoch,
    pair_counts,
    make_translation_batches,
    shuffle_each_epoch,
)
from keras_transformer.data.encoder_batches import (
    hidden_positions,
    make_classification_batches,
    make_pretraining_batches,
    mask_tokens,
)

__all__ = [
    "PairsInMemory",
    "ParallelText",
    "SHUFFLE_BUFFER",
    "Batching",
    "WorkerShare",
    "Split",
    "TokenShards",
    "count_batches",
    "pair_counts",
    "each_epoch",
    "multi30k_files",
    "open_token_shards",
    "tokenize_once",
    "CorpusError",
    "TranslationBatches",
    "dataset_directory",
    "demo_corpus",
    "hidden_positions",
    "hold_out",
    "load_imdb",
    "load_imdb_sentences",
    "load_labelled_csv",
    "load_sst2",
    "load_multi30k",
    "make_classification_batches",
    "make_pretraining_batches",
    "make_translation_batches",
    "mask_tokens",
    "shuffle_each_epoch",
    "multi30k_directory",
    "read_labelled",
    "sentence_pieces",
    "read_lines",
    "read_parallel_files",
    "read_tsv",
]
