"""WordPiece tokenizers: learned vocabularies, round trips, the reserved ids."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.text import RESERVED_TOKENS, WordPieceTokenizer

SENTENCES = [
    "Ein Mann fährt Fahrrad.",
    "Zwei junge Männer spielen Fußball im Park.",
    "Eine Frau (mit Hut) liest eine Zeitung, oder?",
    "Der Hund läuft über die Straße!",
    "A man in a T-shirt isn't riding the dog's bike.",
    "Two children are playing; one is laughing.",
]


@pytest.fixture(scope="module")
def tokenizer():
    return WordPieceTokenizer.learn(SENTENCES * 5, vocab_size=300)


def test_round_trip_gives_back_the_text(tokenizer):
    ids = tokenizer.tokenize(SENTENCES)
    assert [text.decode() for text in tokenizer.detokenize(ids).numpy()] == SENTENCES
    # Padded dense ids (as a decoder produces) detokenize the same.
    assert [text.decode() for text in tokenizer.detokenize(ids.to_tensor()).numpy()] == SENTENCES


def test_reserved_ids_frame_every_sentence(tokenizer):
    assert tokenizer.vocab[:4] == list(RESERVED_TOKENS)
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.start_id, tokenizer.end_id) == (0, 1, 2, 3)
    ids = tokenizer.tokenize(SENTENCES[:2])
    for row in ids.to_list():
        assert row[0] == 2 and row[-1] == 3 and 0 not in row
    assert tokenizer.tokenize(["Ein Mann."], add_start_end=False).to_list()[0][0] not in (2, 3)


def test_unknown_words_split_into_pieces_or_unk(tokenizer):
    # A new word built from known pieces is split into them, not lost.
    pieces = [tokenizer.vocab[i] for i in tokenizer.tokenize(["Hundes"]).to_list()[0][1:-1]]
    assert pieces != ["[UNK]"] and "".join(p.removeprefix("##") for p in pieces) == "Hundes"
    # Characters never seen in training have no piece: [UNK].
    assert tokenizer.tokenize(["日本"]).to_list()[0][1:-1] == [tokenizer.unk_id] * len(
        tokenizer.tokenize(["日本"]).to_list()[0][1:-1]
    ) != []


def test_vocabulary_respects_the_size(tokenizer):
    assert tokenizer.vocab_size <= 300
    small = WordPieceTokenizer.learn(SENTENCES * 5, vocab_size=150)
    assert small.vocab_size <= 150


def test_save_and_load_give_the_same_ids(tokenizer, tmp_path):
    tokenizer.save(tmp_path / "vocab")
    loaded = WordPieceTokenizer.load(tmp_path / "vocab")
    assert loaded.vocab == tokenizer.vocab
    assert loaded.tokenize(SENTENCES).to_list() == tokenizer.tokenize(SENTENCES).to_list()
    assert (tmp_path / "vocab" / "vocab.txt").read_text(encoding="utf-8").splitlines()[:4] == list(RESERVED_TOKENS)


def test_lower_case_keeps_umlauts():
    tokenizer = WordPieceTokenizer.learn(SENTENCES * 5, vocab_size=300, lower_case=True)
    assert tokenizer.detokenize(tokenizer.tokenize(["Der Hund LÄUFT über die Straße!"])).numpy()[0].decode() == (
        "der hund läuft über die straße!"
    )


def test_bytes_that_are_not_utf8_are_replaced_not_fatal(tokenizer):
    ids = tokenizer.tokenize(tf.constant([b"Ein Mann \xff\xfe f\xc3\xa4hrt."]))
    text = tokenizer.detokenize(ids).numpy()[0].decode()
    assert text.startswith("Ein Mann") and text.endswith("fährt.")


def test_tokenizes_inside_a_tf_function(tokenizer):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def round_trip(texts):
        return tokenizer.detokenize(tokenizer.tokenize(texts))

    assert round_trip(tf.constant(SENTENCES[:2])).numpy()[1].decode() == SENTENCES[1]


def test_token_strings_for_labels(tokenizer):
    tokens = tokenizer.id_to_token(tokenizer.tokenize(["Ein Mann."])).to_list()[0]
    assert tokens[0] == b"[START]" and tokens[-1] == b"[END]" and b"." in tokens


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: WordPieceTokenizer(["a", "b"]), "must start with the reserved tokens"),
        (lambda: WordPieceTokenizer(list(RESERVED_TOKENS) + ["a", "a"]), "more than once"),
        (lambda: WordPieceTokenizer.learn([], vocab_size=100), "no text"),
        (lambda: WordPieceTokenizer.learn(["a b"], vocab_size=4), "must exceed"),
        (lambda: WordPieceTokenizer.load("/nonexistent/vocab"), "no vocabulary"),
        (lambda: WordPieceTokenizer.learn(SENTENCES, vocab_size=60), "ask for a larger vocab_size"),
    ],
)
def test_bad_input(make, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        make()


def test_shared_special_ids_are_the_same_across_vocabularies():
    a = WordPieceTokenizer.learn(["Ein Hund."] * 3, vocab_size=50)
    b = WordPieceTokenizer.learn(["A dog."] * 3, vocab_size=50)
    assert (a.pad_id, a.start_id, a.end_id) == (b.pad_id, b.start_id, b.end_id)
    np.testing.assert_array_equal(a.tokenize(["Hund"]).to_list()[0][0], 2)


# -- SentencePiece vocabularies learned for a run (`train --tokenizer sentencepiece`) -----------------------

# The tokenizer test sentences: accents, digits, CJK, emoji, case, punctuation, spaces, empty, over-long.
SENTENCEPIECE_TEST_SENTENCES = [
    "Ein Mann fährt Fahrrad.", "Zwei junge MÄNNER spielen Fußball im Park.", "ÉNORME Succès: 42 km/h, 3.5%!",
    "東京タワー 🙂 emoji", "", "  two  spaces ", "ﬁne ligatures and full-width ＡＢＣ", "x" * 300, "word " * 200,
]


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
@pytest.mark.parametrize("lower_case", [False, True])
def test_a_learned_sentencepiece_vocabulary_gives_the_sentencepiece_packages_ids_and_decodes_as_it_does(
        model_type, lower_case, tmp_path):
    import sentencepiece

    from keras_transformer.data import demo_corpus
    from keras_transformer.text import SentencePieceTokenizer, load_tokenizer
    from keras_transformer.text.sentencepiece import ID_OFFSET

    texts = [source for source, _ in demo_corpus()["train"][:2000]] + SENTENCES
    tokenizer = SentencePieceTokenizer.learn(texts, vocab_size=300, model_type=model_type, lower_case=lower_case)
    assert SentencePieceTokenizer.learn(texts, vocab_size=300, model_type=model_type,
                                        lower_case=lower_case).model == tokenizer.model  # the same texts, the same model
    processor = sentencepiece.SentencePieceProcessor(model_proto=tokenizer.model)
    assert processor.get_piece_size() <= 300
    ours = tokenizer.tokenize(SENTENCEPIECE_TEST_SENTENCES, add_start_end=False).to_list()
    assert ours == [[piece + ID_OFFSET for piece in processor.encode(text)] for text in SENTENCEPIECE_TEST_SENTENCES]
    framed = tokenizer.tokenize(SENTENCEPIECE_TEST_SENTENCES).to_list()
    assert all(row[0] == tokenizer.start_id and row[-1] == tokenizer.end_id for row in framed)
    decoded = [text.decode() for text in tokenizer.detokenize(tf.ragged.constant(framed)).numpy()]
    # Decoding inverts the ids, as SentencePiece's own decoding does (an unknown character is dropped).
    known = [index for index, row in enumerate(ours) if tokenizer.unk_id not in row]
    assert len(known) >= 5
    assert [decoded[index] for index in known] == [
        processor.decode(processor.encode(SENTENCEPIECE_TEST_SENTENCES[index])) for index in known]
    if lower_case:
        assert decoded[1] == "zwei junge männer spielen fußball im park."
    tokenizer.save(tmp_path / "vocab")
    assert load_tokenizer(str(tmp_path / "vocab")).tokenize(SENTENCEPIECE_TEST_SENTENCES).to_list() == framed
    with pytest.raises(ValueError, match="model_type must be one of"):
        SentencePieceTokenizer.learn(texts, model_type="wordpiece")
    with pytest.raises(ValueError, match="needs some text"):
        SentencePieceTokenizer.learn(["", "  "])
