"""Training and decoding speed on a GPU, with Keras' JAX backend: ours, keras-hub's layers, PyTorch.

    KERAS_BACKEND=jax python benchmarks/gpu.py [--out gpu.json]          # on the GPU machine
    KERAS_BACKEND=jax python benchmarks/gpu.py --tiny --precision float32  # a CPU check of the script

Needs no TensorFlow: keras and this package (keras-hub and PyTorch for their
rows; a row whose library is missing is reported as skipped). Every row of
one run shares the machine, the configuration and the batches:

* `peak`: the measured bfloat16 matrix-product rate (a chain of square
  matmuls, n = 8192), the denominator of model FLOPs utilisation;
* `train`: target tokens/s of a compiled training step (Adam, cross-entropy
  from logits) of the paper's "base" size (6+6 layers, d_model 512, 8 heads,
  d_ff 2048, untied 32k vocabulary), on batches of 200 sentence pairs of
  128 + 128 tokens (25,600 target tokens, the paper's ~25k-token batch),
  in mixed bfloat16, for our `Transformer`, keras-hub's
  `TransformerEncoder`/`TransformerDecoder` stack of the same size, and
  (in its own process) `torch.compile(nn.Transformer)`; MFU = matmul FLOPs
  of the step (benchmarks/config.py) / time / peak;
* `decode`: sentences/s of cached greedy and beam-4 decoding of 64 source
  sentences of 32 tokens, 32 new tokens each, for our decoder and
  keras-hub's, both driven by the same search in `jax.lax.while_loop`
  (`keras.ops.while_loop`) and compiled whole with `jax.jit`.

With `--tiny` the sizes shrink to seconds on a CPU, and the script checks
what it measures: cached greedy decoding of our model gives the tokens that
re-running the full model on the prefix gives. It prints one JSON line.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402

from config import training_flops_per_batch  # noqa: E402

BASE = {
    "vocab_size": 32000, "d_model": 512, "num_layers": 6, "num_heads": 8, "d_ff": 2048, "dropout": 0.1,
    "batch_size": 200, "source_length": 128, "target_length": 128,
}
TINY = {
    "vocab_size": 300, "d_model": 32, "num_layers": 2, "num_heads": 2, "d_ff": 64, "dropout": 0.1,
    "batch_size": 8, "source_length": 12, "target_length": 12,
}
DECODE = {"batch": 64, "source_length": 32, "new_tokens": 32, "beam_size": 4}
TINY_DECODE = {"batch": 4, "source_length": 7, "new_tokens": 6, "beam_size": 3}
START_ID = 1
PEAK_SIZE, TINY_PEAK_SIZE = 8192, 256


def timed(run, seconds, min_calls=3):
    """Calls per second of `run()` (which must block until done), after one untimed warm-up call."""
    run()
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < seconds:
        run()
        calls += 1
    return calls / (time.perf_counter() - start)


# -- the matmul peak ---------------------------------------------------------


def matmul_peak(size, seconds):
    """Measured bfloat16 FLOP/s of chained (size x size) matmuls."""
    import jax
    import jax.numpy as jnp

    chain = 8
    left = jax.random.normal(jax.random.key(0), (size, size), jnp.bfloat16)
    right = jax.random.normal(jax.random.key(1), (size, size), jnp.bfloat16) / size**0.5

    @jax.jit
    def chained(matrix):
        for _ in range(chain):
            matrix = matrix @ right
        return matrix

    rate = timed(lambda: chained(left).block_until_ready(), seconds)
    return rate * chain * 2 * size**3


# -- training ----------------------------------------------------------------


def batches(config, count=4, seed=0):
    rng = np.random.default_rng(seed)
    shape = (config["batch_size"], config["target_length"] + 1)
    result = []
    for _ in range(count):
        source = rng.integers(3, config["vocab_size"], (config["batch_size"], config["source_length"]), dtype="int32")
        target = rng.integers(3, config["vocab_size"], shape, dtype="int32")
        result.append(((source, target[:, :-1]), target[:, 1:]))
    return result


def keras_training_rate(name, config, seconds):
    """Target tokens/s of `train_on_batch` (a jitted step) for a Keras contender."""
    import keras

    from contenders import build_keras_model

    model = build_keras_model(name, config)
    model.compile(optimizer=keras.optimizers.Adam(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
    data, done = batches(config), [0]

    def step():
        inputs, labels = data[done[0] % len(data)]
        done[0] += 1
        model.train_on_batch(inputs, labels)  # returns its logs as numbers: the step has finished

    steps_per_s = timed(step, seconds)
    return steps_per_s * config["batch_size"] * config["target_length"], model.count_params()


def torch_training_rate(config, seconds, precision, compile_model):
    """The same for `nn.Transformer` (benchmarks/torch_contender.py), on CUDA when there is one."""
    import torch

    from torch_contender import TorchTranslator, training_step

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = TorchTranslator(config).to(device)
    model.train()
    step_model = torch.compile(model) if compile_model else model
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "mixed_bfloat16")
    data = [tuple(torch.from_numpy(array).long().to(device) for array in (inputs[0], inputs[1], labels))
            for inputs, labels in batches(config)]
    done = [0]

    def step():
        done[0] += 1
        training_step(step_model, optimizer, autocast, *data[done[0] % len(data)])

    steps_per_s = timed(step, seconds)
    parameters = sum(parameter.numel() for parameter in model.parameters())
    return steps_per_s * config["batch_size"] * config["target_length"], parameters, device


# -- decoding ----------------------------------------------------------------


def search(step, cache, reorder, batch, beam_size, new_tokens):
    """Greedy (`beam_size=1`) or beam search for `new_tokens` tokens, in `keras.ops.while_loop`.

    `step(tokens (rows,), cache, index) -> (logits (rows, vocab), cache)`
    decodes one position for `rows = batch * beam_size` hypotheses;
    `reorder(cache, rows)` gathers the caches of the surviving beams. No
    end token, no length penalty: every sentence gets `new_tokens` tokens,
    so each contender does the same work.
    """
    from keras import ops

    rows = batch * beam_size
    # Only the first beam of each sentence is live at the start.
    scores = ops.tile(ops.convert_to_tensor([0.0] + [-1e9] * (beam_size - 1)), (batch,))
    state = (0, ops.full((rows,), START_ID, "int32"), scores, ops.zeros((rows, new_tokens), "int32"), cache)

    def body(index, tokens, scores, output, cache):
        logits, cache = step(tokens, cache, index)
        if beam_size == 1:
            tokens = ops.cast(ops.argmax(logits, axis=-1), "int32")
        else:
            vocab = ops.shape(logits)[-1]
            candidates = ops.log_softmax(ops.cast(logits, "float32"), axis=-1) + scores[:, None]
            scores, best = ops.top_k(ops.reshape(candidates, (batch, beam_size * vocab)), beam_size)
            origin = ops.reshape(ops.arange(batch)[:, None] * beam_size + best // vocab, (-1,))
            cache, output = reorder(cache, origin), ops.take(output, origin, axis=0)
            tokens, scores = ops.cast(ops.reshape(best % vocab, (-1,)), "int32"), ops.reshape(scores, (-1,))
        output = ops.slice_update(output, (0, index), tokens[:, None])
        return index + 1, tokens, scores, output, cache

    return ops.while_loop(lambda index, *_: index < new_tokens, body, state)[3]


def our_generate(model, beam_size, new_tokens):
    """Cached decoding with our `Transformer`: `source (batch, length) -> tokens (batch * beams, new_tokens)`."""
    from keras import ops

    from keras_transformer.layers import padding_mask

    def generate(source):
        batch = ops.shape(source)[0]
        source = ops.repeat(source, beam_size, axis=0)  # beams folded into the batch
        memory = model.encode(source)
        cache, source_state = model.build_cache(memory, new_tokens, padding_mask(source))

        def step(tokens, cache, index):
            logits, cache = model.decode_step(tokens[:, None], cache, index, source_state)
            return logits[:, 0], cache

        def reorder(cache, rows):
            # Self-attention caches are (keys, values) of (rows, heads, length, key_dim); a sentence's
            # beams share its source, so the source's keys and values need no reordering.
            return [tuple(ops.take(part, rows, axis=0) for part in layer) for layer in cache]

        return search(step, cache, reorder, batch, beam_size, new_tokens)

    return generate


def keras_hub_generate(model, config, beam_size, new_tokens, source_length):
    """The same with keras-hub's `TransformerDecoder` caches (as in benchmarks/rows.py)."""
    from keras import ops

    from contenders import keras_hub_parts

    source_embedding, target_embedding, encoders, decoders, logits_layer = keras_hub_parts(model, config)
    heads, head_dim = config["num_heads"], config["d_model"] // config["num_heads"]

    def generate(source):
        batch = ops.shape(source)[0]
        source = ops.repeat(source, beam_size, axis=0)
        rows = batch * beam_size
        encoded = source_embedding(source)
        for encoder in encoders:
            encoded = encoder(encoded)
        # keras-hub caches are (rows, 2, length, heads, head_dim), one per layer;
        # a first call at index 0 projects each layer's source keys and values.
        self_caches = [ops.zeros((rows, 2, new_tokens, heads, head_dim), encoded.dtype) for _ in decoders]
        empty_cross = ops.zeros((rows, 2, source_length, heads, head_dim), encoded.dtype)
        hidden, cross_caches = target_embedding(ops.full((rows, 1), START_ID, "int32")), []
        for layer, decoder in enumerate(decoders):
            hidden, _, cross_cache = decoder(hidden, encoded, self_attention_cache=self_caches[layer],
                                             self_attention_cache_update_index=0, cross_attention_cache=empty_cross,
                                             cross_attention_cache_update_index=0)
            cross_caches.append(cross_cache)

        def step(tokens, cache, index):
            hidden = target_embedding(tokens[:, None], start_index=index)
            updated = []
            for layer, decoder in enumerate(decoders):
                hidden, self_cache, _ = decoder(hidden, encoded, self_attention_cache=cache[layer],
                                                self_attention_cache_update_index=index,
                                                cross_attention_cache=cross_caches[layer],
                                                cross_attention_cache_update_index=None)
                updated.append(self_cache)
            return ops.cast(logits_layer(hidden)[:, 0], "float32"), updated

        def reorder(cache, rows):
            return [ops.take(layer, rows, axis=0) for layer in cache]

        return search(step, self_caches, reorder, batch, beam_size, new_tokens)

    return generate


def compiled(model, function):
    """`function` under `jax.jit`, with the model's weights as arguments (not baked-in constants)."""
    import jax
    import keras

    variables = model.variables

    @jax.jit
    def run(values, *arguments):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return function(*arguments)

    values = [variable.value for variable in variables]
    return lambda *arguments: run(values, *arguments)


def decoding_rate(generate, source, seconds):
    return timed(lambda: np.asarray(generate(source)), seconds) * source.shape[0]


def check_cached_greedy(model, source, tokens):
    """Our cached greedy tokens are the argmax of the full model on each prefix.

    One teacher-forced pass gives them all: the decoder is causal, so position
    t's logits are those of the prefix [START] + tokens[:t] alone (and one
    shape is compiled once, where re-running each prefix compiled one per length).
    """
    from keras import ops

    prefixes = np.concatenate([np.full((source.shape[0], 1), START_ID, "int32"), tokens[:, :-1]], axis=1)
    logits = ops.convert_to_numpy(model((source, prefixes))).astype("float32")
    chosen = logits.argmax(-1)
    # A random model's two best logits can tie to rounding, and the two passes round differently:
    # where the picks differ, ours must be within rounding of the best.
    shortfall = logits.max(-1) - np.take_along_axis(logits, tokens[..., None].astype("int64"), -1)[..., 0]
    # The search has no end token, so a random model may emit 0, the padding id: the full pass then
    # masks that position as padding where the cached step read it as a token. Compare each row up
    # to its first 0.
    after_padding = np.cumsum(prefixes == 0, axis=1) > 0
    if (np.where(after_padding, 0, shortfall) > 1e-4 * np.abs(logits).max()).any():
        raise AssertionError(f"cached greedy decoding differs from the full pass:\n{tokens}\n{chosen}")


# -- the run -----------------------------------------------------------------


def versions():
    found = {}
    for name in ("keras", "jax", "keras_hub", "torch"):
        try:
            found[name] = __import__(name).__version__
        except ImportError:
            found[name] = None
    return found


def device_name():
    import jax

    device = jax.devices()[0]
    return f"{device.platform}: {getattr(device, 'device_kind', device)}"


def torch_row(arguments, config):
    """Run the PyTorch row in its own process (PyTorch and JAX each want the GPU's memory)."""
    command = [sys.executable, __file__, "--torch-row", "--precision", arguments.precision,
               "--seconds", str(arguments.seconds)] + (["--tiny"] if arguments.tiny else [])
    command += [] if arguments.torch_compile else ["--no-torch-compile"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        return {"skipped": (result.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: a check of the script on a CPU")
    parser.add_argument("--precision", default="mixed_bfloat16", choices=("float32", "mixed_bfloat16"))
    parser.add_argument("--seconds", type=float, default=20.0, help="least time each row is timed")
    parser.add_argument("--no-torch-compile", dest="torch_compile", action="store_false")
    parser.add_argument("--torch-row", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help="also write the JSON here")
    arguments = parser.parse_args()
    config = dict(TINY if arguments.tiny else BASE)
    flops = training_flops_per_batch(config)
    if arguments.torch_row:
        rate, parameters, device = torch_training_rate(config, arguments.seconds, arguments.precision,
                                                       arguments.torch_compile)
        print(json.dumps({"tokens_per_s": rate, "parameters": parameters, "device": device,
                          "compiled": arguments.torch_compile}))
        return

    import keras

    if keras.backend.backend() != "jax":
        sys.exit(f"gpu.py: run it with KERAS_BACKEND=jax (this process uses {keras.backend.backend()})")
    report = {"device": device_name(), "versions": versions(), "precision": arguments.precision, "config": config,
              "decode_config": TINY_DECODE if arguments.tiny else DECODE}
    peak = matmul_peak(TINY_PEAK_SIZE if arguments.tiny else PEAK_SIZE, arguments.seconds / 4)
    report["peak_bf16_flops"] = peak
    keras.config.set_dtype_policy(arguments.precision)

    train = {}
    for name in ("keras_transformer", "keras_hub"):
        try:
            rate, parameters = keras_training_rate(name, config, arguments.seconds)
        except ImportError as error:
            train[name] = {"skipped": str(error)}
            continue
        train[name] = {"tokens_per_s": rate, "parameters": parameters,
                       "mfu": rate / (config["batch_size"] * config["target_length"]) * flops / peak}
    torch = torch_row(arguments, config)
    if "tokens_per_s" in torch:
        torch["mfu"] = torch["tokens_per_s"] / (config["batch_size"] * config["target_length"]) * flops / peak
    train["torch_nn_transformer"] = torch
    report["train"] = train

    decode_config = report["decode_config"]
    rng = np.random.default_rng(1)
    source = rng.integers(3, config["vocab_size"], (decode_config["batch"], decode_config["source_length"]),
                          dtype="int32")
    decode = {}
    from contenders import build_keras_model

    for name in ("keras_transformer", "keras_hub"):
        try:
            model = build_keras_model(name, config)
        except ImportError as error:
            decode[name] = {"skipped": str(error)}
            continue
        model((source[:1], source[:1, :2]))  # built, outside the compiled search
        rates = {}
        for search_name, beam_size in (("greedy", 1), ("beam", decode_config["beam_size"])):
            if name == "keras_transformer":
                function = our_generate(model, beam_size, decode_config["new_tokens"])
            else:
                function = keras_hub_generate(model, config, beam_size, decode_config["new_tokens"],
                                              decode_config["source_length"])
            generate = compiled(model, function)
            if arguments.tiny and name == "keras_transformer" and beam_size == 1:
                check_cached_greedy(model, source, np.asarray(generate(source)))
                report["checked"] = "cached greedy decoding equals the full pass"
            rates[f"{search_name}_sentences_per_s"] = decoding_rate(generate, source, arguments.seconds)
        decode[name] = rates
    report["decode"] = decode

    line = json.dumps(report)
    if arguments.out:
        Path(arguments.out).write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
