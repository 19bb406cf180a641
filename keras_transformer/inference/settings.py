"""How a translation is decoded, as one object: `DecodingSettings`.

Every road a translation takes (`Translator`, the searches, the SavedModel,
LiteRT and CTranslate2 exports) reads the same settings object, built in one
place per source: a run's config (`DecodingSettings.from_config`, which is
also what an imported checkpoint's `generation_config.json` becomes at
import), with the command line's flags on top (`replace`).

The settings say what to search for; `search.py` says how. They hold:

- `beam_size`: 1 for greedy search, else beam search (section 6.1: 4).
- `length_penalty`: what a hypothesis' log-probability is divided by
  (`LengthPenalty`).
- `stop_rule`: when a beam search may stop (`STOP_RULES`).
- `keep_greedy`: beam search also follows the greedy path.
- `max_extra_length`, `max_output_length`: the length limits (section 6.1:
  "input length + 50").
- `token_rules`: rules for single tokens (`TokenRules`): the ids never
  generated, a forced first token, [END] forced at the limit.
"""

import dataclasses

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class LengthPenalty:
    """lp(Y) = ((offset + |Y|) / (offset + 1)) ** alpha, what a hypothesis' log-probability is divided by.

    Beam search compares hypotheses of different lengths; each added token
    lowers the log-probability, so without a penalty short hypotheses win.
    `offset=5` is GNMT's penalty (Wu et al., 2016, eq. 14), the paper's
    (alpha 0.6, section 6.1); `offset=0` is |Y| ** alpha, which Hugging
    Face's `generate` uses.
    """

    alpha: float = 0.6
    offset: float = 5.0

    def __call__(self, lengths):
        lengths = tf.cast(lengths, tf.float32)
        if self.offset:
            lengths = (self.offset + lengths) / (self.offset + 1.0)
        return tf.pow(lengths, self.alpha)


# -- when a beam search stops --------------------------------------------------------
#
# Each rule says, per sentence, whether its beam search may stop now, from
# the best `beam_size` ended hypotheses' scores (sorted, best first) and
# count, the live hypotheses' log-probabilities (sorted) and the step. The
# search also stops a sentence whenever no live hypothesis can overtake its
# best ended one (`search._cannot_be_beaten`): that changes no result.


def stop_when_beam_full(final_scores, final_count, live_log_probs, step, penalty):
    """Done once `beam_size` hypotheses have ended (ours, as OpenNMT-tf's and CTranslate2's)."""
    return final_count >= tf.shape(final_scores)[1]


def stop_when_best_live_is_behind(final_scores, final_count, live_log_probs, step, penalty):
    """Done once `beam_size` have ended and the best live one, scored at its present length, is not ahead.

    Hugging Face's `early_stopping=False`: the best live hypothesis (step + 1
    tokens) is compared with the worst of the `beam_size` best ended ones. A
    hypothesis that would win by growing longer is not waited for: this
    returns what Hugging Face returns, which `stop_when_beam_full` with the
    search's bound sometimes improves on.
    """
    best_live = live_log_probs[:, 0] / penalty(step + 1)
    return stop_when_beam_full(final_scores, final_count, live_log_probs, step, penalty) & (
        best_live <= final_scores[:, -1])


STOP_RULES = {"beam_full": stop_when_beam_full, "best_live_is_behind": stop_when_best_live_is_behind}


@dataclasses.dataclass(frozen=True)
class TokenRules:
    """The output's special tokens and the rules for single tokens, applied to every step's log-probabilities.

    start_id, end_id: the output vocabulary's [START] (fed at the first
        step) and [END] (ends an output); None until the tokenizer says
        (`DecodingSettings.for_output`).
    never: ids never generated (padding, and [START] for our own models;
        a checkpoint's `bad_words_ids` of one token).
    forced_first: the id every output starts with (NLLB's and M2M100's
        target language, `forced_bos_token_id`), or None.
    end_at_limit: [END] is forced at a sentence's last allowed position
        (`forced_eos_token_id`), so that it counts in the length.
    renormalize: the log-probabilities are normalised again after the rules
        (`renormalize_logits`): the forbidden ids' share goes to the others.
    """

    start_id: int = None
    end_id: int = None
    never: tuple = (0,)
    forced_first: int = None
    end_at_limit: bool = False
    renormalize: bool = False

    @classmethod
    def ours(cls, start_id, end_id):
        """Our own models' rules: neither padding (0) nor [START] is ever generated."""
        return cls(start_id, end_id, never=(0, start_id))

    @classmethod
    def from_config(cls, section):
        """The rules a checkpoint's config records (`to_config`); the ids come from the tokenizer."""
        return cls(never=tuple(section["never"]), forced_first=section["forced_first"],
                   end_at_limit=bool(section["end_at_limit"]), renormalize=bool(section["renormalize"]))

    def to_config(self):
        return {"never": list(self.never), "forced_first": self.forced_first, "end_at_limit": self.end_at_limit,
                "renormalize": self.renormalize}


@dataclasses.dataclass(frozen=True)
class DecodingSettings:
    """How to decode a translation (see the module docstring); frozen: `replace` makes a changed copy.

    Args:
        beam_size: 1 for greedy search, else beam search with this many beams.
        length_penalty: a `LengthPenalty`.
        stop_rule: a name of `STOP_RULES`.
        keep_greedy: beam search also follows the greedy path and returns it
            where it scores higher (see `inference.beam_search`).
        max_extra_length: an output may be this much longer than its source.
        max_output_length: and never longer than this (None: the model's
            `max_length`).
        token_rules: a `TokenRules`, or None for our own models' (neither
            padding nor [START] generated). The searches need its ids:
            `for_output` sets them.

    Example:
    >>> settings = DecodingSettings(beam_size=4, length_penalty=LengthPenalty(alpha=0.6))
    >>> greedy = settings.replace(beam_size=1)
    """

    beam_size: int = 4
    length_penalty: LengthPenalty = LengthPenalty()
    stop_rule: str = "beam_full"
    keep_greedy: bool = True
    max_extra_length: int = 50
    max_output_length: int = None
    token_rules: TokenRules = None

    def __post_init__(self):
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be at least 1, got {self.beam_size}")
        if self.max_extra_length < 0:
            raise ValueError(f"max_extra_length must be at least 0, got {self.max_extra_length}")
        if self.stop_rule not in STOP_RULES:
            raise ValueError(f"stop_rule must be one of {', '.join(STOP_RULES)}, got {self.stop_rule!r}")

    def replace(self, **changes):
        """A copy with `changes`; a change given as None keeps the setting (an option left out)."""
        return dataclasses.replace(self, **{name: value for name, value in changes.items() if value is not None})

    def for_output(self, start_id, end_id):
        """These settings for an output vocabulary whose [START] and [END] are `start_id` and `end_id`.

        Without token rules of their own, our own models' (`TokenRules.ours`).
        """
        rules = self.token_rules or TokenRules.ours(start_id, end_id)
        return dataclasses.replace(self, token_rules=dataclasses.replace(rules, start_id=start_id, end_id=end_id))

    @classmethod
    def from_config(cls, section):
        """The settings a run's config section (`evaluation`) records (see `to_config`).

        A run imported before its length penalty and stopping rule were
        recorded by name keeps decoding as it did: `length_penalty_kind`
        "gnmt" (offset 5) or another (offset 0), `stop_when_beam_full`.
        """
        offset = section.get("length_penalty_offset")
        if offset is None:
            offset = 5.0 if section.get("length_penalty_kind", "gnmt") == "gnmt" else 0.0
        stop_rule = section.get("stop_rule")
        if stop_rule is None:
            stop_rule = "beam_full" if section.get("stop_when_beam_full", True) else "best_live_is_behind"
        return cls(
            beam_size=section["beam_size"],
            length_penalty=LengthPenalty(section["length_alpha"], offset),
            stop_rule=stop_rule,
            keep_greedy=section.get("keep_greedy", True),
            max_extra_length=section["max_extra_length"],
            max_output_length=section.get("max_output_length"),
            token_rules=TokenRules.from_config(section["token_rules"]) if section.get("token_rules") else None,
        )

    def to_config(self):
        """The settings as a run's config and an export's settings file record them (JSON)."""
        return {
            "beam_size": self.beam_size,
            "length_alpha": self.length_penalty.alpha,
            "length_penalty_offset": self.length_penalty.offset,
            "stop_rule": self.stop_rule,
            "keep_greedy": self.keep_greedy,
            "max_extra_length": self.max_extra_length,
            "max_output_length": self.max_output_length,
            **({"token_rules": self.token_rules.to_config()} if self.token_rules else {}),
        }
