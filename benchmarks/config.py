"""The benchmark's model size, and the arithmetic of its FLOPs: no framework imported here.

(PyTorch and TensorFlow cannot share a process: both bundle LLVM, whose
command-line options clash. So the PyTorch row imports only this module.)
"""

import numpy as np

SMALL = {
    "vocab_size": 8000,  # source and target vocabularies alike
    "d_model": 256,
    "num_layers": 3,
    "num_heads": 8,
    "d_ff": 512,
    "dropout": 0.1,
    "batch_size": 64,
    "source_length": 32,
    "target_length": 32,
}

KERAS_CONTENDERS = ("keras_transformer", "keras_hub", "tutorial")


def sinusoids(length, depth):
    """The sinusoidal table, `(length, depth)`, sines in the first half and cosines in the second."""
    positions = np.arange(length)[:, None]
    rates = 1.0 / (10000 ** (np.arange(depth // 2)[None, :] / (depth / 2)))
    angles = positions * rates
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1).astype("float32")


# -- FLOPs -------------------------------------------------------------------


def training_flops_per_batch(config=SMALL):
    """Matmul FLOPs of one training step: 3 x the forward pass (backward = 2 x forward).

    Forward multiply-adds, with d = d_model, f = d_ff, S/T source/target
    lengths, V the vocabulary, per sentence:

        encoder layer:  S (4 d^2 + 2 d f) + 2 S^2 d          projections, FFN; Q K^T and A V
        decoder layer:  T (4 d^2 + 2 d f) + 2 T^2 d          self-attention and FFN
                      + T 2 d^2 + S 2 d^2 + 2 T S d          cross-attention (K, V from the source)
        output layer:   T d V

    and FLOPs = 2 x multiply-adds. Embedding lookups, softmax, LayerNorm and
    the optimizer are not matmuls and are not counted (they are the overhead
    the roofline percentage exposes).
    """
    d, f, vocab = config["d_model"], config["d_ff"], config["vocab_size"]
    source, target = config["source_length"], config["target_length"]
    encoder = source * (4 * d * d + 2 * d * f) + 2 * source * source * d
    decoder = (
        target * (4 * d * d + 2 * d * f)
        + 2 * target * target * d
        + target * 2 * d * d
        + source * 2 * d * d
        + 2 * target * source * d
    )
    output = target * d * vocab
    multiply_adds = config["num_layers"] * (encoder + decoder) + output
    return 3 * 2 * multiply_adds * config["batch_size"]


def matmul_shapes(config=SMALL):
    """The (m, k, n) matmuls that dominate a training step, with the FLOP share of each."""
    d, f, vocab = config["d_model"], config["d_ff"], config["vocab_size"]
    tokens = config["batch_size"] * config["target_length"]
    return {
        "output projection": (tokens, d, vocab),
        "feed-forward in": (tokens, d, f),
        "feed-forward out": (tokens, f, d),
        "attention projection": (tokens, d, d),
    }
