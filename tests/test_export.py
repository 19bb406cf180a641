"""The trained demo run as a user meets it: the CLI on it, then its export served.

The CLI test and the export tests share one trained run (`trained_demo_run`,
trained once per suite) and one export of it (session fixtures).

The SavedModel export is proved the way TensorFlow Serving would use it.

The export is made by `keras-transformer export` and loaded in a fresh
Python process that imports only `tensorflow` and `tensorflow_text`: what it
returns must be exactly what the in-process translator returns, and its
graphs must hold nothing but TensorFlow and tensorflow-text ops.
"""

import base64
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from helpers import DOCUMENT, EXPORT_OPS, assert_it_lived, check_one_answer_per_line, check_run_directory, cli_here, run
from keras_transformer.runs import translation
from keras_transformer.export import export_translator, resolve_export

BEAM_SIZE = 2
SENTENCES = [
    "The dog sees the cat.",
    "A woman sleeps.",
    "",  # empty in, empty out
    "Today the young children do not sleep in the big house near the old tree.",
    " ".join(["The dog sees the cat."] * 12),  # longer than max_length: truncated
    b"The \xff\xfe dog sleeps.",  # not UTF-8: replaced, not fatal
]

# The serving client's gRPC request (examples/serving_client.py), answered in the fresh process.
GRPC_TEXTS = SENTENCES[:2]

# Runs in a fresh interpreter: no keras_transformer, no Keras model classes.
FRESH_PROCESS = r"""
import base64, json, sys
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the WordPiece ops, as tensorflow_model_server does

export_dir, keras_export_dir, sentences_json, grpc_json, out_path, report_path, tests_dir = sys.argv[1:8]
texts = tf.constant([base64.b64decode(text) for text in json.loads(sentences_json)], tf.string)

""" + EXPORT_OPS + r"""

loaded = tf.saved_model.load(export_dir)
served = loaded.signatures["serving_default"](text=texts)
attention = loaded.signatures["translate_with_attention"](text=texts)
empty = loaded.signatures["serving_default"](text=tf.constant([], tf.string))
source_ids = np.array([[2, 20, 21, 22, 3, 0], [2, 23, 3, 0, 0, 0]], np.int32)
target_ids = np.array([[2, 30, 31, 32], [2, 33, 0, 0]], np.int32)
logits = loaded.signatures["score_tokens"](source_ids=source_ids, target_ids=target_ids)["logits"]
keras_export = tf.saved_model.load(keras_export_dir)
keras_logits = keras_export.serve((source_ids, target_ids))
# The serving client's gRPC request, answered as the model server answers it: its TensorProtos in.
from tensorflow.core.framework import tensor_pb2  # noqa: E402  (TensorFlow's own protos)
grpc = json.loads(grpc_json)
grpc_inputs = {name: tf.make_ndarray(tensor_pb2.TensorProto.FromString(base64.b64decode(proto)))
               for name, proto in grpc["inputs"].items()}
grpc_outputs = loaded.signatures[grpc["signature"]](**grpc_inputs)

np.savez(
    out_path,
    translation=served["translation"].numpy(), score=served["score"].numpy(),
    signature_names=np.array(sorted(loaded.signatures)),
    attention_translation=attention["translation"].numpy(), cross_attention=attention["cross_attention"].numpy(),
    source_tokens=attention["source_tokens"].numpy(), target_tokens=attention["target_tokens"].numpy(),
    empty_shapes=np.array([empty["translation"].shape[0], empty["score"].shape[0]]),
    logits=logits.numpy(), keras_logits=np.asarray(keras_logits),
    source_ids=source_ids, target_ids=target_ids,
    **{f"grpc_{name}": value.numpy() for name, value in grpc_outputs.items()},
    **export_facts(),
)

# Then the requests a careless client or an attacker sends, in the same process: one start for both proofs.
sys.path.insert(0, tests_dir)
import malformed_requests  # noqa: E402  (TensorFlow, tensorflow-text and NumPy only)

malformed_requests.main(export_dir, 0, 300, report_path, loaded=loaded)
"""


@pytest.mark.slow
def test_train_evaluate_translate_on_the_demo_corpus(trained_demo_run, tmp_path):
    trained_run, stdout = trained_demo_run
    assert "validation BLEU" in stdout and "translation:" in stdout
    assert f"run directory: {trained_run}" in stdout and "tensorboard --logdir" in stdout
    check_run_directory(trained_run)
    metrics = json.loads((trained_run / "metrics.json").read_text())
    assert metrics["training"]["replicas"] == 1  # "auto" on one device (the process's CPU is split, unasked)
    assert metrics["val"]["sentences"] == 40
    assert metrics["val"]["bleu"] > 10, "100 steps teach the demo grammar's commonest words (an untrained model: ~0)"
    # `train` adds the AttentionMapLogger: attention maps of validation samples in TensorBoard.
    assert list((trained_run / "logs" / "samples").glob("events.out.tfevents.*"))

    # The commands in this process (the console script is proved in test_cli.py), on a copy:
    # evaluate writes its hypotheses into the run.
    run_dir = tmp_path / "demo"
    shutil.copytree(trained_run, run_dir)
    evaluated = cli_here("evaluate", run_dir, "--split", "val", "--beam-size", 2)
    scores = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert set(scores) == {"bleu", "bleu_lowercase", "chrf"}
    assert len((run_dir / "hypotheses.val.txt").read_text(encoding="utf-8").splitlines()) == 40

    # Options go anywhere among the texts, as users type them.
    translated = cli_here("translate", run_dir, "--beam-size", 1, "The dog sees the cat.", "A woman sleeps.")
    assert len(translated.stdout.splitlines()) == 2
    from_stdin = cli_here("translate", run_dir, "--beam-size", 1, input="The dog sees the cat.\nA woman sleeps.\n")
    assert from_stdin.stdout == translated.stdout

    picture = tmp_path / "attention.png"
    plotted = cli_here("plot-attention", run_dir, "--beam-size", 1, "The dog sees the cat.", "--out", picture,
                       "--layer", 0)
    assert plotted.stdout.splitlines()[0] == translated.stdout.splitlines()[0]
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def load_example(name):
    path = Path(__file__).resolve().parents[1] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Session scope: under xdist a module's fixtures are rebuilt whenever the
# process comes back to the module; these are too costly for that. The tests
# below build them in turn (the export with the first, the fresh process with
# the fourth), so that no one test's setup pays for all of them.
@pytest.fixture(scope="session")
def export_base(trained_demo_run, tmp_path_factory):
    run_dir, _ = trained_demo_run
    base = tmp_path_factory.mktemp("exports") / "translator"
    result = cli_here("export", run_dir, base, "--beam-size", BEAM_SIZE)
    assert f"exported SavedModel: {base / '1'}" in result.stdout
    assert "renamed" not in result.stderr, result.stderr  # saving's line about tensorflow-text's inputs: not for users
    return base


@pytest.fixture(scope="session")
def in_process(trained_demo_run):
    """What the translator in this process gives (same settings as the export)."""
    run_dir, _ = trained_demo_run
    translator = translation.load_translator(run_dir, beam_size=BEAM_SIZE)
    texts = tf.constant(SENTENCES, tf.string)
    return translator, translator(texts), translator.translate_with_attention(texts)


@pytest.fixture(scope="session")
def served(export_base, in_process, tmp_path_factory):
    """One fresh process on the export, importing only TensorFlow and tensorflow-text, as a server does.

    It answers the test sentences (and Keras' own export of the bare model its
    ids, and the serving client's gRPC request), then takes the malformed-request
    fuzz of `malformed_requests.py`. Returns its answers (`.npz`) and the fuzz's report.
    """
    translator, _, _ = in_process
    directory = tmp_path_factory.mktemp("served")
    keras_export = directory / "keras_export"
    # Keras' own export of the bare model: ids in, logits out.
    translator.model.export(
        str(keras_export),
        format="tf_saved_model",
        input_signature=[(tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.int32))],
        verbose=False,
    )
    encoded = json.dumps(
        [base64.b64encode(text if isinstance(text, bytes) else text.encode()).decode() for text in SENTENCES]
    )
    request = load_example("serving_client").build_predict_request(GRPC_TEXTS, signature_name="translate_with_attention")
    grpc = json.dumps({"signature": request.model_spec.signature_name, "inputs": {
        name: base64.b64encode(proto.SerializeToString()).decode() for name, proto in request.inputs.items()}})
    out, report = directory / "served.npz", directory / "report.json"
    result = run([sys.executable, "-c", FRESH_PROCESS, export_base / "1", keras_export, encoded, grpc, out, report,
                  Path(__file__).parent], check=False)
    assert_it_lived(result)
    return np.load(out, allow_pickle=True), json.loads(report.read_text())  # byte strings come as object arrays


@pytest.mark.slow
def test_saved_model_cli_shows_string_signatures_and_translates(export_base, in_process):
    _, expected, _ = in_process
    version = export_base / "1"
    shown = run([Path(sys.executable).parent / "saved_model_cli", "show", "--dir", version, "--all"]).stdout
    for signature in ("serving_default", "translate_with_attention", "score_tokens"):
        assert f"signature_def['{signature}']" in shown
    assert "inputs['text'] tensor_info:\n        dtype: DT_STRING" in shown
    assert "outputs['cross_attention'] tensor_info:\n        dtype: DT_FLOAT" in shown

    translated = run([
        sys.executable, "-m", "keras_transformer.export.saved_model_cli", "run", "--dir", version,
        "--tag_set", "serve", "--signature_def", "serving_default", "--input_exprs", 'text=["The dog sees the cat."]',
    ]).stdout
    first = expected["translation"].numpy()[0]
    assert repr(first) in translated or first.decode() in translated, translated


@pytest.mark.slow
def test_the_cli_translates_through_the_export(export_base, in_process, trained_demo_run):
    _, expected, _ = in_process
    # The base resolves to its highest version.
    result = cli_here("translate", "--saved-model", export_base, SENTENCES[0], SENTENCES[1])
    assert result.stdout.splitlines() == [text.decode() for text in expected["translation"].numpy()[:2]]

    # A second export goes next to the first; an existing version is never overwritten.
    run_dir, _ = trained_demo_run
    refused = cli_here("export", run_dir, export_base, "--version", 1, check=False)
    assert refused.returncode == 2 and "already exists" in refused.stderr


@pytest.mark.slow
@pytest.mark.parametrize("road", ["run", "saved_model"])
def test_a_document_comes_out_with_as_many_lines_each_translated_as_if_alone(road, export_base, trained_demo_run,
                                                                            in_process):
    run_dir, _ = trained_demo_run
    given = ["--saved-model", export_base] if road == "saved_model" else [run_dir, "--beam-size", BEAM_SIZE]
    result = cli_here("translate", *given, input=DOCUMENT)
    # Alone: the translator the export was made from (which translates as it does, below), given one text.
    translator, _, _ = in_process
    check_one_answer_per_line(result, lambda text: translator(tf.constant([text]))["translation"][0].numpy().decode())
    pieces = translator.pieces_read
    assert f"line 5 is longer than the model reads: only its first {pieces} pieces were translated" in result.stderr
    assert len(result.stderr.splitlines()) == 2, result.stderr


@pytest.mark.slow
def test_the_grpc_client_builds_requests_and_reads_responses_of_the_export(served, in_process):
    """The client's request, answered by the export the way the model server would answer it (in `served`)."""
    from tensorflow_serving.apis import predict_pb2

    client = load_example("serving_client")
    _, _, expected = in_process
    request = client.build_predict_request(GRPC_TEXTS, signature_name="translate_with_attention")
    assert request.model_spec.name == "translator"
    assert request.inputs["text"].dtype == tf.string.as_datatype_enum

    answers, _ = served
    response = predict_pb2.PredictResponse()
    for key in answers.files:  # every output of the signature, as the server sends them
        if key.startswith("grpc_"):
            response.outputs[key.removeprefix("grpc_")].CopyFrom(tf.make_tensor_proto(answers[key]))
    results = client.parse_predict_response(response)

    assert [result["translation"] for result in results] == [
        t.decode() for t in expected["translation"].numpy()[:len(GRPC_TEXTS)]]
    first = results[0]
    assert first["source_tokens"][0] == "[START]" and first["source_tokens"][-1] == "[END]"
    assert first["cross_attention"].shape[2:] == (len(first["target_tokens"]), len(first["source_tokens"]))
    # Each row is a distribution (the demo model computes in bfloat16).
    np.testing.assert_allclose(first["cross_attention"].sum(axis=-1), 1.0, atol=5e-3)


@pytest.mark.slow
def test_a_fresh_process_with_only_tensorflow_serves_the_same_translations(served, in_process):
    translator, expected, expected_attention = in_process
    served, _ = served

    assert list(served["modules"]) == [], "the fresh process must not need keras_transformer"
    assert list(served["unregistered"]) == [], "ops that TensorFlow + tensorflow-text do not register"
    assert not {"PyFunc", "EagerPyFunc", "PyFuncStateless"} & set(served["op_types"])
    assert {"FastWordpieceTokenizeWithOffsets", "While"} <= set(served["op_types"])
    assert set(served["signature_names"]) == {"serving_default", "translate_with_attention", "score_tokens"}

    np.testing.assert_array_equal(served["translation"], expected["translation"].numpy())
    np.testing.assert_allclose(served["score"], expected["score"].numpy(), atol=1e-5)
    translations = [text.decode() for text in served["translation"]]
    assert translations[2] == "" and all(translations[i] for i in (0, 1, 3, 4, 5))
    assert len(set(translations)) >= 3, "a model that says the same thing to everything proves little"
    assert list(served["empty_shapes"]) == [0, 0]

    np.testing.assert_array_equal(served["attention_translation"], expected["translation"].numpy())
    for name in ("source_tokens", "target_tokens"):
        np.testing.assert_array_equal(served[name], expected_attention[name].numpy())
    np.testing.assert_allclose(served["cross_attention"], expected_attention["cross_attention"].numpy(), atol=1e-6)
    model = translator.model
    batch, layers, heads, target_length, source_length = served["cross_attention"].shape
    assert (batch, layers, heads) == (len(SENTENCES), model.num_layers, model.num_heads)
    assert (target_length, source_length) == (served["target_tokens"].shape[1], served["source_tokens"].shape[1])
    # The over-long sentence was cut to max_length and still ends with [END].
    long_source = [token for token in served["source_tokens"][4] if token]
    assert len(long_source) == model.max_length and long_source[-1] == b"[END]"

    expected_logits = model((served["source_ids"], served["target_ids"]), training=False).numpy()
    np.testing.assert_allclose(served["logits"], expected_logits, atol=1e-5)
    np.testing.assert_allclose(served["keras_logits"], expected_logits, atol=1e-5)


def test_the_rest_client_body_and_response():
    client = load_example("serving_client")
    body = client.build_rest_body(["Ein Hund.", "Zwei Katzen."])
    assert body == {"signature_name": "serving_default", "instances": ["Ein Hund.", "Zwei Katzen."]}
    # The shape TensorFlow Serving answers a row-format request with: one object a sentence.
    answer = {
        "predictions": [
            {"translation": "A dog.", "score": -0.5, "source_tokens": ["[START]", "Ein", "Hund", ".", "[END]", ""],
             "target_tokens": ["A", "dog", ".", "[END]"], "cross_attention": np.full((1, 2, 4, 6), 0.25).tolist()},
        ]
    }
    (result,) = client.parse_rest_response(json.loads(json.dumps(answer)))
    assert result["translation"] == "A dog." and result["score"] == -0.5
    assert result["source_tokens"] == ["[START]", "Ein", "Hund", ".", "[END]"]
    assert result["cross_attention"].shape == (1, 2, 4, 5)
    assert client.parse_rest_response({"predictions": []}) == []


def test_versions_are_numbered_and_never_overwritten(tmp_path):
    base = tmp_path / "exports"
    for name in ("1", "2", "10", ".3-incomplete-x", "notes"):
        (base / name).mkdir(parents=True)
    assert resolve_export(str(base)) == str(base / "10")  # numeric order, hidden and other names ignored
    with pytest.raises(FileExistsError, match="already exists"):
        export_translator(None, str(base), version=2)
    for bad in (0, -1, "3", 2.0, True):
        with pytest.raises(ValueError, match="version must be a positive integer"):
            export_translator(None, str(base), version=bad)
    with pytest.raises(FileNotFoundError, match="neither a saved_model.pb nor numbered versions"):
        resolve_export(str(tmp_path / "empty"))


@pytest.mark.slow
def test_malformed_requests_are_refused_and_the_serving_process_lives(served):
    """Wrong ranks, mismatched batches and a few hundred random tensors, in a process that must survive.

    Before the signatures checked their inputs, a scalar string crashed the process (SIGSEGV in
    the WordPiece kernel), a `[1, 0]` tensor aborted it, and `[2, 2]` or mismatched id batches
    came back as wrong answers.
    """
    _, report = served  # the fuzz ran in the fresh process of `served`, after its translations

    named = [answer for answer in report if not answer["request"].startswith("random")]
    assert len(named) == 2 * 13
    for answer in named:
        assert answer["answer"] == "InvalidArgumentError", answer
        # The error names the input, the shape it must have and the shape it got.
        message = answer["message"]
        if answer["signature"] == "score_tokens" and "rows" in answer["request"]:
            assert "source_ids and target_ids must hold the same number of rows" in message, message
        elif answer["signature"] == "score_tokens":
            assert "must be an int32 matrix of shape [batch, length]; got shape" in message, message
        else:
            assert "text must be a string vector of shape [batch]; got shape" in message, message

    answers = {answer["answer"] for answer in report}
    assert answers <= {"ok", "InvalidArgumentError", "InternalError", "TypeError", "ValueError"}, answers
    # The fuzzing reached the graph: some random requests were translated, some refused by the checks.
    random_answers = [answer for answer in report if answer["request"].startswith("random")]
    assert sum(answer["answer"] == "ok" for answer in random_answers) >= 10
    assert sum("got shape" in answer.get("message", "") for answer in random_answers) >= 10
    for answer in random_answers:
        if answer["answer"] == "InternalError":  # the Python session client cannot convert the dtype
            assert answer["loader"] == "session" and "Unsupported object type" in answer["message"], answer
