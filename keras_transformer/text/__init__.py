"""Text <-> token ids with tensorflow-text (no model knowledge here)."""

from keras_transformer.text.tokenizer import (
    END,
    PAD,
    RESERVED_TOKENS,
    START,
    UNK,
    WordPieceTokenizer,
    normalize,
)

__all__ = ["END", "PAD", "RESERVED_TOKENS", "START", "UNK", "WordPieceTokenizer", "normalize"]
