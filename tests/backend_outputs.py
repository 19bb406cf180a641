"""The outputs of saved models on this process's Keras backend (KERAS_BACKEND).

    python tests/backend_outputs.py MODELS_DIR OUT.npz

For each `NAME.keras` in MODELS_DIR, with its inputs in `NAME.inputs.npz`,
writes the outputs a user relies on: the full pass's logits, the attention
scores, and for a translator the logits of cached decoding, one target token
at a time. Also records whether TensorFlow was imported (it must not be, on
JAX or PyTorch). Used by tests/test_backends.py, which runs it on TensorFlow
and on each other installed backend and compares.
"""

import sys
from pathlib import Path

import keras
import numpy as np
from keras import ops

import keras_transformer as kt


def numpy(tensor):
    return ops.convert_to_numpy(tensor)


def translator_outputs(model, source, target):
    logits, scores = model((source, target), return_attention_scores=True)
    outputs = {"logits": numpy(model((source, target))), "scored_logits": numpy(logits)}
    outputs.update({f"scores/{name}": numpy(value) for name, value in scores.items()})
    # Cached decoding: the encoder once, then the decoder one position at a time.
    memory = model.encode(source)
    cache, source_state = model.build_cache(memory, target.shape[1], kt.layers.padding_mask(source))
    steps = []
    for position in range(target.shape[1]):
        step, cache = model.decode_step(target[:, position : position + 1], cache, position, source_state)
        steps.append(numpy(step))
    outputs["cached_logits"] = np.concatenate(steps, axis=1)
    return outputs


def main(models_dir, out):
    results = {}
    for path in sorted(Path(models_dir).glob("*.keras")):
        name = path.name[: -len(".keras")]
        inputs = np.load(path.with_name(f"{name}.inputs.npz"))
        model = keras.saving.load_model(path)
        if isinstance(model, kt.models.Transformer):
            outputs = translator_outputs(model, inputs["source"], inputs["target"])
        elif isinstance(model, kt.models.MaskedLanguageModel):
            outputs = {"logits": numpy(model(inputs["tokens"])),
                       "hidden_logits": numpy(model((inputs["tokens"], inputs["positions"])))}
        else:
            outputs = {"logits": numpy(model(inputs["tokens"])), "embedding": numpy(model.embed(inputs["tokens"]))}
        results.update({f"{name}/{key}": value for key, value in outputs.items()})
    results["imported_tensorflow"] = np.array("tensorflow" in sys.modules)
    results["backend"] = np.array(keras.backend.backend())
    np.savez(out, **results)


if __name__ == "__main__":
    main(*sys.argv[1:])
