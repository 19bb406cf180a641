"""Texts as users give them: one answer per text, in order, whatever a text holds.

A document piped through `keras-transformer translate` must come out with as
many lines as it went in, line N answering line N, as Marian's and
OpenNMT-tf's translators answer. So every road that reads texts (a run, a
SavedModel, CTranslate2, LiteRT; translate, classify, generate) follows the
same three rules, written here once:

- A blank text (empty, or whitespace alone) gets a blank answer, and the
  model never sees it (`answer_each`): there is nothing to translate.
- Bytes that are not UTF-8 become U+FFFD, the replacement character, as
  the tokenizers read them; a user is told which line held them
  (`read_lines`, `valid_text`). Python strings may hold such bytes as lone
  surrogates (how Python decodes a command line's bad bytes): they are
  repaired the same way.
- A text longer than the model reads is cut to its first pieces; the
  answer says which texts were cut (`Answers.truncated`), so that the
  command line can say so.

This module imports no TensorFlow: the on-device runner uses it too.
"""

# What a byte that is not UTF-8 becomes, in every road (Python's "replace", tensorflow-text's errors="replace").
REPLACEMENT = "\ufffd"
BYTE_ORDER_MARK = "\ufeff"


class Answers(list):
    """A road's answers, one per text, in order; `truncated` maps a text's index to the pieces the model read.

    A plain list to whoever reads it as one: `translate(texts)[0]` is the
    first translation. `truncated` is empty when every text fitted.
    """

    def __init__(self, answers=(), truncated=None):
        super().__init__(answers)
        self.truncated = dict(truncated or {})


def valid_text(text):
    """`(text, repaired)`: `text` with its undecodable bytes (lone surrogates) as U+FFFD, and whether it had any.

    A command line's bad bytes reach Python as surrogates U+DC80-U+DCFF
    ("surrogateescape"): they are turned back into the bytes, then each
    undecodable byte into one U+FFFD, as a file's are. Any other lone
    surrogate is one U+FFFD. `bytes` are decoded the same way; anything
    else is refused in one line.
    """
    if isinstance(text, bytes):
        try:
            return text.decode("utf-8"), False
        except UnicodeDecodeError:
            return text.decode("utf-8", errors="replace"), True
    if not isinstance(text, str):
        raise ValueError(f"texts must be a list of strings; one is {type(text).__name__}")
    try:
        text.encode("utf-8")
        return text, False
    except UnicodeEncodeError:
        pass
    repaired = []
    for character in text:
        if "\udc80" <= character <= "\udcff":
            repaired.append(character.encode("utf-8", "surrogateescape"))
        elif "\ud800" <= character <= "\udfff":
            repaired.append(REPLACEMENT.encode("utf-8"))
        else:
            repaired.append(character.encode("utf-8"))
    return b"".join(repaired).decode("utf-8", errors="replace"), True


def read_lines(stream):
    """`[(text, repaired)]`, one per line of `stream` (binary, or text), every line kept, blank ones too.

    Line endings (LF or CRLF) and a byte-order mark at the start are not
    part of any text; a line's bytes that are not UTF-8 become U+FFFD and
    `repaired` is True for it.
    """
    binary = getattr(stream, "buffer", stream)
    lines = []
    for number, line in enumerate(binary):
        text, repaired = valid_text(line)
        text = text.removesuffix("\n").removesuffix("\r")
        if number == 0:
            text = text.removeprefix(BYTE_ORDER_MARK)
        lines.append((text, repaired))
    return lines


def is_blank(text):
    return not text.strip()


def answer_each(texts, answer_some, blank_answer):
    """`Answers` for `texts`: `blank_answer` for each blank text, `answer_some(the others)` for the rest, in order.

    `answer_some` takes a list of texts (repaired by `valid_text`) and
    returns one answer per text, or `Answers` whose `truncated` counts
    among the texts it was given; the indices are mapped back to `texts`'.
    """
    if isinstance(texts, (str, bytes)) or not hasattr(texts, "__iter__"):
        raise ValueError(f"texts must be a list of strings, got {type(texts).__name__}")
    texts = [valid_text(text)[0] for text in texts]
    asked = [index for index, text in enumerate(texts) if not is_blank(text)]
    answers = [blank_answer] * len(texts)
    if not asked:
        return Answers(answers)
    given = answer_some([texts[index] for index in asked])
    for index, answer in zip(asked, given):
        answers[index] = answer
    truncated = {asked[index]: pieces for index, pieces in getattr(given, "truncated", {}).items()}
    return Answers(answers, truncated)
