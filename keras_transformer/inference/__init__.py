"""Decoding: greedy and beam search on the cache, and a text-to-text Translator."""

from keras_transformer.inference.search import beam_search, greedy_search, length_penalty, score_sequences
from keras_transformer.inference.translator import Translator

__all__ = ["Translator", "beam_search", "greedy_search", "length_penalty", "score_sequences"]
