"""BLEU and chrF on detokenized text, with sacrebleu (the paper reports BLEU).

Scores are computed on readable text with sacrebleu's standard 13a
tokenization, so they compare with published figures: cased, as the
primary figure, and lowercased as a second one.
"""

import sacrebleu


def translation_scores(hypotheses, references):
    """`{"bleu", "bleu_lowercase", "chrf", "signature"}` for parallel lists of strings."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    if not references:
        raise ValueError("no sentences to score")
    bleu = sacrebleu.metrics.BLEU()
    cased = bleu.corpus_score(hypotheses, [references])
    lowercase = sacrebleu.metrics.BLEU(lowercase=True).corpus_score(hypotheses, [references])
    chrf = sacrebleu.metrics.CHRF().corpus_score(hypotheses, [references])
    return {
        "bleu": round(cased.score, 2),
        "bleu_lowercase": round(lowercase.score, 2),
        "chrf": round(chrf.score, 2),
        "signature": str(bleu.get_signature()),
        "sentences": len(references),
    }
