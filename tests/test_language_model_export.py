"""The language model's SavedModel, served the way TensorFlow Serving would serve it.

The suite's tiny language model run (`train-lm` on the demo corpus, a real
WordPiece vocabulary; conftest.py) is exported with `export_language_model`
and loaded in a fresh Python process that imports only `tensorflow` and
`tensorflow_text`: with
the same seed and settings it must write exactly what the in-process
`Generator` writes, and a malformed request must be refused with an error
naming the input while the process lives on.
"""

import base64
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from helpers import EXPORT_OPS, assert_it_lived, run
from keras_transformer.export import export_language_model, load_export
from keras_transformer.inference import Generator
from keras_transformer.runs.language_model import load_generator
from keras_transformer.text import WordPieceTokenizer

pytestmark = pytest.mark.tensorflow

MAX_LENGTH = 24
PROMPTS = [
    "A dog runs",
    "",  # continued from [START]
    "the young cat " * 20,  # longer than the model reads beside what it writes: its last pieces are kept
    b"a \xff\xfe man",  # not UTF-8: replaced, not fatal
]
# (seed, temperature, top_k, top_p, max_new_tokens) for the `generate` signature.
SETTINGS = {
    "nucleus": (5, 0.8, 0, 0.9, 6),
    "top-k": (7, 1.2, 10, 1.0, 9),
    "greedy": (0, 0.0, 0, 1.0, 5),
}
# Requests every export must refuse, and a word the refusal must contain.
GOOD = {"seed": 1, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": 4}
REFUSED = {
    "scalar text": ({"text": "A dog"}, "text must be a string vector"),
    "[1, 2] text": ({"text": [["A dog", "A cat"]]}, "text must be a string vector"),
    "negative temperature": ({"temperature": -1.0}, "temperature must be >= 0"),
    "NaN temperature": ({"temperature": float("nan")}, "temperature must be >= 0"),
    "negative top_k": ({"top_k": -1}, "top_k must be >= 0"),
    "top_p 0": ({"top_p": 0.0}, "top_p must be in (0, 1]"),
    "top_p 1.5": ({"top_p": 1.5}, "top_p must be in (0, 1]"),
    "no new tokens": ({"max_new_tokens": 0}, "max_new_tokens must be in [1, 23]"),
    "the whole window": ({"max_new_tokens": MAX_LENGTH}, "max_new_tokens must be in [1, 23]"),
    "vector seed": ({"seed": [1, 2]}, "seed must be a scalar"),
    "vector temperature": ({"temperature": [1.0]}, "temperature must be a scalar"),
}

# Runs in a fresh interpreter: no keras_transformer, no Keras model classes.
FRESH_PROCESS = r"""
import base64, json, sys
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the WordPiece ops, as tensorflow_model_server does

export_dir, prompts_json, settings_json, good_json, refused_json, out_path, report_path, tests_dir = sys.argv[1:9]
""" + EXPORT_OPS + r"""
DTYPES = {"seed": tf.int64, "temperature": tf.float32, "top_k": tf.int32, "top_p": tf.float32,
          "max_new_tokens": tf.int32}
prompts = tf.constant([base64.b64decode(prompt) for prompt in json.loads(prompts_json)], tf.string)
loaded = tf.saved_model.load(export_dir)
serve, generate = loaded.signatures["serving_default"], loaded.signatures["generate"]

def request(text, **settings):
    return generate(text=text, **{name: tf.constant(value, DTYPES[name]) for name, value in settings.items()})

outputs = {"default": serve(text=prompts)}
names = ("seed", "temperature", "top_k", "top_p", "max_new_tokens")
for name, values in json.loads(settings_json).items():
    outputs[name] = request(prompts, **dict(zip(names, values)))
refusals = {}
for name, (changes, _) in json.loads(refused_json).items():
    settings = {**json.loads(good_json), **changes}
    text = tf.constant(settings.pop("text", ["A dog"]))
    try:
        request(text, **settings)
        refusals[name] = "answered"
    except tf.errors.InvalidArgumentError as error:
        refusals[name] = error.message
again = serve(text=prompts)  # the process lives on and still answers
empty = serve(text=tf.constant([], tf.string))
np.savez(
    out_path,
    **{f"{case}_{name}": value.numpy() for case, result in outputs.items() for name, value in result.items()},
    **{f"again_{name}": value.numpy() for name, value in again.items()},
    empty_shapes=np.array(json.dumps({name: list(value.shape) for name, value in empty.items()})),
    refusals=np.array(json.dumps(refusals)),
    **export_facts(),
)

# Then the requests a careless client or an attacker sends, in the same process: one start for both proofs.
sys.path.insert(0, tests_dir)
import malformed_requests  # noqa: E402  (TensorFlow, tensorflow-text and NumPy only)

malformed_requests.main(export_dir, 2, 100, report_path, loaded=loaded)
"""


@pytest.fixture(scope="module")
def exported(trained_language_model_run, tmp_path_factory):
    """`(generator, export version)`: the suite's language model run with sampling settings of its own, exported."""
    run_dir, _ = trained_language_model_run
    generator = load_generator(run_dir, temperature=0.9, top_p=0.95, max_new_tokens=8)
    assert generator.model.max_length == MAX_LENGTH
    base = tmp_path_factory.mktemp("exports") / "lm"
    return generator, export_language_model(generator, str(base))


def in_process(generator, **settings):
    outputs = generator(tf.constant(PROMPTS), **settings)
    return {name: value.numpy() for name, value in outputs.items()}


@pytest.fixture(scope="module")
def served(exported, tmp_path_factory):
    """One fresh process on the export, importing only TensorFlow and tensorflow-text, as a server does.

    It writes the texts of each setting, answers the refused requests, then
    takes the malformed-request fuzz of `malformed_requests.py`. Returns its
    answers (`.npz`) and the fuzz's report.
    """
    _, version = exported
    directory = tmp_path_factory.mktemp("served")
    out, report = directory / "served.npz", directory / "report.json"
    encoded = json.dumps([base64.b64encode(p if isinstance(p, bytes) else p.encode()).decode() for p in PROMPTS])
    assert_it_lived(run([sys.executable, "-c", FRESH_PROCESS, version, encoded, json.dumps(SETTINGS), json.dumps(GOOD),
                         json.dumps(REFUSED), out, report, Path(__file__).parent], check=False))
    return np.load(out, allow_pickle=True), json.loads(report.read_text())


@pytest.mark.slow
def test_a_fresh_process_with_only_tensorflow_writes_what_the_generator_writes(exported, served):
    generator, _ = exported
    served, _ = served
    assert list(served["modules"]) == [], "the fresh process must not need keras_transformer"
    assert list(served["unregistered"]) == [], "ops that TensorFlow + tensorflow-text do not register"
    assert not {"PyFunc", "EagerPyFunc", "PyFuncStateless"} & set(served["op_types"])

    names = ("seed", "temperature", "top_k", "top_p", "max_new_tokens")
    expected = {"default": in_process(generator, seed=0)}
    expected.update({case: in_process(generator, **dict(zip(names, values))) for case, values in SETTINGS.items()})
    for case, outputs in expected.items():
        for name in ("text", "continuation", "new_tokens"):
            np.testing.assert_array_equal(served[f"{case}_{name}"], outputs[name], err_msg=f"{case} {name}")
        limit = SETTINGS[case][-1] if case in SETTINGS else generator.defaults["max_new_tokens"]
        assert all(1 <= new <= limit for new in outputs["new_tokens"]), (case, outputs["new_tokens"])
    texts = [text.decode() for text in expected["default"]["text"]]
    assert texts[0].startswith("A dog runs") and texts[2].startswith("the young cat the young cat")
    # The long prompt kept [START] and as many of its last pieces as fit beside 8 new tokens.
    default = expected["default"]
    assert (default["tokens"][2] != 0).sum() - default["new_tokens"][2] == MAX_LENGTH - 8
    assert texts[3].startswith("a ")
    # Other settings, other texts; the seed makes them repeat.
    assert len({tuple(outputs["text"]) for outputs in expected.values()}) == len(expected)
    np.testing.assert_array_equal(in_process(generator, seed=0)["text"], expected["default"]["text"])

    refusals = json.loads(str(served["refusals"]))
    for name, (_, words) in REFUSED.items():
        assert words in refusals[name], (name, refusals[name])
    for name in ("text", "continuation", "new_tokens"):  # after the refusals, the same answers
        np.testing.assert_array_equal(served[f"again_{name}"], served[f"default_{name}"])
    assert json.loads(str(served["empty_shapes"])) == {"text": [0], "continuation": [0], "new_tokens": [0]}


@pytest.mark.slow
def test_malformed_and_random_requests_through_both_loaders(served):
    """The translator's fuzzing script on both signatures, through the TF2 and the Session loaders."""
    _, report = served  # the fuzz ran in the fresh process of `served`, after its texts
    assert {answer["signature"] for answer in report} == {"serving_default", "generate"}
    named = [answer for answer in report if not answer["request"].startswith("random")]
    assert named and all(answer["answer"] == "InvalidArgumentError" for answer in named), named
    answers = {answer["answer"] for answer in report}
    assert answers <= {"ok", "InvalidArgumentError", "InternalError", "TypeError", "ValueError"}, answers
    assert sum(answer["answer"] == "ok" for answer in report if answer["request"].startswith("random")) >= 2


def test_settings_beside_the_export_and_a_taken_version_refused(exported):
    generator, version = exported
    settings = json.loads((Path(version) / "assets.extra" / "language_model.json").read_text(encoding="utf-8"))
    assert (settings["temperature"], settings["top_p"], settings["top_k"]) == (0.9, 0.95, 0)
    assert settings["max_new_tokens"] == 8 and settings["max_length"] == MAX_LENGTH
    assert settings["signatures"]["generate"] == ["text", "seed", "temperature", "top_k", "top_p", "max_new_tokens"]
    with pytest.raises(FileExistsError, match="already exists"):
        export_language_model(generator, str(Path(version).parent), version=1)
    # The base resolves to its newest version, and it answers.
    outputs = load_export(str(Path(version).parent)).signatures["serving_default"](text=tf.constant(["A dog"]))
    assert outputs["text"].numpy()[0].decode().startswith("A dog")


def test_a_generator_refuses_settings_out_of_range_in_one_line(exported):
    generator, _ = exported
    for settings, words in ((dict(temperature=-0.5), "temperature must be >= 0"), (dict(top_p=0.0), "top_p"),
                            (dict(top_k=-2), "top_k"), (dict(max_new_tokens=MAX_LENGTH), "max_new_tokens")):
        with pytest.raises(ValueError, match=words):
            Generator(generator.model, generator.tokenizer, **settings)
    with pytest.raises(ValueError, match="token ids but the tokenizer's vocabulary has"):
        Generator(generator.model, WordPieceTokenizer.learn(["a b c"], vocab_size=20))
