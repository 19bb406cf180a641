"""Our decoding against CTranslate2, the CPU inference engine, on a trained run.

    python benchmarks/ctranslate2_compare.py RUN_DIR [--sentences 256] [--batch-size 32] [--check 200]

1. Convert: the run's `Transformer` and vocabulary to a CTranslate2 model
   (the package's converter, `keras_transformer.export.ctranslate2`).
2. Check: greedy translations of the first `--check` validation sentences,
   ours in float32 and CTranslate2's in float32, token for token.
3. Time: greedy and beam 4, batches of `--batch-size` over the first
   `--sentences` validation sentences (token ids in, token ids out: the
   tokenizers are left out of both; each batch padded to its longest, as a
   server's request is), ours in float32 and in the run's
   precision, CTranslate2 in float32 and int8, both on the same 2 threads;
   three rounds in alternating order after a warm-up, median sentences/s.

Beam search differs in its details between the two (CTranslate2 divides a
hypothesis' log-probability by length^alpha, we by GNMT's ((5 + length) / 6)^alpha,
and it stops once the best beam has finished), so the beam rows compare
speed, not identical output. Prints one JSON line; BENCHMARKS.md has the
figures.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from measure import alternating_rounds  # noqa: E402

THREADS = 2


# -- the converter -------------------------------------------------------------


def to_ctranslate2(model, source_vocab, target_vocab, out_dir, quantization=None):
    """Write `model` as a CTranslate2 model in `out_dir` with the package's converter; returns CTranslate2's version.

    The converter is `keras_transformer.export.ctranslate2.model_spec` (what
    `keras-transformer export --format ctranslate2` writes, tested in
    tests/test_ctranslate2.py); here without the tokenizers, which the
    timing leaves out.
    """
    import ctranslate2

    from keras_transformer.export.ctranslate2 import model_spec

    spec = model_spec(model, source_vocab, target_vocab)
    spec.optimize(quantization=quantization)
    os.makedirs(out_dir, exist_ok=True)
    spec.save(out_dir)
    return ctranslate2.__version__


# -- the contenders --------------------------------------------------------------


def float32_copy(model):
    """The model rebuilt under float32 (a mixed-precision run computes in bfloat16), same weights."""
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")
    try:
        config = model.get_config()
        config.pop("dtype", None)
        copy = model.__class__.from_config(config)
        copy.build(((None, None), (None, None)))
    finally:
        keras.config.set_dtype_policy(previous)
    copy.set_weights(model.get_weights())
    return copy


def our_decoder(model, start_id, end_id, beam_size, length_alpha, max_extra_length):
    """Token ids in, ids out (up to [END]), through our cached search in one `tf.function`."""
    import tensorflow as tf

    from keras_transformer.inference import DecodingSettings, LengthPenalty
    from keras_transformer.inference.steps import transformer_search

    settings = DecodingSettings(beam_size, LengthPenalty(length_alpha), max_extra_length=max_extra_length,
                                max_output_length=model.max_length).for_output(start_id, end_id)
    search = tf.function(lambda source: transformer_search(model, source, settings)[0])
    return lambda batch: _trim(search(tf.constant(batch)).numpy(), end_id)


def padded_to_longest(batch):
    """`batch` without the padding columns no sentence of it needs.

    A server pads each request's sentences to the request's longest (the
    export's tokenizer does); ids cut from a larger tokenized set carry that
    set's width, and our encoder would compute those columns (CTranslate2
    gets each sentence's own tokens).
    """
    return batch[:, : max(1, int((batch != 0).sum(axis=1).max()))]


def _trim(tokens, end_id):
    """Each row's ids up to (not including) [END] or padding."""
    rows = []
    for row in tokens:
        ids = []
        for token in row:
            if token in (0, end_id):
                break
            ids.append(int(token))
        rows.append(ids)
    return rows


def ctranslate2_decoder(model_dir, compute_type, vocabs, beam_size, length_alpha, max_extra_length, max_length):
    """Token ids in, ids out, through a CTranslate2 `Translator` (`vocabs`: source and target token lists)."""
    import ctranslate2

    translator = ctranslate2.Translator(
        model_dir, device="cpu", compute_type=compute_type, inter_threads=1, intra_threads=THREADS
    )
    source_vocab, target_vocab = vocabs
    index = {token: position for position, token in enumerate(target_vocab)}

    def decode(batch):
        sources = [[source_vocab[token] for token in row if token != 0] for row in batch]
        results = translator.translate_batch(
            sources, beam_size=beam_size, length_penalty=length_alpha if beam_size > 1 else 0,
            # As ours: the source's length plus max_extra_length, at most the position table's
            # (one setting for the whole batch here, per sentence in ours: the same unless a
            # translation runs that long).
            max_decoding_length=min(len(batch[0]) + max_extra_length, max_length), min_decoding_length=0,
        )
        return [[index[token] for token in result.hypotheses[0]] for result in results]

    return decode


def time_rounds(contenders, batches, rounds=3):
    """`{name: median sentences/s}`: each contender translates every batch once a round, in turn."""
    for decode in contenders.values():
        decode(batches[0])  # warm-up: tracing, loading

    def job(decode):  # the sentences it translated
        return lambda: sum(len(decode(batch)) for batch in batches)

    seconds, counts = alternating_rounds({name: job(decode) for name, decode in contenders.items()}, rounds)
    return {name: statistics.median(counts[name] / value for value in seconds[name]) for name in contenders}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--check", type=int, default=200, help="sentences whose greedy translations must agree")
    arguments = parser.parse_args()

    import tensorflow as tf

    from keras_transformer.runs import translation

    tf.config.threading.set_intra_op_parallelism_threads(THREADS)
    translator = translation.load_translator(arguments.run_dir)
    config = translation.load_config(arguments.run_dir)
    source_tokenizer, target_tokenizer = translator.source_tokenizer, translator.target_tokenizer
    pairs = translation.load_pairs(config["data"], ("val",))["val"]
    count = max(arguments.sentences, arguments.check)
    source_ids = translator.source_ids(tf.constant([source for source, _ in pairs[:count]])).numpy()
    batches = [
        padded_to_longest(source_ids[start: start + arguments.batch_size])
        for start in range(0, count, arguments.batch_size)
    ]
    timed = batches[: -(-arguments.sentences // arguments.batch_size)]
    model32 = float32_copy(translator.model)
    start_id, end_id = target_tokenizer.start_id, target_tokenizer.end_id
    alpha, extra = translator.settings.length_penalty.alpha, translator.settings.max_extra_length

    with tempfile.TemporaryDirectory() as work:
        converted = os.path.join(work, "ct2")
        version = to_ctranslate2(model32, source_tokenizer.vocab, target_tokenizer.vocab, converted)
        ours_greedy = our_decoder(model32, start_id, end_id, 1, alpha, extra)
        vocabs = (source_tokenizer.vocab, target_tokenizer.vocab)
        theirs_greedy = ctranslate2_decoder(converted, "float32", vocabs, 1, alpha, extra, model32.max_length)
        checked = [(row, ours, theirs) for batch in batches[: -(-arguments.check // arguments.batch_size)]
                   for row, ours, theirs in zip(batch, ours_greedy(batch), theirs_greedy(batch))][: arguments.check]
        differing = [index for index, (_, ours, theirs) in enumerate(checked) if ours != theirs]

        result = {
            "ctranslate2": version, "threads": THREADS, "sentences": arguments.sentences,
            "batch_size": arguments.batch_size, "checked": len(checked), "greedy_differing": len(differing),
            "first_differing": differing[:5], "precision": config["training"]["precision"],
        }
        for beam_size in (1, 4):
            contenders = {
                "ours_float32": our_decoder(model32, start_id, end_id, beam_size, alpha, extra),
                "ours_" + config["training"]["precision"]: our_decoder(
                    translator.model, start_id, end_id, beam_size, alpha, extra
                ),
            }
            for compute_type in ("float32", "int8"):
                contenders[f"ctranslate2_{compute_type}"] = ctranslate2_decoder(
                    converted, compute_type, vocabs, beam_size, alpha, extra, model32.max_length
                )
            rates = time_rounds(contenders, timed)
            search = "greedy" if beam_size == 1 else f"beam{beam_size}"
            result[search] = {name: round(rate, 1) for name, rate in rates.items()}
            result[search]["ours_float32_over_ctranslate2_float32"] = round(
                rates["ours_float32"] / rates["ctranslate2_float32"], 3
            )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
