"""Text <-> token ids with tensorflow-text (no model knowledge here)."""

from keras_transformer.text.tokenizer import (
    CLASSIFIER_TOKENS,
    MASK,
    PRETRAINING_TOKENS,
    CLS,
    TOKENIZER_SETTINGS,
    VOCAB_FILE,
    END,
    PAD,
    RESERVED_TOKENS,
    START,
    UNK,
    WordPieceTokenizer,
    normalize,
)

__all__ = ["CLASSIFIER_TOKENS", "CLS", "MASK", "PRETRAINING_TOKENS", "TOKENIZER_SETTINGS", "VOCAB_FILE", "END", "PAD", "RESERVED_TOKENS", "START", "UNK", "WordPieceTokenizer", "normalize"]
