"""Text <-> token ids with tensorflow-text (no model knowledge here).

Two tokenizers behind one interface (`tokenize`, `detokenize`, `id_to_token`,
`vocab`, `pad_id`/`start_id`/`end_id`, `save`/`load`): our WordPiece, learned
from a corpus, and a pretrained checkpoint's own SentencePiece model.
"""

import os

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
from keras_transformer.text.sentencepiece import SentencePieceSettings, SentencePieceTokenizer
from keras_transformer.saving import read_json


def load_tokenizer(directory):
    """The tokenizer saved in `directory`, of whichever kind its `tokenizer.json` names (WordPiece when none)."""
    settings_path = os.path.join(directory, TOKENIZER_SETTINGS)
    if not os.path.exists(settings_path):
        raise FileNotFoundError(f"no tokenizer at {directory} (it has no {TOKENIZER_SETTINGS})")
    settings = read_json(settings_path)
    if settings.get("kind") == "sentencepiece":
        return SentencePieceTokenizer.load(directory, settings)
    return WordPieceTokenizer.load(directory)

__all__ = ["CLASSIFIER_TOKENS", "CLS", "MASK", "PRETRAINING_TOKENS", "TOKENIZER_SETTINGS", "VOCAB_FILE", "END", "PAD", "RESERVED_TOKENS", "START", "UNK", "WordPieceTokenizer", "SentencePieceSettings", "SentencePieceTokenizer", "load_tokenizer", "normalize"]
