"""One benchmark row per process; prints its result as one JSON line.

    python benchmarks/rows.py train  --model keras_transformer --dtype bfloat16 [--jit] [--stock]
    python benchmarks/rows.py decode --model keras_transformer --search greedy [--no-cache] [--jit]
    python benchmarks/rows.py decode --model keras_hub --driver while_loop [--jit]
    python benchmarks/rows.py roofline

`suite.py` runs every row in its own process, so that each starts from a
fresh TensorFlow (no dtype policy, XLA cache or memory left over) and its
peak resident memory is its own; it passes `--conducted` and tells the row
when to time each window (`measure.ConductedWindows`).
"""

import argparse
import json
import os
import sys
import time

import numpy as np

from config import KERAS_CONTENDERS, SMALL, matmul_shapes, training_flops_per_batch
from measure import ConductedWindows, SteadyStateWindows, peak_memory_mib


def random_batches(config, count=8, seed=0):
    """`count` batches of (source, target input, target output) token ids, none of them padding."""
    rng = np.random.default_rng(seed)
    batch, source_length, target_length = config["batch_size"], config["source_length"], config["target_length"]
    batches = []
    for _ in range(count):
        source = rng.integers(1, config["vocab_size"], (batch, source_length), dtype=np.int32)
        target = rng.integers(1, config["vocab_size"], (batch, target_length + 1), dtype=np.int32)
        batches.append((source, target[:, :-1], target[:, 1:]))
    return batches


def windows_from(args, units_per_step):
    if args.conducted:
        return ConductedWindows(units_per_step, window_seconds=args.window_seconds)
    return SteadyStateWindows(units_per_step, windows=args.windows, window_seconds=args.window_seconds)


# -- training ----------------------------------------------------------------


def train_row(args):
    config = SMALL
    tokens_per_step = config["batch_size"] * config["target_length"]
    windows = windows_from(args, tokens_per_step)
    batches = random_batches(config)
    started = time.perf_counter()
    if args.model == "torch":
        import torch

        torch.set_num_threads(os.cpu_count())
        from torch_contender import train_steps

        parameters = train_steps(args.dtype, batches, windows)
    else:
        parameters = _train_keras(args, config, batches, windows)
    result = windows.result()
    flops = training_flops_per_batch(config)
    return {
        "kind": "train",
        "model": args.model,
        "dtype": args.dtype,
        "jit": args.jit,
        "stock": args.stock,
        "tokens_per_s": result["rate"],
        "window_rates": result["window_rates"],
        "window_steps": result["window_steps"],
        "model_gflops": result["rate"] / tokens_per_step * flops / 1e9,
        "flops_per_step": flops,
        "parameters": int(parameters),
        "seconds": time.perf_counter() - started,
    }


def _train_keras(args, config, batches, windows):
    import keras
    import tensorflow as tf

    from contenders import build_keras_model, build_loss, build_optimizer
    from keras_transformer.training import build_optimizer_variables

    if args.dtype == "bfloat16":
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    keras.utils.set_random_seed(0)
    model = build_keras_model(args.model, config)
    model.compile(
        optimizer=build_optimizer(args.model, stock=args.stock),
        loss=build_loss(args.model, stock=args.stock),
        jit_compile=args.jit,
    )
    # Every Keras row makes its weights and Adam's moments before `fit`; left
    # to fit, they are created while its first step is traced, ~10 s slower.
    if not model.built:
        model.build(((None, None), (None, None)))
    build_optimizer_variables(model)
    sources, inputs, outputs = (np.stack(parts) for parts in zip(*batches))
    dataset = (
        tf.data.Dataset.from_tensor_slices(((sources, inputs), outputs))
        .repeat()
        .prefetch(tf.data.AUTOTUNE)
    )

    class StopWhenMeasured(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if windows.step_done():
                self.model.stop_training = True

    model.fit(dataset, epochs=1, steps_per_epoch=1_000_000, callbacks=[StopWhenMeasured()], verbose=0, shuffle=False)
    return model.count_params()


# -- decoding ----------------------------------------------------------------

DECODE_BATCH, DECODE_SOURCE_LENGTH, NEW_TOKENS = 32, 32, 32


def decode_row(args):
    import keras
    import tensorflow as tf

    if args.dtype == "bfloat16":
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    keras.utils.set_random_seed(0)
    config = SMALL
    rng = np.random.default_rng(1)
    source = tf.constant(rng.integers(1, config["vocab_size"], (DECODE_BATCH, DECODE_SOURCE_LENGTH), dtype=np.int32))
    if args.model == "keras_transformer":
        decode = _our_decoder(args, config)
    elif args.model == "keras_hub":
        decode = _keras_hub_decoder(args, config)
    else:
        raise ValueError(f"no decoding row for {args.model!r}")
    windows = windows_from(args, DECODE_BATCH)
    started = time.perf_counter()
    while True:
        tokens = decode(source)
        tokens.numpy()
        if windows.step_done():
            break
    if tokens.shape[1] != NEW_TOKENS:
        raise RuntimeError(f"{args.model} generated {tokens.shape[1]} tokens, not {NEW_TOKENS}")
    result = windows.result()
    return {
        "kind": "decode",
        "model": args.model,
        "dtype": args.dtype,
        "search": args.search,
        "cache": not args.no_cache,
        "jit": args.jit,
        "driver": args.driver if args.model == "keras_hub" else None,
        "sentences_per_s": result["rate"],
        "window_rates": result["window_rates"],
        "window_steps": result["window_steps"],
        "seconds": time.perf_counter() - started,
    }


def _our_decoder(args, config):
    import tensorflow as tf

    from contenders import build_keras_model
    from keras_transformer.inference import DecodingSettings
    from keras_transformer.inference.steps import transformer_search

    model = build_keras_model("keras_transformer", config)
    # [END] is an id the model never produces, so every sentence runs the full NEW_TOKENS steps.
    settings = DecodingSettings(
        beam_size=1 if args.search == "greedy" else args.beam_size, max_extra_length=NEW_TOKENS,
        max_output_length=NEW_TOKENS,
    ).for_output(start_id=1, end_id=-1)
    return tf.function(lambda source: transformer_search(
        model, source, settings, use_cache=not args.no_cache, static_shapes=args.jit,  # XLA: fixed shapes
    )[0], jit_compile=args.jit)


def _keras_hub_decoder(args, config):
    """keras-hub's cached decoding: `TransformerDecoder` caches driven by its `GreedySampler`.

    `args.driver == "while_loop"`: the same caches and step in a plain
    `tf.while_loop` that takes the argmax, keras-hub's layers at their best
    (the sampler also computes probabilities and checks for end tokens at
    every step).
    """
    import keras_hub
    import tensorflow as tf
    from keras import ops

    from contenders import build_keras_model, keras_hub_parts

    if args.search != "greedy" or args.no_cache:
        raise ValueError("the keras-hub row is cached greedy decoding")
    model = build_keras_model("keras_hub", config)
    source_embedding, target_embedding, encoders, decoders, logits_layer = keras_hub_parts(model, config)
    heads, head_dim = config["num_heads"], config["d_model"] // config["num_heads"]
    sampler = keras_hub.samplers.GreedySampler()

    def generate(source):
        batch = ops.shape(source)[0]
        encoded = source_embedding(source)
        for encoder in encoders:
            encoded = encoder(encoded)
        # keras-hub caches are (batch, 2, length, heads, head_dim); its models
        # stack one per layer on axis 1 and carry them through the sampler.
        self_caches = ops.zeros((batch, config["num_layers"], 2, NEW_TOKENS + 1, heads, head_dim))
        empty_cross_cache = ops.zeros((batch, 2, DECODE_SOURCE_LENGTH, heads, head_dim))
        # The source keys and values are projected once, by a first call at index 0.
        cross_caches = []
        hidden = target_embedding(ops.ones((batch, 1), "int32"))
        for index, decoder in enumerate(decoders):
            hidden, _, cross_cache = decoder(
                hidden,
                encoded,
                self_attention_cache=self_caches[:, index],
                self_attention_cache_update_index=0,
                cross_attention_cache=empty_cross_cache,
                cross_attention_cache_update_index=0,
            )
            cross_caches.append(cross_cache)

        def next_token(prompt, cache, index):
            hidden = target_embedding(ops.slice(prompt, [0, index - 1], [batch, 1]), start_index=index - 1)
            updated = []
            for layer, decoder in enumerate(decoders):
                hidden, self_cache, _ = decoder(
                    hidden,
                    encoded,
                    self_attention_cache=cache[:, layer],
                    self_attention_cache_update_index=index - 1,
                    cross_attention_cache=cross_caches[layer],
                    cross_attention_cache_update_index=None,
                )
                updated.append(self_cache)
            return logits_layer(hidden)[:, 0], None, ops.stack(updated, axis=1)

        start = ops.ones((batch, 1), "int32")
        prompt = ops.concatenate([start, ops.zeros((batch, NEW_TOKENS), "int32")], axis=1)
        if args.driver == "sampler":
            return sampler(next_token, prompt, cache=self_caches, index=1)[:, 1:]

        def body(index, prompt, cache):
            logits, _, cache = next_token(prompt, cache, index)
            best = ops.cast(ops.argmax(logits, axis=-1), "int32")
            return index + 1, ops.slice_update(prompt, [0, index], best[:, None]), cache

        _, prompt, _ = tf.while_loop(lambda index, *_: index <= NEW_TOKENS, body, (1, prompt, self_caches))
        return prompt[:, 1:]

    return tf.function(generate, jit_compile=args.jit)


# -- the roofline ------------------------------------------------------------


def roofline_row(args):
    """Matmul GFLOP/s of this machine at the model's own matrix shapes, float32 and bfloat16."""
    import tensorflow as tf

    results = {}
    for dtype in ("float32", "bfloat16"):
        for name, (m, k, n) in matmul_shapes().items():
            left = tf.random.normal((m, k), dtype=tf.float32)
            right = tf.random.normal((k, n), dtype=tf.float32)
            left, right = tf.cast(left, dtype), tf.cast(right, dtype)
            multiply = tf.function(lambda a, b: tf.matmul(a, b))
            multiply(left, right).numpy()
            flops = 2 * m * k * n
            repeats = max(1, int(2e10 // flops))  # about 20 GFLOP per timing
            timings = []
            for _ in range(5):
                started = time.perf_counter()
                for _ in range(repeats):
                    product = multiply(left, right)
                product.numpy()
                timings.append(time.perf_counter() - started)
            timings.sort()
            results[f"{dtype}/{name}"] = {
                "shape": [m, k, n],
                "gflops": repeats * flops / timings[len(timings) // 2] / 1e9,
            }
    return {"kind": "roofline", "matmuls": results}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kind", choices=["train", "decode", "roofline"])
    parser.add_argument("--model", choices=[*KERAS_CONTENDERS, "torch"], default="keras_transformer")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--jit", action="store_true", help="jit_compile=True (XLA)")
    parser.add_argument("--search", choices=["greedy", "beam"], default="greedy")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--no-cache", action="store_true", help="recompute the prefix at every step")
    parser.add_argument("--stock", action="store_true", help="train: Keras' Adam and sparse cross-entropy, any model")
    parser.add_argument(
        "--driver", choices=["sampler", "while_loop"], default="sampler",
        help="decode, keras_hub: its GreedySampler, or a plain tf.while_loop around the same step",
    )
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--window-seconds", type=float, default=10.0)
    parser.add_argument(
        "--conducted", action="store_true", help="time a window each time stdin says `window` (how suite.py runs rows)"
    )
    args = parser.parse_args(argv)
    row = {"train": train_row, "decode": decode_row, "roofline": roofline_row}[args.kind](args)
    row["peak_memory_mib"] = peak_memory_mib()
    print(json.dumps(row), flush=True)
    # The row is measured and reported, with nothing left to save: leave
    # without the interpreter's teardown, which took 9-11 s per process for
    # the keras-hub and tutorial rows (1.4 s for ours), 45 s of every training
    # group's wall time when the suite ended its rows together.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
