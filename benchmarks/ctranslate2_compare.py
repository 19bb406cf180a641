"""Our decoding against CTranslate2, the CPU inference engine, on a trained run.

    python benchmarks/ctranslate2_compare.py RUN_DIR [--sentences 256] [--batch-size 32] [--check 200]

1. Convert: the run's `Transformer` and vocabulary to a CTranslate2 model
   (`to_ctranslate2`, benchmark-only: the original post-norm architecture
   with ReLU and sinusoidal positions; anything else is refused by name).
2. Check: greedy translations of the first `--check` validation sentences,
   ours in float32 and CTranslate2's in float32, token for token.
3. Time: greedy and beam 4, batches of `--batch-size` over the first
   `--sentences` validation sentences (token ids in, token ids out: the
   tokenizers are left out of both), ours in float32 and in the run's
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
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

THREADS = 2


# -- the converter -------------------------------------------------------------


def to_ctranslate2(model, source_vocab, target_vocab, out_dir, quantization=None):
    """Write `model` (a float32 `keras_transformer.models.Transformer`) as a CTranslate2 model in `out_dir`.

    Our weights map one to one onto CTranslate2's `TransformerSpec` with
    `pre_norm=False`: Keras kernels are (in, out), CTranslate2's linear
    weights (out, in); a self-attention's Q, K and V are one fused linear
    (Q, K, V stacked), a cross-attention's K and V another. Two settings do
    not default to ours and are given: LayerNorm's epsilon (1e-6, its
    default is 1e-5) and the position table (ours interleaves sines and
    cosines from position 0; its own table concatenates them from 1).
    """
    import ctranslate2
    from ctranslate2.specs import common_spec, transformer_spec

    from keras_transformer.layers.positional import positional_encoding

    unsupported = {
        "norm_first": model.norm_first, "position": model.position != "sinusoidal",
        "activation": model.activation != "relu", "sliding_window": model.sliding_window is not None,
        "cross_attention_window": model.cross_attention_window is not None,
    }
    unsupported = [name for name, value in unsupported.items() if value]
    if unsupported:
        raise ValueError(f"the converter handles the original architecture only; this model sets {unsupported}")

    def array(variable):
        return np.array(variable.numpy(), dtype=np.float32)  # a copy: int8 quantizes in place

    def linear(spec, kernel, bias):
        spec.weight = np.ascontiguousarray(kernel.T)
        spec.bias = bias

    def norm(spec, layer):
        spec.gamma, spec.beta = array(layer.gamma), array(layer.beta)

    def attention(spec, sublayer, fused_query):
        weights = sublayer.attention
        d_model = weights.output_dim
        query = array(weights.query_kernel).reshape(d_model, -1)
        key_value = array(weights.key_value_kernel).reshape(d_model, 2, -1)
        query_bias = array(weights.query_bias).reshape(-1)
        key_value_bias = array(weights.key_value_bias).reshape(2, -1)
        output = array(weights.output_kernel).reshape(-1, d_model)
        kernels = [query, key_value[:, 0], key_value[:, 1]]
        biases = [query_bias, key_value_bias[0], key_value_bias[1]]
        if fused_query:  # self-attention: one linear for Q, K and V
            linear(spec.linear[0], np.concatenate(kernels, axis=1), np.concatenate(biases))
            linear(spec.linear[1], output, array(weights.output_bias))
        else:  # cross-attention: Q from the decoder, K and V from the encoder's output
            linear(spec.linear[0], query, query_bias)
            linear(spec.linear[1], np.concatenate(kernels[1:], axis=1), np.concatenate(biases[1:]))
            linear(spec.linear[2], output, array(weights.output_bias))
        norm(spec.layer_norm, sublayer.norm)

    def feed_forward(spec, sublayer):
        network = sublayer.feed_forward
        linear(spec.linear_0, array(network.hidden.kernel), array(network.hidden.bias))
        linear(spec.linear_1, array(network.projection.kernel), array(network.projection.bias))
        norm(spec.layer_norm, sublayer.norm)

    spec = transformer_spec.TransformerSpec.from_config(
        model.num_layers, model.num_heads, pre_norm=False, activation=common_spec.Activation.RELU
    )
    spec.config.layer_norm_epsilon = model.epsilon
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = "[UNK]", "[START]", "[END]"
    spec.config.decoder_start_token = "[START]"
    positions = positional_encoding(model.max_length, model.d_model)
    spec.encoder.embeddings[0].weight = array(model.encoder.embedding.token_embedding.embeddings)
    spec.decoder.embeddings.weight = array(model.decoder.embedding.token_embedding.embeddings)
    spec.encoder.position_encodings.encodings = positions
    spec.decoder.position_encodings.encodings = positions.copy()
    for layer_spec, layer in zip(spec.encoder.layer, model.encoder.encoder_layers):
        attention(layer_spec.self_attention, layer.self_attention, fused_query=True)
        feed_forward(layer_spec.ffn, layer.feed_forward)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder.decoder_layers):
        attention(layer_spec.self_attention, layer.self_attention, fused_query=True)
        attention(layer_spec.attention, layer.cross_attention_block, fused_query=False)
        feed_forward(layer_spec.ffn, layer.feed_forward)
    if model.tie_output:
        spec.decoder.projection.weight = array(model.decoder.embedding.token_embedding.embeddings)
        spec.decoder.projection.bias = array(model.output_bias)
    else:
        linear(spec.decoder.projection, array(model.output_projection.kernel), array(model.output_projection.bias))
    spec.register_source_vocabulary(list(source_vocab))
    spec.register_target_vocabulary(list(target_vocab))
    spec.validate()
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

    from keras_transformer.inference.steps import transformer_search

    search = tf.function(
        lambda source: transformer_search(
            model, source, start_id, end_id, beam_size=beam_size, length_alpha=length_alpha,
            max_extra_length=max_extra_length, max_output_length=model.max_length,
        )[0]
    )
    return lambda batch: _trim(search(tf.constant(batch)).numpy(), end_id)


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
    """`{name: median sentences/s}`: each contender translates every batch once a round, the order alternating."""
    for decode in contenders.values():
        decode(batches[0])  # warm-up: tracing, loading
    rates = {name: [] for name in contenders}
    names = list(contenders)
    for round_index in range(rounds):
        for name in names if round_index % 2 == 0 else names[::-1]:
            started = time.perf_counter()
            sentences = sum(len(contenders[name](batch)) for batch in batches)
            rates[name].append(sentences / (time.perf_counter() - started))
    return {name: statistics.median(values) for name, values in rates.items()}


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
    batches = [source_ids[start: start + arguments.batch_size] for start in range(0, count, arguments.batch_size)]
    timed = batches[: -(-arguments.sentences // arguments.batch_size)]
    model32 = float32_copy(translator.model)
    start_id, end_id = target_tokenizer.start_id, target_tokenizer.end_id
    alpha, extra = translator.length_alpha, translator.max_extra_length

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
