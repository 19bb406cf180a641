"""An imported run's translator in float32 against the same weights held in bfloat16: the speed a
lower precision buys, and what it costs in identical outputs.

    python benchmarks/pretrained_bfloat16.py WORK/run   # the run pretrained_vs_hf.py imported under its --work

Why: BENCHMARKS.md's pretrained rows are float32, Hugging Face's outputs to the last digit, and
1.3x its `generate`, short of the 2x aimed at (docs/pretrained.md, "Not yet"). The step's matmuls
are most of its time; a CPU with native bfloat16 runs them faster, on half the bytes. This measures
how far that goes. The same `Translator` (the export's search) runs both models in one process,
rounds alternating, on `--sentences` Multi30k validation sentences in batches of 32, `--threads`
intra-op threads. Prints a JSON summary: sentences per second for each (the best round), the ratio
within each round, and how many sentences got the very same tokens. On a CPU without native
bfloat16 (`training.precision.NATIVE_BFLOAT16_CPU_FLAGS`) bfloat16 is emulated and slower.
"""

import argparse
import json
import os

from measure import alternating_rounds

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.environ.get("KERAS_TRANSFORMER_DATA", os.path.join(HERE, "..", "..", "shared", "data"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=2)
    arguments = parser.parse_args()

    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(arguments.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    from keras_transformer import inference
    from keras_transformer.runs import translation
    from keras_transformer.training.precision import NATIVE_BFLOAT16_CPU_FLAGS, cpu_flags

    path = os.path.join(DATA, "multi30k", "val.en")
    sentences = open(path, encoding="utf-8").read().splitlines()[: arguments.sentences]
    batches = [tf.constant(sentences[start:start + arguments.batch_size])
               for start in range(0, len(sentences), arguments.batch_size)]
    summary = {"native_bfloat16": bool(set(NATIVE_BFLOAT16_CPU_FLAGS) & cpu_flags()), "threads": arguments.threads,
               "sentences": len(sentences), "batch_size": arguments.batch_size}

    for beam_size in (1, 4):
        float32 = translation.load_translator(arguments.run_dir, beam_size=beam_size)
        config = translation.load_config(arguments.run_dir)
        source_tokenizer, target_tokenizer = translation.tokenizers(arguments.run_dir, config["tokenizer"])
        policy = keras.config.dtype_policy()
        keras.config.set_dtype_policy("bfloat16")  # weights and arithmetic in bfloat16, no casts per step
        try:
            model = translation.build_model(config, source_tokenizer.vocab_size, target_tokenizer.vocab_size)
        finally:
            keras.config.set_dtype_policy(policy)
        model.set_weights(float32.model.get_weights())
        bfloat16 = inference.Translator(model, source_tokenizer, target_tokenizer, float32.settings)

        def job(translator):  # the tokens of every batch
            return lambda: [translator(batch)["tokens"].numpy() for batch in batches]

        jobs = {"float32": job(float32), "bfloat16": job(bfloat16)}
        for translate in jobs.values():
            translate()  # warm-up: traces
        seconds, outputs = alternating_rounds(jobs, arguments.rounds)
        tokens_32, tokens_16 = outputs["float32"], outputs["bfloat16"]
        rounds = [(len(sentences) / f32, len(sentences) / b16)
                  for f32, b16 in zip(seconds["float32"], seconds["bfloat16"])]
        same = sum(list(a[a != 0]) == list(b[b != 0])  # rows without their padding
                   for batch_32, batch_16 in zip(tokens_32, tokens_16) for a, b in zip(batch_32, batch_16))
        speeds_32, speeds_16 = zip(*rounds)
        summary[f"beam{beam_size}"] = {"float32": round(max(speeds_32), 1), "bfloat16": round(max(speeds_16), 1),
                                       "ratio_per_round": [round(b16 / f32, 2) for f32, b16 in rounds],
                                       "same_tokens": f"{same} of {len(sentences)}"}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
