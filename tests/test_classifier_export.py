"""The text classifier's SavedModel, served the way TensorFlow Serving would serve it.

A tiny classifier is trained for a few steps on twenty labelled sentences,
exported with `export_classifier`, and loaded in a fresh Python process that
imports only `tensorflow` and `tensorflow_text`: its answers must be the
in-process model's on the same token ids, and a malformed request must be
refused with an error while the process lives on.
"""

import base64
import json
import logging
import os
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import EXPORT_OPS, assert_it_lived, run
from keras_transformer.data import make_classification_batches
from keras_transformer.export import export_classifier, load_export
from keras_transformer.models import TransformerClassifier
from keras_transformer.text import CLASSIFIER_TOKENS, WordPieceTokenizer

LABELS = ["negative", "positive"]
MAX_LENGTH = 12
POSITIVE = [
    "a good film", "I loved this movie", "great acting and a great story", "wonderful and funny",
    "the best film this year", "a lovely warm story", "really good fun", "I enjoyed every minute",
    "brilliant and moving", "a great cast",
]
NEGATIVE = [
    "a bad film", "I hated this movie", "terrible acting and a dull story", "boring and slow",
    "the worst film this year", "a cold empty story", "really bad fun", "I regretted every minute",
    "awful and flat", "a terrible cast",
]
TEXTS = [
    "a good film",  # seen in training: the labels must come out right
    "I hated this movie",
    "",  # [CLS] alone
    " ".join(["boring and slow"] * 10),  # 30 pieces: cut to MAX_LENGTH ids, as in training
    b"a \xff\xfe bad film",  # not UTF-8: replaced, not fatal
]
OUTPUTS = {"label", "label_id", "probabilities", "embedding"}
REFUSAL = "text must be a string vector of shape [batch]; got shape"

# Runs in a fresh interpreter: no keras_transformer, no Keras model classes.
FRESH_PROCESS = r"""
import base64, json, sys
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the WordPiece ops, as tensorflow_model_server does

export_dir, texts_json, out_path, report_path, tests_dir = sys.argv[1:6]
""" + EXPORT_OPS + r"""

texts = tf.constant([base64.b64decode(text) for text in json.loads(texts_json)], tf.string)
loaded = tf.saved_model.load(export_dir)
serve = loaded.signatures["serving_default"]

first = serve(text=texts)
malformed = {
    "scalar": tf.constant("a good film"),
    "[1, 2]": tf.constant([["a good film", "a bad film"]]),
    "[2, 2]": tf.constant([["a", "b"], ["c", "d"]]),
    "[1, 0]": tf.zeros([1, 0], tf.string),
    "[0, 3]": tf.zeros([0, 3], tf.string),
}
refusals = {}
for name, request in malformed.items():
    try:
        serve(text=request)
        refusals[name] = "answered"
    except tf.errors.InvalidArgumentError as error:
        refusals[name] = error.message
again = serve(text=texts)  # the process lives on and still answers
empty = serve(text=tf.constant([], tf.string))

np.savez(
    out_path,
    **{f"first_{name}": value.numpy() for name, value in first.items()},
    **{f"again_{name}": value.numpy() for name, value in again.items()},
    empty_shapes=np.array(json.dumps({name: list(value.shape) for name, value in empty.items()})),
    refusals=np.array(json.dumps(refusals)),
    **export_facts(),
)

# Then the translator's fuzz through both loaders, in the same process: one start for both proofs.
sys.path.insert(0, tests_dir)
import malformed_requests  # noqa: E402  (TensorFlow, tensorflow-text and NumPy only)

malformed_requests.main(export_dir, 1, 60, report_path, loaded=loaded)
"""


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


# Session scope: under xdist a module's fixtures are rebuilt whenever the
# process comes back to the module.
@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    """`(model, tokenizer, export_base, logged)`: a trained tiny classifier, its export at version 1,
    and what TensorFlow logged (at INFO) while exporting."""
    keras.utils.set_random_seed(0)
    examples = [(text, 1) for text in POSITIVE] + [(text, 0) for text in NEGATIVE]
    tokenizer = WordPieceTokenizer.learn(
        [text for text, _ in examples], vocab_size=200, lower_case=True, reserved_tokens=CLASSIFIER_TOKENS,
        min_count=1,  # twenty sentences: keep every word
    )
    model = TransformerClassifier(
        vocab_size=tokenizer.vocab_size, num_classes=2, num_layers=2, d_model=32, num_heads=2, d_ff=64,
        max_length=16,
    )
    batches, _ = make_classification_batches(examples, tokenizer, MAX_LENGTH, batch_size=20)
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # The data is one batch, already in a fixed order: Keras' own shuffle would only warn.
    model.fit(batches.repeat(), epochs=1, steps_per_epoch=25, shuffle=False, verbose=0)

    export_base = tmp_path_factory.mktemp("exports") / "sentiment"
    # TensorFlow's logger and absl's (which says that inputs are renamed), both at INFO.
    loggers, records = [tf.get_logger(), logging.getLogger("absl")], _Records()
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.INFO)
        logger.addHandler(records)
    try:
        path = export_classifier(model, tokenizer, MAX_LENGTH, str(export_base), labels=LABELS)
    finally:
        for logger, level in zip(loggers, levels):
            logger.removeHandler(records)
            logger.setLevel(level)
    assert path == str(export_base / "1")
    return model, tokenizer, export_base, records.messages


@pytest.fixture(scope="session")
def served(exported, tmp_path_factory):
    """The export in one fresh process with only TensorFlow and tensorflow-text: its answers (`.npz`), then the
    malformed-request fuzz's report."""
    _, _, export_base, _ = exported
    directory = tmp_path_factory.mktemp("served")
    encoded = json.dumps([base64.b64encode(t if isinstance(t, bytes) else t.encode()).decode() for t in TEXTS])
    out, report = directory / "served.npz", directory / "report.json"
    assert_it_lived(run([sys.executable, "-c", FRESH_PROCESS, export_base / "1", encoded, out, report,
                         Path(__file__).parent], check=False))
    return np.load(out, allow_pickle=True), json.loads(report.read_text())  # byte strings come as object arrays


def in_process(model, tokenizer, texts):
    """What the model in this process says about `texts`, on the ids the training pipeline makes."""
    ids = tokenizer.tokenize_with_cls(tf.constant(texts, tf.string), MAX_LENGTH)
    probabilities = tf.nn.softmax(model(ids, training=False)).numpy()
    return ids.numpy(), probabilities, model.embed(ids, training=False).numpy()


@pytest.mark.slow
def test_a_fresh_process_with_only_tensorflow_classifies_as_the_model_does(exported, served):
    model, tokenizer, _, logged = exported
    ids, probabilities, embedding = in_process(model, tokenizer, TEXTS)
    assert ids.shape[1] == MAX_LENGTH and (ids[:, 0] == tokenizer.vocab.index("[CLS]")).all()
    # No screen of "Function `serve` contains input name(s) ... with unsupported characters"
    # (TensorFlow logs that at INFO, as it logs "Assets written to", which proves the capture works).
    assert any("Assets written to" in message for message in logged), logged
    assert not [message for message in logged if "unsupported characters" in message], logged

    served, _ = served
    assert list(served["modules"]) == [], "the fresh process must not need keras_transformer"
    assert list(served["unregistered"]) == [], "ops that TensorFlow + tensorflow-text do not register"
    assert not {"PyFunc", "EagerPyFunc", "PyFuncStateless"} & set(served["op_types"])
    assert "FastWordpieceTokenizeWithOffsets" in set(served["op_types"]), "the tokenizer is in the graph"

    first = {name: served[f"first_{name}"] for name in OUTPUTS}
    np.testing.assert_allclose(first["probabilities"], probabilities, atol=1e-5)
    np.testing.assert_allclose(first["embedding"], embedding, atol=1e-5)
    assert first["embedding"].shape == (len(TEXTS), model.d_model) and first["embedding"].dtype == np.float32
    assert first["probabilities"].dtype == np.float32
    np.testing.assert_array_equal(first["label_id"], probabilities.argmax(axis=-1))
    assert [label.decode() for label in first["label"]] == [LABELS[i] for i in probabilities.argmax(axis=-1)]
    # Trained, not uniform: the sentences it learned from get their own labels.
    assert [label.decode() for label in first["label"][:2]] == ["positive", "negative"]
    assert np.abs(first["probabilities"][:2] - 0.5).min() > 0.1

    refusals = json.loads(str(served["refusals"]))
    for name, message in refusals.items():
        assert REFUSAL in message, (name, message)
    assert set(refusals) == {"scalar", "[1, 2]", "[2, 2]", "[1, 0]", "[0, 3]"}
    for name in OUTPUTS:  # after five refusals, the same answers
        np.testing.assert_array_equal(served[f"again_{name}"], first[name])
    empty_shapes = json.loads(str(served["empty_shapes"]))
    assert empty_shapes == {"label": [0], "label_id": [0], "probabilities": [0, 2], "embedding": [0, model.d_model]}


@pytest.mark.slow
def test_load_export_and_the_settings_beside_the_export(exported):
    model, tokenizer, export_base, _ = exported
    # The base resolves to its highest version.
    outputs = load_export(str(export_base)).signatures["serving_default"](text=tf.constant(TEXTS[:2]))
    _, probabilities, _ = in_process(model, tokenizer, TEXTS[:2])
    np.testing.assert_allclose(outputs["probabilities"].numpy(), probabilities, atol=1e-5)

    settings = json.loads((export_base / "1" / "assets.extra" / "classifier.json").read_text())
    assert settings["labels"] == LABELS and settings["max_length"] == MAX_LENGTH
    assert settings["signatures"] == {"serving_default": ["text"]}
    assert (settings["vocab_size"], settings["d_model"]) == (tokenizer.vocab_size, model.d_model)


@pytest.mark.slow
def test_malformed_and_random_requests_through_both_loaders(served):
    """The translator's fuzzing script, on the classifier's one signature; the process must survive."""
    _, report = served  # the fuzz ran in the fresh process of `served`, after its answers

    assert {answer["signature"] for answer in report} == {"serving_default"}
    named = [answer for answer in report if not answer["request"].startswith("random")]
    assert len(named) == 2 * 5
    for answer in named:
        assert answer["answer"] == "InvalidArgumentError" and REFUSAL in answer["message"], answer
    random_answers = [answer for answer in report if answer["request"].startswith("random")]
    answers = {answer["answer"] for answer in random_answers}
    assert answers <= {"ok", "InvalidArgumentError", "InternalError", "TypeError", "ValueError"}, answers
    assert sum(answer["answer"] == "ok" for answer in random_answers) >= 5
    assert sum(REFUSAL in answer.get("message", "") for answer in random_answers) >= 5


def test_export_refuses_a_taken_version_and_arguments_that_do_not_fit_before_writing(tmp_path):
    tokenizer = WordPieceTokenizer([*CLASSIFIER_TOKENS, "good", "bad", "film"])
    model = TransformerClassifier(
        vocab_size=tokenizer.vocab_size, num_classes=2, num_layers=1, d_model=8, num_heads=2, d_ff=16, max_length=8
    )
    base = tmp_path / "exports"
    (base / "1").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="already exists"):
        export_classifier(model, tokenizer, 8, str(base), version=1)
    for bad in (0, "2", True):
        with pytest.raises(ValueError, match="version must be a positive integer"):
            export_classifier(model, tokenizer, 8, str(base), version=bad)
    for max_length in (0, 9, 4.0):
        with pytest.raises(ValueError, match=r"max_length must be an integer in \[1, 8\]"):
            export_classifier(model, tokenizer, max_length, str(base))
    for labels in (["negative"], ["negative", "positive", "neutral"], ["a", 1]):
        with pytest.raises(ValueError, match="labels must be 2 strings"):
            export_classifier(model, tokenizer, 8, str(base), labels=labels)
    with pytest.raises(ValueError, match="labels must be distinct"):
        export_classifier(model, tokenizer, 8, str(base), labels=["same", "same"])
    with pytest.raises(ValueError, match=r"no \[CLS\] token"):
        translator_vocab = WordPieceTokenizer(["[PAD]", "[UNK]", "[START]", "[END]", "good", "bad", "film", "x"])
        export_classifier(model, translator_vocab, 8, str(base))
    with pytest.raises(ValueError, match="the model has 8 token ids but the tokenizer's vocabulary has 7"):
        export_classifier(model, WordPieceTokenizer([*CLASSIFIER_TOKENS, "good", "bad"]), 8, str(base))
    assert os.listdir(base) == ["1"] and not os.listdir(base / "1")
