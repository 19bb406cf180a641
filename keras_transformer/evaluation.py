"""How good a run is: BLEU and chrF for translations, accuracy and F1 for a classifier.

Translation scores are computed on readable text with sacrebleu's standard
13a tokenization, so they compare with published figures (the paper reports
BLEU): cased, as the primary figure, and lowercased as a second one.
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


def classification_scores(predictions, labels, class_names):
    """Accuracy, per-class precision, recall and F1, and the confusion matrix.

    Args:
        predictions, labels: parallel lists of class ids.
        class_names: the name of each class id.

    Returns:
        `{"accuracy", "examples", "classes": {name: {"precision", "recall",
        "f1", "support"}}, "confusion": rows = true class, columns = predicted}`.
        A class never predicted has precision 0; one never present, recall 0.
    """
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} labels")
    if not labels:
        raise ValueError("no examples to score")
    size = len(class_names)
    confusion = [[0] * size for _ in range(size)]
    for label, prediction in zip(labels, predictions):
        confusion[label][prediction] += 1
    classes = {}
    for index, name in enumerate(class_names):
        correct = confusion[index][index]
        predicted = sum(row[index] for row in confusion)
        present = sum(confusion[index])
        precision = correct / predicted if predicted else 0.0
        recall = correct / present if present else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        classes[name] = {
            "precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4), "support": present
        }
    correct = sum(confusion[index][index] for index in range(size))
    return {"accuracy": round(correct / len(labels), 4), "examples": len(labels), "classes": classes, "confusion": confusion}
