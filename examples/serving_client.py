"""Translate through TensorFlow Serving, over gRPC or REST.

Start the server on an export (see docs/serving.md), then:

    python examples/serving_client.py "Ein Mann fährt Fahrrad." "Zwei Hunde spielen."
    python examples/serving_client.py --attention "Ein Mann fährt Fahrrad."
    python examples/serving_client.py --rest http://localhost:8501 "Ein Mann fährt Fahrrad."

gRPC needs `pip install tensorflow-serving-api` (the `serving` extra); REST
needs nothing beyond the standard library. Request building and response
parsing are plain functions, so they are tested without a server.
"""

import argparse
import json
import sys
import urllib.request

import numpy as np

MODEL_NAME = "translator"


# -- gRPC ---------------------------------------------------------------------


def build_predict_request(texts, model_name=MODEL_NAME, signature_name="serving_default", version=None):
    """A `PredictRequest` carrying `texts` as the string tensor `text` of shape [batch]."""
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature_name
    if version is not None:
        request.model_spec.version.value = version
    encoded = [text.encode("utf-8") if isinstance(text, str) else bytes(text) for text in texts]
    request.inputs["text"].CopyFrom(tf.make_tensor_proto(encoded, dtype=tf.string, shape=[len(encoded)]))
    return request


def parse_predict_response(response):
    """A `PredictResponse` -> one dict per sentence (see `_per_sentence`)."""
    import tensorflow as tf

    outputs = {name: tf.make_ndarray(tensor) for name, tensor in response.outputs.items()}
    return _per_sentence(outputs)


def predict_grpc(texts, server="localhost:8500", signature_name="serving_default", timeout=30.0):
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    with grpc.insecure_channel(server) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Predict(build_predict_request(texts, signature_name=signature_name), timeout)
    return parse_predict_response(response)


# -- REST ---------------------------------------------------------------------


def build_rest_body(texts, signature_name="serving_default"):
    """The JSON body of `POST /v1/models/<name>:predict` (row format: one instance a sentence)."""
    return {"signature_name": signature_name, "instances": list(texts)}


def parse_rest_response(body):
    """The JSON answer (`{"predictions": [...]}`, one object a sentence) -> one dict per sentence."""
    predictions = body["predictions"]
    if not predictions:
        return []
    columns = {name: np.array([row[name] for row in predictions]) for name in predictions[0]}
    return _per_sentence(columns)


def predict_rest(texts, server="http://localhost:8501", signature_name="serving_default", timeout=30.0):
    request = urllib.request.Request(
        f"{server}/v1/models/{MODEL_NAME}:predict",
        data=json.dumps(build_rest_body(texts, signature_name)).encode("utf-8"),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return parse_rest_response(json.load(answer))


# -- both ---------------------------------------------------------------------


def _text(value):
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _per_sentence(outputs):
    """Columns of outputs -> `[{"translation", "score"[, "source_tokens", "target_tokens", "cross_attention"]}]`.

    Token lists lose their "" padding; each attention map is cut to
    `(layers, heads, len(target_tokens), len(source_tokens))`.
    """
    results = []
    for row in range(len(outputs["translation"])):
        result = {"translation": _text(outputs["translation"][row]), "score": float(outputs["score"][row])}
        if "cross_attention" in outputs:
            source = [_text(token) for token in outputs["source_tokens"][row] if _text(token)]
            target = [_text(token) for token in outputs["target_tokens"][row] if _text(token)]
            attention = np.asarray(outputs["cross_attention"][row], dtype=np.float32)
            result.update(
                source_tokens=source,
                target_tokens=target,
                cross_attention=attention[:, :, : len(target), : len(source)],
            )
        results.append(result)
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description="Translate with a TensorFlow Serving translator.")
    parser.add_argument("sentences", nargs="+")
    parser.add_argument("--grpc", default="localhost:8500", help="gRPC address (default localhost:8500)")
    parser.add_argument("--rest", help="use REST at this URL instead, e.g. http://localhost:8501")
    parser.add_argument("--attention", action="store_true", help="ask for translate_with_attention")
    arguments = parser.parse_args(argv)
    signature = "translate_with_attention" if arguments.attention else "serving_default"
    if arguments.rest:
        results = predict_rest(arguments.sentences, arguments.rest, signature)
    else:
        results = predict_grpc(arguments.sentences, arguments.grpc, signature)
    for result in results:
        print(result["translation"])
        if arguments.attention:
            # Each target token with the source token it attended to most (last layer, heads averaged).
            weights = result["cross_attention"][-1].mean(axis=0)
            for token, row in zip(result["target_tokens"], weights):
                print(f"  {token:>15} <- {result['source_tokens'][int(row.argmax())]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
