"""Text in, text out: tokenizer + search + detokenizer in one graph.

`Translator` is a `tf.Module`, so the very object the CLI and the callbacks
use can be saved as a SavedModel: the graph holds the WordPiece ops, the
cached search and the detokenizer, and needs no Python to run.
"""

import dataclasses
import functools

import numpy as np
import tensorflow as tf

from keras_transformer.lines import Answers, answer_each

from keras_transformer.inference.settings import DecodingSettings
from keras_transformer.inference.steps import output_length_cap, transformer_search
from keras_transformer.inference.tracing import graph_function
from keras_transformer.models.attention_maps import (
    CROSS,
    attention_map_names,
    parse_attention_map_name,
    queries_and_keys,
)


class Translator(tf.Module):
    """Translate strings with a trained `Transformer` and its tokenizers.

    Args:
        model: a `keras_transformer.models.Transformer`.
        source_tokenizer, target_tokenizer: `keras_transformer.text` tokenizers.
        settings: the `inference.DecodingSettings` (default: the paper's,
            beam 4 and length penalty 0.6); a pretrained checkpoint's bring
            its own token rules. `translator.settings` holds them with the
            target tokenizer's [START] and [END] and the output cap.

    Call arguments:
        texts: `(batch,)` strings.

    Returns:
        `{"translation": (batch,) strings, "score": (batch,) float32,
        "tokens": (batch, steps) int32, "truncated": (batch,) bool}`.
        Sources longer than the model's `max_length` are truncated to it
        (keeping [END]) and marked `truncated`; an empty source gives "" with
        no tokens; bytes that are not UTF-8 are replaced.
        `translate_with_attention` adds the tokens as strings and the
        cross-attention the translation was produced with;
        `translate_between` takes each text's source and target language
        (M2M100's and NLLB's checkpoints).

    Example:
    >>> translator = Translator(model, source_tokenizer, target_tokenizer, DecodingSettings(beam_size=4))
    >>> translator(tf.constant(["Ein Mann fährt Fahrrad."]))["translation"]
    """

    def __init__(self, model, source_tokenizer, target_tokenizer, settings=None):
        super().__init__(name="translator")
        for side, model_size, tokenizer in (
            ("source", model.src_vocab_size, source_tokenizer),
            ("target", model.tgt_vocab_size, target_tokenizer),
        ):
            if model_size != tokenizer.vocab_size:
                raise ValueError(
                    f"the model's {side} vocabulary has {model_size} ids but the {side} "
                    f"tokenizer has {tokenizer.vocab_size}"
                )
        self.model = model
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        settings = settings or DecodingSettings()
        self.settings = dataclasses.replace(
            settings.for_output(target_tokenizer.start_id, target_tokenizer.end_id),
            max_output_length=output_length_cap(model, settings.max_output_length),
        )

    def source_ids(self, texts, language_ids=None):
        """`(batch, length)` int32 source ids, truncated to the model's max_length (`truncated_source_ids`)."""
        return self.truncated_source_ids(texts, language_ids)[0]

    def truncated_source_ids(self, texts, language_ids=None):
        """`(ids, truncated)`: `(batch, length)` int32 source ids cut to the model's max_length, and which were cut.

        `language_ids`: each text's language token, in place of the source
        tokenizer's own (see `translate_between`).
        """
        if language_ids is None:
            ids = self.source_tokenizer.tokenize(texts)
        else:
            ids = self.source_tokenizer.tokenize(texts, language_ids=language_ids)
        max_length = self.model.max_length
        too_long = ids.row_lengths() > max_length
        ids = ids.to_tensor()[:, :max_length]
        # A cut sentence still ends with [END], as in training.
        last_column = tf.range(tf.shape(ids)[1]) == max_length - 1
        return tf.where(too_long[:, None] & last_column, self.source_tokenizer.end_id, ids), too_long

    @property
    def pieces_read(self):
        """The most pieces of a text the model reads: `max_length` less [START] and [END] (the tokenizer's frame)."""
        return self.model.max_length - self.source_tokenizer.frame_length

    def search(self, source_ids, static_shapes=False, first_ids=None, decoding=None):
        """Ids in, `(tokens, scores)` out (`static_shapes`, `decoding`: see `inference.steps.transformer_search`).

        `first_ids`: each sentence's forced first token (its target language).
        """
        return transformer_search(self.model, source_ids, self.settings, static_shapes=static_shapes,
                                  first_ids=first_ids, decoding=decoding)

    def _translate(self, texts, source_language_ids=None, target_language_ids=None):
        source_ids, truncated = self.truncated_source_ids(texts, source_language_ids)
        tokens, scores = self.search(source_ids, first_ids=target_language_ids)
        # The tokenizer's frame alone ([START] and [END]; a checkpoint's </s>): nothing to translate.
        empty = tf.reduce_sum(tf.cast(source_ids != 0, tf.int32), axis=1) <= self.source_tokenizer.frame_length
        tokens = tf.where(empty[:, None], 0, tokens)
        # The search's buffer has room for the longest allowed output; keep the columns used.
        longest = tf.reduce_max(tf.reduce_sum(tf.cast(tokens != 0, tf.int32), axis=1, keepdims=True))
        tokens = tokens[:, : tf.maximum(longest, 0)]
        return source_ids, {
            "translation": tf.where(empty, tf.constant(""), self.target_tokenizer.detokenize(tokens)),
            "score": tf.where(empty, 0.0, scores),
            "tokens": tokens,
            "truncated": truncated,
        }

    @graph_function(input_signature=[tf.TensorSpec([None], tf.string)])
    def __call__(self, texts):
        return self._translate(texts)[1]

    @property
    def languages(self):
        """The language codes `translate_between` takes (empty: it takes none)."""
        if self.source_tokenizer.languages and self.target_tokenizer.languages:
            return list(self.target_tokenizer.languages)
        return []

    @graph_function(input_signature=[tf.TensorSpec([None], tf.string)] * 3)
    def translate_between(self, texts, source_languages, target_languages):
        """`__call__` with each text's own languages: one model, any of its language pairs, in one batch.

        The codes are those `--source-lang` and `--target-lang` take ("de",
        "fra_Latn"; `languages` lists them): the source language's token goes
        before the text's pieces and the target language's is the output's
        forced first token, as a translator imported for that pair does. An
        unknown code is an `InvalidArgument` error naming the input.

        Example:
        >>> translator.translate_between(tf.constant(["Hello!", "Hello!"]), tf.constant(["en", "en"]),
        ...                              tf.constant(["de", "fr"]))["translation"]
        """
        if not self.languages:
            raise ValueError("this translator's tokenizers name no languages (only a multilingual checkpoint's do)")
        checks = [
            tf.debugging.assert_equal(tf.size(codes), tf.size(texts), message=f"{name} must hold one code per text")
            for name, codes in (("source_language", source_languages), ("target_language", target_languages))
        ]
        with tf.control_dependencies(checks):
            texts, source_languages, target_languages = (
                tf.identity(value) for value in (texts, source_languages, target_languages))
        source_language_ids = self.source_tokenizer.language_ids(source_languages, "source_language")
        target_language_ids = self.target_tokenizer.language_ids(target_languages, "target_language")
        return self._translate(texts, source_language_ids, target_language_ids)[1]

    def attention_scores(self, source_ids, tokens):
        """Every attention map of the model while it produced `tokens` (as the searches return them).

        One teacher-forced pass over [START] + tokens: row t of a decoder map
        is what the decoder attended to when it chose token t. Returns a dict
        from names such as "decoder/layer_0/cross_attention" to float32
        `(batch, heads, queries, keys)`; rows of padding are zero.
        """
        batch = tf.shape(tokens)[0]
        start = tf.fill([batch, 1], tf.cast(self.target_tokenizer.start_id, tokens.dtype))
        decoder_inputs = tf.concat([start, tokens[:, :-1]], axis=1)
        _, scores = self.model((source_ids, decoder_inputs), training=False, return_attention_scores=True)
        real_source = tf.cast(source_ids != 0, tf.float32)[:, None, :, None]
        real_target = tf.cast(tokens != 0, tf.float32)[:, None, :, None]
        masked = {}
        for name, value in scores.items():
            # A row is a query: it is real where the query side's token is.
            real_queries, _ = queries_and_keys(parse_attention_map_name(name)[0], real_source, real_target)
            masked[name] = tf.cast(value, tf.float32) * real_queries
        return masked

    def cross_attention(self, source_ids, tokens):
        """`(batch, layers, heads, tokens, source)` float32: the cross-attention of every layer."""
        scores = self.attention_scores(source_ids, tokens)
        names = attention_map_names(self.model.num_layers, CROSS)
        return tf.stack([scores[name] for name in names], axis=1)

    def attention_maps(self, texts):
        """Translations with every attention map, as NumPy, for plots and callbacks (eager).

        Returns `{"translation", "source_tokens", "target_tokens", "attention"}`:
        one entry per text; tokens without padding; `attention[name]` is
        `(heads, queries, keys)` cropped to the tokens (encoder maps: source by
        source; decoder self-attention: target by target; cross-attention:
        target by source).
        """
        texts = tf.constant(list(texts), tf.string)
        outputs = self(texts)
        source_ids = self.source_ids(texts)
        scores = {name: value.numpy() for name, value in self.attention_scores(source_ids, outputs["tokens"]).items()}
        results = []
        for row, translation in enumerate(outputs["translation"].numpy()):
            source = [token.decode() for token in self.source_tokenizer.id_to_token(source_ids[row]).numpy()]
            source = source[: int((source_ids[row] != 0).numpy().sum())]
            target_ids = outputs["tokens"][row]
            target = [token.decode() for token in self.target_tokenizer.id_to_token(target_ids).numpy()]
            target = target[: int((target_ids != 0).numpy().sum())]
            attention = {}
            for name, value in scores.items():
                kind, _ = parse_attention_map_name(name)
                queries, keys = queries_and_keys(kind, len(source), len(target))
                attention[name] = value[row, :, :queries, :keys]
            results.append({"translation": translation.decode(), "source_tokens": source,
                            "target_tokens": target, "attention": attention})
        return results

    @graph_function(input_signature=[tf.TensorSpec([None], tf.string)])
    def translate_with_attention(self, texts):
        """`__call__`'s outputs plus `source_tokens`, `target_tokens` ((batch, None)
        strings, padded with "") and `cross_attention` (see `cross_attention`)."""
        source_ids, outputs = self._translate(texts)
        tokens = outputs["tokens"]
        outputs["cross_attention"] = self.cross_attention(source_ids, tokens)
        outputs["source_tokens"] = self._token_strings(self.source_tokenizer, source_ids)
        outputs["target_tokens"] = self._token_strings(self.target_tokenizer, tokens)
        return outputs

    @staticmethod
    def _token_strings(tokenizer, ids):
        return tf.where(ids == tokenizer.pad_id, tf.constant(""), tokenizer.id_to_token(ids))

    def translate(self, texts, batch_size=64):
        """Python strings in, one translation per string out, in batches (`lines.Answers`).

        A blank text's translation is "" (the model never sees it); a text
        cut at `max_length` is in the answer's `truncated`, with the pieces read.
        """
        return answer_each(texts, functools.partial(self._translate_in_batches, batch_size=batch_size), "")

    def _translate_in_batches(self, texts, batch_size):
        results, truncated = [], {}
        for start in range(0, len(texts), batch_size):
            outputs = self(tf.constant(texts[start : start + batch_size], tf.string))
            results.extend(text.decode("utf-8") for text in outputs["translation"].numpy())
            truncated.update((start + int(row), self.pieces_read) for row in np.flatnonzero(outputs["truncated"]))
        return Answers(results, truncated)
