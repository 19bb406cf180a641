"""M2M100 checkpoints (Hugging Face `M2M100ForConditionalGeneration`, fairseq's many-to-many model) as our Transformer.

M2M100 differs from Marian (and the paper) where fairseq does, each an option of ours:

    pre-LN layers, a LayerNorm after each stack   norm_first=True (the stacks' final_norm)
    fairseq's sinusoids, first position 2         position=POSITIONS (blocked, from 2, to 1/base)
    decoding starts from </s>                     the target tokenizer's start token
    the target language is the first output       the target tokenizer's prefix, forced at step 0
    no output bias                                output_bias zeros

Its tokenizer is one SentencePiece model (`sentencepiece.bpe.model`) with a
fairseq dictionary (`vocab.json`: <s> <pad> </s> <unk>, then the pieces);
the language codes `__en__`, `__de__`, ... follow the dictionary, in
fairseq's order, then eight "madeup words" fill the model's vocabulary.
A source is `__src__ pieces </s>`; a target `__tgt__ pieces </s>`.

NLLB is the same model with another tokenizer (`NllbTokenizer`): a BPE
SentencePiece model whose pieces `tokenizer.json` numbers, and 202 codes
such as `eng_Latn` among its added tokens, framed the same way.
"""

import json
import re


from keras_transformer.pretrained import settings
from keras_transformer.pretrained.checkpoint import ADDED_TOKENS, SPECIAL_TOKENS_MAP, CheckpointError, read_json_file
from keras_transformer.pretrained.weights import SHARED_EMBEDDINGS, assign_all, model_weights, shared_embeddings_name
from keras_transformer.text.sentencepiece import SentencePieceSettings, SentencePieceTokenizer

MODEL_TYPE = "m2m_100"
SPM, VOCAB, TOKENIZER_CONFIG, TOKENIZER_JSON = (
    "sentencepiece.bpe.model", "vocab.json", "tokenizer_config.json", "tokenizer.json"
)
NLLB_TOKENIZERS = ("NllbTokenizer", "NllbTokenizerFast")
NLLB_LANGUAGE = re.compile(r"^[a-z]{3}_[A-Z][a-z]{3}$")  # eng_Latn, zho_Hans, ...
TOKENIZER_FILES = f"{SPM} and {VOCAB}"
# Everything the tokenizer reads (M2M100's or NLLB's), as `save_pretrained` writes it.
CHECKPOINT_FILES = (SPM, VOCAB, TOKENIZER_JSON, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, ADDED_TOKENS)
# fairseq's sinusoids (`layers.positional.positional_encoding`): every sine before every cosine, the
# first token at position 2 (its padding id + 1), frequencies from 1 down to exactly 1/10000.
POSITIONS = {"columns": "blocked", "first_position": 2, "frequency_spacing": "i/(d/2-1)"}
# fairseq's language codes, in the order that numbers them after the dictionary (the tokenizer's
# `language_codes` setting names the list).
LANGUAGE_CODES = {
    "m2m100": (
        "af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd gl gu ha he hi hr "
        "ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg mk ml mn mr ms my ne nl no ns oc or "
        "pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw ta th tl tn tr uk ur uz vi wo xh yi yo zh zu"
    ).split(),
    "wmt21": "en ha is ja cs ru zh de".split(),
}


def transformer_settings(config):
    """`models.Transformer` arguments for an M2M100 `config.json` (refused in one line where ours cannot follow)."""
    return settings.transformer_settings(config, norm_first=True, position=POSITIONS)


def _language_token(code, codes, side):
    if code not in codes:
        raise CheckpointError(f"--{side}-lang {code}: this model's languages are {', '.join(codes)}")
    return f"__{code}__"


def tokenizers(directory, config, source_lang=None, target_lang=None):
    """`(source, target)` `SentencePieceTokenizer`s that give the ids `M2M100Tokenizer` gives.

    `source_lang`, `target_lang`: fairseq codes ("en", "de"); default the
    tokenizer's `src_lang` and `tgt_lang`. Every output starts with the
    target language's token (Hugging Face's `forced_bos_token_id`).
    """
    tokenizer_config = read_json_file(directory, TOKENIZER_CONFIG, required=False)
    if tokenizer_config.get("tokenizer_class") in NLLB_TOKENIZERS:
        return _nllb_tokenizers(directory, config, tokenizer_config, source_lang, target_lang)
    codes = LANGUAGE_CODES.get(tokenizer_config.get("language_codes", "m2m100"))
    if codes is None:
        raise CheckpointError(f"language_codes={tokenizer_config['language_codes']!r} is not supported")
    source_lang = source_lang or tokenizer_config.get("src_lang") or "en"
    target_lang = target_lang or tokenizer_config.get("tgt_lang")
    if not target_lang:
        raise CheckpointError("an M2M100 model translates into the language it is told: give --target-lang")
    dictionary = settings.read_vocab(directory, VOCAB)
    language_tokens = [f"__{code}__" for code in codes]
    madeup = [f"madeupword{index:04d}" for index in range(config["vocab_size"] - len(dictionary) - len(codes))]
    vocab = dictionary + language_tokens + madeup
    if len(vocab) != config["vocab_size"]:
        raise CheckpointError(
            f"{VOCAB} and the language codes make {len(vocab)} tokens but the model has {config['vocab_size']}"
        )
    model = settings.read_bytes(directory, SPM, TOKENIZER_FILES)
    special = dict(
        unk_token=tokenizer_config.get("unk_token", "<unk>"), end_token=tokenizer_config.get("eos_token", "</s>"),
        pad_token=tokenizer_config.get("pad_token", "<pad>"),
        # Dropped from decoded text, as transformers 4 did (5.24 leaves "__de__" in it).
        special_tokens=("<s>", *language_tokens),
        # What a request may name in an export's `translate_between`: the codes, as --target-lang takes them.
        languages={code: token for code, token in zip(codes, language_tokens)},
    )
    source = SentencePieceTokenizer(model, vocab, SentencePieceSettings(
        prefix_tokens=(_language_token(source_lang, codes, "source"),), **special))
    target = SentencePieceTokenizer(model, vocab, SentencePieceSettings(
        start_token=vocab[config["decoder_start_token_id"]],
        prefix_tokens=(_language_token(target_lang, codes, "target"),), **special))
    return source, target


def _nllb_tokenizers(directory, config, tokenizer_config, source_lang, target_lang):
    """NLLB's `(source, target)`: the SentencePiece model segments, `tokenizer.json` numbers the pieces."""
    if tokenizer_config.get("legacy_behaviour"):
        raise CheckpointError("legacy_behaviour=true (the language code after </s>) is not supported")
    numbered = read_json_file(directory, TOKENIZER_JSON)
    try:
        ids = dict(numbered["model"]["vocab"])
        added = {token["content"]: token for token in numbered["added_tokens"]}
    except (KeyError, TypeError):
        raise CheckpointError(f"{TOKENIZER_JSON} has no model vocabulary and added tokens") from None
    ids.update({content: token["id"] for content, token in added.items()})
    vocab = [f"<unused{index}>" for index in range(config["vocab_size"])]  # ids no token names
    for token, index in ids.items():
        if not 0 <= index < len(vocab):
            raise CheckpointError(f"{TOKENIZER_JSON} numbers {token!r} {index}, beyond the model's {len(vocab)} ids")
        vocab[index] = token
    specials = [content for content, token in added.items() if token.get("special")]
    languages = [token for token in specials if NLLB_LANGUAGE.match(token)]

    def language(code, side):
        if code not in languages:
            raise CheckpointError(f"--{side}-lang {code}: this model's languages are {', '.join(languages[:8])}, ...")
        return code

    source_lang = language(source_lang or tokenizer_config.get("src_lang") or "eng_Latn", "source")
    target_lang = target_lang or tokenizer_config.get("tgt_lang")
    if not target_lang:
        raise CheckpointError("an NLLB model translates into the language it is told: give --target-lang (e.g. deu_Latn)")
    target_lang = language(target_lang, "target")
    model = settings.read_bytes(directory, SPM, f"{SPM} and {TOKENIZER_JSON}")
    # tokenizers' pipeline around the BPE: Metaspace splits at every space; the normalizer may collapse runs.
    normalizers = json.dumps(numbered.get("normalizer"))
    special = dict(unk_token="<unk>", end_token="</s>", pad_token="<pad>", special_tokens=tuple(specials),
                   strip_trailing_space=False, word_by_word=True, collapse_spaces=" {2,}" in normalizers,
                   languages={code: code for code in languages})
    source = SentencePieceTokenizer(model, vocab, SentencePieceSettings(prefix_tokens=(source_lang,), **special))
    target = SentencePieceTokenizer(model, vocab, SentencePieceSettings(
        start_token=vocab[config["decoder_start_token_id"]], prefix_tokens=(target_lang,), **special))
    return source, target


def weights(model, shared_name=SHARED_EMBEDDINGS):
    """Every variable of `model` (built with `transformer_settings`) with its checkpoint tensors (`weights.Weight`).

    The stacks' final LayerNorms are `model.encoder.layer_norm` and
    `model.decoder.layer_norm`; there is no output bias (ours stays zeros).
    """
    return model_weights(model, output_bias=None, final_norms=True, shared_name=shared_name)


def assign_weights(model, read, config):
    """Copy the checkpoint's tensors (`read(name)`) into `model`, built with `transformer_settings(config)`."""
    assign_all(weights(model, shared_embeddings_name(read)), read)
