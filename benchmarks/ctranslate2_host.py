"""CTranslate2 as its users run it: pieces from the host's tokenizer library, no TensorFlow in the process.

`HostTokenizedCTranslate2(ct2_dir, tokenizers_dir, threads)` translates
with a `--format ctranslate2` export, its texts segmented and its outputs
decoded by the tokenizers of the same run's builtin LiteRT export
(`keras_transformer.device_tokenizers`: SentencePiece's `sentencepiece`
package, WordPiece's `tokenizers`), framed and limited as
`export.ctranslate2.CTranslate2Translator` frames and limits them, with the
same search settings. What `benchmarks/litert.py`'s `ctranslate2_host` roads
time; the translations are the TensorFlow-tokenized road's (the benchmark
prints both).
"""

import json
import os

import ctranslate2

from keras_transformer import device_tokenizers


class HostTokenizedCTranslate2:
    def __init__(self, ct2_dir, tokenizers_dir, threads):
        with open(os.path.join(ct2_dir, "keras_transformer.json"), encoding="utf-8") as file:
            self.settings = json.load(file)
        with open(os.path.join(tokenizers_dir, "litert.json"), encoding="utf-8") as file:
            recorded = json.load(file)["tokenizers"]
        self.source = device_tokenizers.load(tokenizers_dir, recorded["source"])
        self.target = device_tokenizers.load(tokenizers_dir, recorded["target"])
        self.source_tokens = _vocabulary(ct2_dir, "source")
        self.target_ids = {token: index for index, token in enumerate(_vocabulary(ct2_dir, "target"))}
        if isinstance(self.source, device_tokenizers.SentencePieceOnDevice):  # as `SentencePieceTokenizer` frames
            framing = self.source.settings
            self.leading = [framing["start_token"]] if framing.get("start_token") else []
            self.leading += list(framing.get("prefix_tokens", []))
            self.end = framing["end_token"]
        else:  # WordPiece: [START] pieces [END]
            self.leading, self.end = ["[START]"], "[END]"
        self.prefix = [self.settings["forced_first_token"]] if self.settings.get("forced_first_token") else None
        self.translator = ctranslate2.Translator(ct2_dir, device="cpu", inter_threads=1, intra_threads=threads)

    def translate(self, texts, beam_size=1):
        """One translation per text: each output within its own limit, as `CTranslate2Translator._decode`."""
        longest, settings = self.settings["max_source_length"], self.settings
        sources = []
        for pieces in self.source.pieces(texts):
            tokens = self.leading + [self.source_tokens[index] for index in pieces] + [self.end]
            sources.append(tokens[: longest - 1] + tokens[-1:] if len(tokens) > longest else tokens)
        limits = [min(len(source) + settings["max_extra_length"], settings["max_output_length"])
                  - bool(settings.get("end_at_limit")) for source in sources]  # a forced [END] at the limit: one less
        groups = {max(limits): list(range(len(sources)))} if beam_size == 1 else {}
        for index, limit in enumerate(limits if beam_size > 1 else []):
            groups.setdefault(limit, []).append(index)
        hypotheses = [None] * len(sources)
        for limit, indices in groups.items():
            results = self.translator.translate_batch(
                [sources[index] for index in indices], beam_size=beam_size, max_decoding_length=limit,
                length_penalty=settings["length_alpha"] if beam_size > 1 else 0, min_decoding_length=0,
                suppress_sequences=[[token] for token in settings.get("never_tokens", [])],
                target_prefix=[self.prefix] * len(indices) if self.prefix else None)
            for index, result in zip(indices, results):
                hypotheses[index] = result.hypotheses[0][: limits[index]]
        return [self.target.text([self.target_ids[token] for token in hypothesis]) for hypothesis in hypotheses]


def _vocabulary(ct2_dir, side):
    """A side's tokens in id order: its own file, or the one both sides share (a shared Marian vocabulary)."""
    for name in (f"{side}_vocabulary.json", "shared_vocabulary.json"):
        if os.path.exists(os.path.join(ct2_dir, name)):
            with open(os.path.join(ct2_dir, name), encoding="utf-8") as file:
                return json.load(file)
    raise FileNotFoundError(f"{ct2_dir} has no {side} vocabulary")
