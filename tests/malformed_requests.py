"""Feed an export the requests a careless client or an attacker would send; report what came back.

Works on the translator's export (with `translate_between` where the model is multilingual),
the classifier's (whose only signature is `serving_default`, with the same `text` input) and the
language model's (`serving_default` and `generate`): requests go to the signatures the export has.

Run in its own process (`python malformed_requests.py EXPORT_DIR SEED COUNT OUT.json`), the way
a server holds a model: if any request kills the process, the test that started it sees the
exit status instead of a report. Every request goes through both loaders TensorFlow Serving's
world uses: `tf.saved_model.load` (TF2 functions) and the Session-based loader of
`tf.compat.v1.saved_model` (what `tensorflow_model_server` runs). Only tensorflow and
tensorflow_text are imported, as in a server.
"""

import json
import sys

import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the WordPiece ops

GENERATE_SETTINGS = {
    "seed": np.int64(1), "temperature": np.float32(1), "top_k": np.int32(0), "top_p": np.float32(1),
    "max_new_tokens": np.int32(4),
}

# The requests the issue found fatal or silently wrong, and their neighbours.
NAMED_REQUESTS = {
    "serving_default": {
        "scalar string": {"text": np.array("A dog runs.", object)},
        "[1, 0] strings": {"text": np.zeros([1, 0], object)},
        "[1, 2] strings": {"text": np.array([["A dog.", "A cat."]], object)},
        "[2, 2] strings": {"text": np.array([["A", "B"], ["C", "D"]], object)},
        "[1, 1, 1] strings": {"text": np.array([[["A dog."]]], object)},
    },
    "translate_with_attention": {
        "scalar string": {"text": np.array("A dog runs.", object)},
        "[1, 0] strings": {"text": np.zeros([1, 0], object)},
        "[2, 2] strings": {"text": np.array([["A", "B"], ["C", "D"]], object)},
    },
    # A language model's export: the prompts and five scalar settings.
    "generate": {
        "scalar text": {"text": np.array("A dog", object), **GENERATE_SETTINGS},
        "[1, 2] text": {"text": np.array([["A dog", "A cat"]], object), **GENERATE_SETTINGS},
        "vector seed": {"text": np.array(["A dog"], object), **{**GENERATE_SETTINGS, "seed": np.array([1, 2])}},
        "negative temperature": {
            "text": np.array(["A dog"], object), **{**GENERATE_SETTINGS, "temperature": np.float32(-1)}
        },
        "no new tokens": {"text": np.array(["A dog"], object), **{**GENERATE_SETTINGS, "max_new_tokens": np.int32(0)}},
    },
    # A multilingual checkpoint's export: a language code per text, any code a refusal but the model's.
    "translate_between": {
        "unknown target language": {"text": np.array(["A dog."], object), "source_language": np.array(["en"], object),
                                    "target_language": np.array(["xx"], object)},
        "empty language codes": {"text": np.array(["A dog."], object), "source_language": np.array([""], object),
                                 "target_language": np.array([""], object)},
        "2 codes for 1 text": {"text": np.array(["A dog."], object), "source_language": np.array(["en", "en"], object),
                               "target_language": np.array(["de"], object)},
        "scalar code": {"text": np.array(["A dog."], object), "source_language": np.array("en", object),
                        "target_language": np.array(["de"], object)},
        "[1, 1] codes": {"text": np.array(["A dog."], object), "source_language": np.array([["en"]], object),
                         "target_language": np.array([["de"]], object)},
    },
    "score_tokens": {
        "2 source rows, 1 target row": {
            "source_ids": np.array([[2, 20, 3], [2, 21, 3]], np.int32),
            "target_ids": np.array([[2, 30, 31]], np.int32),
        },
        "1 source row, 2 target rows": {
            "source_ids": np.array([[2, 20, 3]], np.int32),
            "target_ids": np.array([[2, 30], [2, 31]], np.int32),
        },
        "scalar source": {"source_ids": np.array(2, np.int32), "target_ids": np.array([[2, 30]], np.int32)},
        "vector target": {"source_ids": np.array([[2, 20, 3]], np.int32), "target_ids": np.array([2, 30], np.int32)},
        "rank-3 source": {"source_ids": np.zeros([1, 2, 3], np.int32), "target_ids": np.array([[2]], np.int32)},
    },
}


def random_request(random, signature):
    """Random tensors for a signature's inputs: ranks 0-3, zero dimensions, wrong dtypes, random bytes."""
    names = {"score_tokens": ("source_ids", "target_ids"), "generate": ("text", *GENERATE_SETTINGS),
             "translate_between": ("text", "source_language", "target_language")}.get(signature, ("text",))
    request = {name: random_tensor(random) for name in names}
    if signature == "generate" and random.random() < 0.5:
        # Half the time only the prompts are random: the settings are fine, so the prompts are what is tested.
        request.update(GENERATE_SETTINGS)
    return request


def random_tensor(random):
    shape = tuple(int(random.choice([0, 1, 2, 3])) for _ in range(random.integers(0, 4)))
    kind = random.choice(["bytes", "text", "int32", "int64", "float32"])
    if kind == "bytes":
        values = [random.bytes(int(random.integers(0, 40))) for _ in range(int(np.prod(shape)))]
        return np.array(values, object).reshape(shape)
    if kind == "text":
        words = ["Ein", "Hund", "läuft", ".", "", "🙂", "\x00", "[END]", "##en"]
        values = [" ".join(random.choice(words, random.integers(0, 8))) for _ in range(int(np.prod(shape)))]
        return np.array(values, object).reshape(shape)
    if kind == "float32":
        return random.normal(size=shape).astype(np.float32)
    return random.integers(-5, 400, size=shape).astype(kind)


def call_tf2(loaded, signature, inputs):
    function = loaded.signatures[signature]
    try:
        outputs = function(**{name: tf.constant(value) for name, value in inputs.items()})
    except tf.errors.OpError as error:
        return {"answer": type(error).__name__, "message": error.message}
    except (TypeError, ValueError) as error:  # refused by the signature's dtype before the graph ran
        return {"answer": type(error).__name__, "message": str(error)}
    return {"answer": "ok", "shapes": {name: list(value.shape) for name, value in outputs.items()}}


def call_session(session, signature_def, inputs):
    feeds = {signature_def.inputs[name].name: value for name, value in inputs.items()}
    fetches = {name: info.name for name, info in signature_def.outputs.items()}
    try:
        outputs = session.run(fetches, feeds)
    except tf.errors.OpError as error:
        # A dtype the placeholder cannot take fails in the Python client, before the graph runs.
        return {"answer": type(error).__name__, "message": error.message}
    except (TypeError, ValueError) as error:
        return {"answer": type(error).__name__, "message": str(error)}
    return {"answer": "ok", "shapes": {name: list(np.shape(value)) for name, value in outputs.items()}}


def main(export_dir, seed, count, out_path, only=None, loaded=None):
    """Send the named and `count` random requests to every signature of the export (or those in `only`).

    `loaded`: the export as `tf.saved_model.load` gave it, where the caller has it (one load less).
    """
    loaded = loaded or tf.saved_model.load(export_dir)
    random = np.random.default_rng(int(seed))
    signatures = [signature for signature in sorted(NAMED_REQUESTS)
                  if signature in loaded.signatures and (only is None or signature in only)]
    requests = [
        (signature, name, inputs) for signature in signatures for name, inputs in NAMED_REQUESTS[signature].items()
    ]
    for index in range(int(count)):
        signature = signatures[index % len(signatures)]
        requests.append((signature, f"random {index}", random_request(random, signature)))

    graph = tf.Graph()
    session = tf.compat.v1.Session(graph=graph)
    with graph.as_default():
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
    report = []
    for signature, name, inputs in requests:
        shapes = {key: [list(value.shape), str(value.dtype)] for key, value in inputs.items()}
        for loader, answer in (
            ("tf2", lambda: call_tf2(loaded, signature, inputs)),
            ("session", lambda: call_session(session, meta_graph.signature_def[signature], inputs)),
        ):
            # Written before the call: if the process dies, the test shows which request killed it.
            print(json.dumps({"signature": signature, "request": name, "loader": loader, "inputs": shapes}), flush=True)
            report.append({"signature": signature, "request": name, "loader": loader, "inputs": shapes, **answer()})
    with open(out_path, "w", encoding="utf-8") as file:
        json.dump(report, file)


if __name__ == "__main__":
    main(*sys.argv[1:5])
