"""A builtin file's tokenizers, written in the host libraries' formats and checked against the run's own.

A LiteRT file of builtin operators takes and gives ids (`signatures`, with
`ops="builtin"`): each side's tokenizer goes beside it, read on the device
by `keras_transformer.device_tokenizers` (Hugging Face's `tokenizers` for a
WordPiece vocabulary, the `sentencepiece` package for a SentencePiece
model). Before anything is written, the host library tokenizes held-out
text (the run's validation text, and `text.PROBE_SENTENCES`) and decodes
the run's ids of it: a sentence on which it differs from the run's own
tokenizer refuses the export, naming it.
"""

import os

import tensorflow as tf

from keras_transformer import device_tokenizers
from keras_transformer.export.litert.text import PROBE_SENTENCES
from keras_transformer.saving import write_json
from keras_transformer.text import SentencePieceTokenizer, WordPieceTokenizer

# How many differing sentences a refusal quotes.
_QUOTED = 3


def write_checked_tokenizers(tokenizers, export_dir, held_out_texts):
    """Write each of `tokenizers` (`{name: tokenizer}`) into `export_dir/name` and check it; their `litert.json` entries.

    Each is checked on its `held_out_texts[name]` and `PROBE_SENTENCES`:
    a one-line ValueError where its host library reads one otherwise.
    """
    written = {name: write_tokenizer(tokenizer, export_dir, name) for name, tokenizer in tokenizers.items()}
    for name, tokenizer in tokenizers.items():
        texts = list(held_out_texts.get(name, ())) + PROBE_SENTENCES
        check_tokenizer(tokenizer, export_dir, written[name], texts, name)
    return written


def write_tokenizer(tokenizer, export_dir, name):
    """Write `tokenizer` into `export_dir/name` in its host library's format; returns its `litert.json` entry."""
    directory = os.path.join(export_dir, name)
    if isinstance(tokenizer, WordPieceTokenizer):
        os.makedirs(directory)
        write_json(os.path.join(directory, "tokenizer.json"), tokenizer.hugging_face_json())
        kind = "wordpiece"
    elif isinstance(tokenizer, SentencePieceTokenizer):
        tokenizer.save(directory)  # the .model file(s), vocab.json (the id mapping) and tokenizer.json
        kind = "sentencepiece"
    else:
        raise ValueError(f"a builtin LiteRT file has no host tokenizer for a {type(tokenizer).__name__}")
    return {"kind": kind, "directory": name, "dropped_ids": [int(index) for index in tokenizer.dropped_ids]}


def check_tokenizer(tokenizer, export_dir, recorded, texts, side):
    """A one-line ValueError unless the host library reads `texts` as `tokenizer` does, and writes its ids back alike.

    `recorded`: what `write_tokenizer` returned; `side`: how the refusal
    names the tokenizer ("source", "target", "text").
    """
    device = device_tokenizers.load(export_dir, recorded)
    texts = list(texts)
    ours = tokenizer.tokenize(tf.constant(texts, tf.string), add_start_end=False).to_list()
    written = [value.decode("utf-8") for value in tokenizer.detokenize(tf.ragged.constant(ours, tf.int32,
                                                                                           ragged_rank=1)).numpy()]
    # A sentence differs where the library's ids differ, or its text of the run's ids does.
    differ = [text for text, ids, host_ids, expected in zip(texts, ours, device.pieces(texts), written)
              if host_ids != ids or device.text(ids) != expected]
    if differ:
        quoted = "; ".join(repr(text[:60]) for text in differ[:_QUOTED])
        raise ValueError(f"the {side} tokenizer's host library reads {len(differ)} of {len(texts)} held-out "
                         f"sentences otherwise than the run (e.g. {quoted}): export --ops text instead")
