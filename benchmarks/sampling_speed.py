"""Cached sampling from a GPT-style model: ours against keras-hub's `GPT2CausalLM.generate`, at equal size.

    python benchmarks/sampling_speed.py                 # both sizes, greedy and top-k
    python benchmarks/sampling_speed.py --sizes small --repeats 3

Each size is built twice, randomly initialised: keras-hub's `GPT2Backbone`
inside a `GPT2CausalLM` without a preprocessor, and our `LanguageModel` with
GPT-2's layout (pre-LN, GELU, learned positions, tied output). Both take the
same integer prompts (`--batch` rows of `--prompt` tokens) and write
`--new` tokens each, ids in and ids out (no tokenizer on either side), in
float32 on the TensorFlow backend:

- ours: `inference.sample` on `language_model_step`'s key/value cache inside
  one `tf.function` (what `Generator` and the export run);
- keras-hub: `GPT2CausalLM.generate({"token_ids", "padding_mask"},
  stop_token_ids=None)` with its sampler compiled in, as keras-hub compiles
  it by default on TensorFlow (`tf.function(jit_compile=...)`: XLA unless
  the model was compiled with `jit_compile=False`); `--keras-hub-no-xla`
  adds a row without XLA, `--ours-xla` one of ours under XLA.

Neither stops early: random weights never pick a stop token on purpose, and
keras-hub is given no stop token. A call is timed after one warm-up call
(tracing, compilation); the figure is the median of `--repeats` calls, in
new tokens per second, and the ratio ours / keras-hub is taken within the
same run. Prints one JSON object per row and a summary.
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

SIZES = {
    # The recipe's scale, in GPT-2's layout.
    "small": dict(num_layers=4, d_model=256, num_heads=4, d_ff=1024, vocab_size=8000, max_length=256),
    # GPT-2's smallest: 124M parameters.
    "gpt2-small": dict(num_layers=12, d_model=768, num_heads=12, d_ff=3072, vocab_size=50257, max_length=1024),
}


def prompts(batch, length, vocab_size, seed=0):
    return np.random.default_rng(seed).integers(10, vocab_size, (batch, length)).astype("int32")


def ours(size, batch, prompt_length, new_tokens, mode, jit_compile=False):
    import keras_transformer as kt
    from keras_transformer.inference import SamplingSettings, language_model_prefill, language_model_step, sample
    from keras_transformer.inference.decoding import Decoding

    keras.utils.set_random_seed(0)
    model = kt.models.LanguageModel(**size, dropout=0.0, norm_first=True, activation="gelu", position="learned")
    model.build((None, None))
    settings = dict(temperature=0) if mode == "greedy" else dict(temperature=1.0, top_k=50, seed=1)
    lengths = tf.fill([batch], prompt_length)

    # TensorFlow's writes in place, as the Generator's; under XLA, the scatter (inference.decoding).
    cache_policy = Decoding(in_place=not jit_compile).cache_policy(rows_per_source=1)

    @tf.function(jit_compile=jit_compile)
    def generate(token_ids):
        step_fn, cache = language_model_step(model, batch, prompt_length + new_tokens, cache_policy=cache_policy)
        # End id -1: no token ends a text, as keras-hub is given no stop token.
        return sample(step_fn, cache, token_ids, lengths, -1, SamplingSettings(new_tokens, **settings),
                      prefill_fn=language_model_prefill(model, cache_policy))[0]

    return model.count_params(), lambda token_ids: generate(tf.constant(token_ids))


def keras_hub_contender(size, batch, prompt_length, new_tokens, mode, jit_compile=True):
    import keras_hub

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=size["vocab_size"], num_layers=size["num_layers"], num_heads=size["num_heads"],
        hidden_dim=size["d_model"], intermediate_dim=size["d_ff"], dropout=0.0,
        max_sequence_length=size["max_length"],
    )
    causal_lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    sampler = "greedy" if mode == "greedy" else keras_hub.samplers.TopKSampler(k=50, seed=1)
    causal_lm.compile(sampler=sampler, jit_compile=jit_compile)
    total = prompt_length + new_tokens
    mask = np.zeros((batch, total), bool)
    mask[:, :prompt_length] = True

    def generate(token_ids):
        padded = np.zeros((batch, total), "int32")
        padded[:, :prompt_length] = token_ids
        return causal_lm.generate({"token_ids": padded, "padding_mask": mask}, stop_token_ids=None)

    return causal_lm.count_params(), generate


def timed(generate, token_ids, repeats):
    generate(token_ids)  # tracing and compilation
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = generate(token_ids)
        np.asarray(result["token_ids"] if isinstance(result, dict) else result)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["small", "gpt2-small"])
    parser.add_argument("--modes", nargs="+", choices=["greedy", "top-k"], default=["greedy", "top-k"])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens per row")
    parser.add_argument("--new", type=int, default=64, help="new tokens per row")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--keras-hub-no-xla", action="store_true", help="also time keras-hub without XLA")
    parser.add_argument("--ours-xla", action="store_true", help="also time ours compiled with XLA")
    arguments = parser.parse_args()
    contenders = {"ours": ours, "keras_hub": keras_hub_contender}
    if arguments.ours_xla:
        contenders["ours_xla"] = lambda *args: ours(*args, jit_compile=True)
    if arguments.keras_hub_no_xla:
        contenders["keras_hub_no_xla"] = lambda *args: keras_hub_contender(*args, jit_compile=False)
    summary = []
    for size_name in arguments.sizes:
        size = SIZES[size_name]
        token_ids = prompts(arguments.batch, arguments.prompt, size["vocab_size"])
        for mode in arguments.modes:
            rates = {}
            for name, build in contenders.items():
                parameters, generate = build(size, arguments.batch, arguments.prompt, arguments.new, mode)
                median, seconds = timed(generate, token_ids, arguments.repeats)
                rates[name] = arguments.batch * arguments.new / median
                print(json.dumps({"size": size_name, "mode": mode, "contender": name, "parameters": parameters,
                                  "new_tokens_per_second": round(rates[name], 1),
                                  "seconds": [round(value, 3) for value in seconds]}), flush=True)
                keras.backend.clear_session()
            summary.append({"size": size_name, "mode": mode, "ours / keras_hub": round(rates["ours"] / rates["keras_hub"], 2),
                            **{name: round(rate, 1) for name, rate in rates.items()}})
    print(json.dumps({"summary": summary, "batch": arguments.batch, "prompt": arguments.prompt, "new": arguments.new},
                     indent=1))


if __name__ == "__main__":
    main()
