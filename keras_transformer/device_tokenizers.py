"""A run's tokenizers as a device runs them: the host's own tokenizer libraries, no TensorFlow.

A LiteRT file of builtin operators (`export --format litert --ops builtin`)
takes ids and gives ids: the text around it is the host's to make, with the
library every platform has for it. The export writes each tokenizer in that
library's own format, and checks on held-out text that the library gives the
run's ids and text (`export.litert.device_text`):

- a WordPiece vocabulary as a Hugging Face `tokenizer.json`, read by the
  `tokenizers` package (and its JavaScript port): our NFC and lowercasing,
  the split at spaces, punctuation and CJK characters, the pieces, and our
  detokenization's spacing ("(the dog's T-shirt)") as its decoders;
- a SentencePiece model (a run's own or a checkpoint's) as its `.model`
  file, read by the `sentencepiece` package, with `vocab.json` (the
  checkpoint's pieces in id order: the id mapping) and `tokenizer.json`
  (how texts are split and ends trimmed: `text.SentencePieceSettings`).

Each side of a run is a directory of the export, named in `litert.json`
with the ids decoded text leaves out (`dropped_ids`): `load` reads it.
"""

import json
import os
import re

# A SentencePiece side's files (as `text.SentencePieceTokenizer.save` writes them).
_SENTENCEPIECE_MODEL, _SENTENCEPIECE_DECODE_MODEL = "sentencepiece.model", "sentencepiece-decode.model"
_VOCAB, _SETTINGS = "vocab.json", "tokenizer.json"
# What Python's `str.strip` removes after SentencePiece's decoding (`text.sentencepiece._Ends`).
_WHITESPACE = " \t\n\r\v\f"


def load(export_dir, recorded):
    """The tokenizer of one side: `recorded` is its entry in `litert.json` (`kind`, `directory`, `dropped_ids`)."""
    directory = os.path.join(export_dir, recorded["directory"])
    if recorded["kind"] == "wordpiece":
        return WordPieceOnDevice(directory, recorded["dropped_ids"])
    if recorded["kind"] == "sentencepiece":
        return SentencePieceOnDevice(directory, recorded["dropped_ids"])
    raise ValueError(f"{export_dir} names a tokenizer this version cannot read: {recorded['kind']!r}")


class WordPieceOnDevice:
    """A WordPiece vocabulary run by Hugging Face's `tokenizers` from the export's `tokenizer.json`.

    Args:
        directory: the side's directory (its `tokenizer.json`).
        dropped_ids: the ids decoded text leaves out ([PAD], [START], [END]).
    """

    def __init__(self, directory, dropped_ids):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ImportError("this export's tokenizer runs on Hugging Face's tokenizers: pip install tokenizers") from None
        self.tokenizer = Tokenizer.from_file(os.path.join(directory, _SETTINGS))
        self.dropped = frozenset(dropped_ids)

    def pieces(self, texts):
        """Each text's pieces' ids, unframed: what the file's `pieces` input holds."""
        return [encoding.ids for encoding in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def text(self, ids):
        """The text of a row of ids (what the file answers), the framing left out."""
        return self.tokenizer.decode([int(index) for index in ids if index not in self.dropped],
                                     skip_special_tokens=False)


class SentencePieceOnDevice:
    """A SentencePiece model run by the `sentencepiece` package, its pieces numbered by the checkpoint's vocabulary.

    What `text.SentencePieceTokenizer` does in TensorFlow, in Python: a
    multilingual Marian's `>>xx<<` code split off as a token of its own, the
    model's pieces (word by word where NLLB's tokenizer splits at spaces),
    each piece the id of its string in `vocab.json` (our ids: the
    checkpoint's + 1, 0 being padding), and decoded text joined from each
    token's surface with its ends trimmed as Hugging Face trims them.

    Args:
        directory: the side's directory (as `SentencePieceTokenizer.save` writes it).
        dropped_ids: the ids decoded text leaves out (framing, padding, <unk>).
    """

    def __init__(self, directory, dropped_ids):
        try:
            import sentencepiece
        except ImportError:
            raise ImportError("this export's tokenizer runs on SentencePiece: pip install sentencepiece") from None
        with open(os.path.join(directory, _SETTINGS), encoding="utf-8") as file:
            self.settings = json.load(file)
        with open(os.path.join(directory, _VOCAB), encoding="utf-8") as file:
            vocab = json.load(file)
        self.encoder = sentencepiece.SentencePieceProcessor(model_file=os.path.join(directory, _SENTENCEPIECE_MODEL))
        decode_path = os.path.join(directory, _SENTENCEPIECE_DECODE_MODEL)
        decoder = sentencepiece.SentencePieceProcessor(model_file=decode_path) if os.path.exists(decode_path) \
            else self.encoder
        self.ids = {piece: index + 1 for index, piece in enumerate(vocab)}  # our ids: 0 is padding
        self.unk_id = self.ids[self.settings["unk_token"]]
        self.dropped = frozenset(dropped_ids)
        self.surfaces = [""] + [surface.replace("\u2581", " ") for surface in _surfaces(vocab, decoder)]

    def language_id(self, code):
        """Our id of the token of the language `code` names ("fr", "fra_Latn"), as `translate_between` takes it."""
        return self.ids[self.settings["languages"][code]]

    def pieces(self, texts):
        """Each text's ids (a language code's, then its pieces'), unframed: what the file's `pieces` input holds."""
        return [self._pieces(text) for text in texts]

    def _pieces(self, text):
        code_ids = []
        if self.settings.get("language_code_prefix"):
            code = re.match(r"(?s)>>.*?<<", text)
            if code:
                code_ids, text = [self.ids.get(code.group(), self.unk_id)], text[code.end():]
        if self.settings.get("word_by_word"):
            pieces = self._word_by_word(text)
        else:
            pieces = self.encoder.encode(text, out_type=str)
        return code_ids + [self.ids.get(piece, self.unk_id) for piece in pieces]

    def _word_by_word(self, text):
        """Each space-separated word's pieces, "▁" for an empty word (`SentencePieceSettings.word_by_word`)."""
        if self.settings.get("collapse_spaces"):
            text = re.sub(" {2,}", " ", text)
        words = text.split(" ")
        if words[0] == "":  # the text's leading space is the first word's own "▁"
            words = words[1:]
        return [piece for word in words for piece in (self.encoder.encode(word, out_type=str) or ["\u2581"])]

    def text(self, ids):
        """The text of a row of ids, special tokens dropped and its ends trimmed as the checkpoint's tokenizer does."""
        text = "".join(self.surfaces[index] for index in map(int, ids)
                       if 0 <= index < len(self.surfaces) and index not in self.dropped)
        if self.settings.get("strip_trailing_space", True):
            return text.strip(_WHITESPACE)
        return text.removeprefix(" ")


def _surfaces(vocab, model):
    """What each token adds to decoded text, as SentencePiece's decoding of pieces writes it.

    As `text.sentencepiece._surfaces`: a piece is its own text, the model's
    unknown piece " ⁇ ", its control pieces (<s>, </s>) nothing.
    """
    unknown_piece = model.id_to_piece(0)
    surfaces = []
    for token in vocab:
        model_id = model.piece_to_id(token)
        if token == unknown_piece:
            surfaces.append(" \u2047 ")
        elif model_id != 0 and not model.decode([model_id]) and token.strip("\u2581"):
            surfaces.append("")
        else:
            surfaces.append(token)
    return surfaces
