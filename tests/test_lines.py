"""Texts as users give them (`keras_transformer.lines`): every line kept, bad bytes repaired, blanks never asked."""

import io

import pytest

from helpers import DOCUMENT, DOCUMENT_TEXTS
from keras_transformer.lines import Answers, answer_each, read_lines, valid_text


def test_every_line_of_a_document_is_read_blank_ones_too_without_bom_or_line_endings():
    read = read_lines(io.BytesIO(DOCUMENT))
    blanks = iter(["", "   \t "])
    assert [text for text, _ in read] == [next(blanks) if text is None else text for text in DOCUMENT_TEXTS]
    assert [repaired for _, repaired in read] == [False, False, False, True, False, False]
    # A text stream (stdin as Python opens it) holds the bytes behind .buffer.
    assert read_lines(io.TextIOWrapper(io.BytesIO(DOCUMENT))) == read
    assert read_lines(io.BytesIO(b"")) == []
    assert read_lines(io.BytesIO(b"\n")) == [("", False)]


def test_a_command_lines_bad_bytes_become_one_replacement_character_each():
    assert valid_text("caf\udce9 ok") == ("caf\ufffd ok", True)  # Latin-1 "é", as argv decodes it
    assert valid_text("x\ud800y") == ("x\ufffdy", True)  # a lone surrogate of another kind
    assert valid_text("café 🙂") == ("café 🙂", False)
    assert valid_text(b"caf\xe9") == ("caf\ufffd", True)
    with pytest.raises(ValueError, match="texts must be a list of strings; one is int"):
        valid_text(3)


def test_blank_texts_are_answered_without_asking_and_cuts_are_mapped_back():
    asked = []

    def shout(texts):
        asked.append(texts)
        return Answers([text.upper() for text in texts], {1: 7})

    answers = answer_each(["a", "", " \t", "b\udcff", "c"], shout, "-")
    assert answers == ["A", "-", "-", "B\ufffd", "C"] and answers.truncated == {3: 7}
    assert asked == [["a", "b\ufffd", "c"]]
    assert answer_each(["", " "], shout, "-") == ["-", "-"] and len(asked) == 1
    with pytest.raises(ValueError, match="texts must be a list of strings, got str"):
        answer_each("abc", shout, "-")
