"""A Marian checkpoint as transformers.js reads it, for the browser benchmark only (`benchmarks/web_page.py`).

    ONNX_PYTHON marian_for_transformers_js.py CHECKPOINT_DIR OUT_DIR

Run with a Python that has the ONNX exporter, which needs PyTorch, and onnxslim (BENCHMARKS.md says
how to make it). As transformers.js's own conversion (`scripts/convert.py`) makes a model, with the
differences said where they are:

- `optimum-cli export onnx --task text2text-generation-with-past`: the encoder, and the decoder
  with and without its cache merged into one file, each simplified by onnxslim;
- the q8 files transformers.js loads by default on WebAssembly: dynamic int8 weights with a scale
  per channel, as its `scripts/quantize.py` makes them;
- the `tokenizer.json` its Marian tokenizer needs (`scripts/extra/marian.py`): a Unigram model over
  the checkpoint's vocabulary, each piece scored by the SentencePiece models, with SentencePiece's
  normaliser and `Metaspace` around it.

OUT_DIR is laid out as transformers.js looks for a model: `config.json`, `generation_config.json`,
`tokenizer.json`, `tokenizer_config.json`, `onnx/encoder_model{,_quantized}.onnx`,
`onnx/decoder_model_merged{,_quantized}.onnx`.
"""

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile

import onnxslim


def export_onnx(checkpoint, out):
    with tempfile.TemporaryDirectory() as exported:
        subprocess.run([os.path.join(os.path.dirname(sys.executable), "optimum-cli"), "export", "onnx", "-m",
                        checkpoint, "--task", "text2text-generation-with-past", exported], check=True,
                       stdout=subprocess.DEVNULL)
        os.makedirs(os.path.join(out, "onnx"))
        for name in ("encoder_model.onnx", "decoder_model_merged.onnx"):
            onnxslim.slim(os.path.join(exported, name), os.path.join(out, "onnx", name))
        for name in ("config.json", "generation_config.json"):
            shutil.copy(os.path.join(exported, name), out)


def quantize(out):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    for name in ("encoder_model", "decoder_model_merged"):
        quantize_dynamic(os.path.join(out, "onnx", f"{name}.onnx"), os.path.join(out, "onnx", f"{name}_quantized.onnx"),
                         weight_type=QuantType.QInt8, per_channel=True, reduce_range=True,
                         extra_options={"EnableSubgraph": True, "MatMulConstBOnly": True})


def write_tokenizer(checkpoint, out):
    from sentencepiece import sentencepiece_model_pb2  # the .model files' protobuf (needs protobuf)

    with open(os.path.join(checkpoint, "vocab.json"), encoding="utf-8") as file:
        vocab = json.load(file)
    with open(os.path.join(checkpoint, "config.json"), encoding="utf-8") as file:
        config = json.load(file)
    scores, charsmap, special = {}, None, {"<pad>", "<unk>"}
    for name in ("target.spm", "source.spm"):  # each piece scored by either model, the source's charsmap
        model = sentencepiece_model_pb2.ModelProto()
        with open(os.path.join(checkpoint, name), "rb") as file:
            model.ParseFromString(file.read())
        if model.trainer_spec.model_type != model.trainer_spec.UNIGRAM:
            sys.exit(f"{name} is not a unigram model: transformers.js's Marian tokenizer is one (train with "
                     "--sentencepiece-model unigram)")
        for piece in model.pieces:
            scores[piece.piece] = max(scores.get(piece.piece, piece.score), piece.score)
            # <s>, </s>: SentencePiece's decoding writes nothing for them. transformers.js's script marks
            # the tokenizer's special tokens only, where a run trained here starts decoding from <s>.
            if piece.type == piece.CONTROL:
                special.add(piece.piece)
        charsmap = model.normalizer_spec.precompiled_charsmap
    pieces = sorted(vocab.items(), key=lambda item: item[1])
    tokenizer = {
        "version": "1.0",
        "added_tokens": [{"id": index, "content": piece, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for piece, index in pieces
                         if piece in special],
        "normalizer": {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(charsmap).decode()},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "WhitespaceSplit"},
            {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}]},
        "post_processor": {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}},
                                                                     {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 0}},
                                    {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                           "special_tokens": {"</s>": {"id": "</s>", "ids": [config["eos_token_id"]],
                                                      "tokens": ["</s>"]}}},
        "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
        "model": {"type": "Unigram", "unk_id": vocab["<unk>"], "byte_fallback": False,
                  "vocab": [[piece, 0.0 if piece in special else scores.get(piece, -100.0)]
                            for piece, index in pieces]},
    }
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as file:
        json.dump(tokenizer, file, ensure_ascii=False)
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as file:
        json.dump({"tokenizer_class": "MarianTokenizer", "eos_token": "</s>", "unk_token": "<unk>",
                   "pad_token": "<pad>", "model_max_length": config["max_position_embeddings"]}, file)


def main():
    checkpoint, out = sys.argv[1:3]
    if os.path.exists(out):
        sys.exit(f"{out} already exists")
    export_onnx(checkpoint, out)
    quantize(out)
    write_tokenizer(checkpoint, out)
    print(out)


if __name__ == "__main__":
    main()
