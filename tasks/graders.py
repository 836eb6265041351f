"""Graders for answer-style tasks: exact numeric answers and SQuAD-normalised QA."""

from __future__ import annotations

import collections
import re
import string
from decimal import Decimal, InvalidOperation

__all__ = ["exact_number_match", "normalize_answer", "qa_exact_match", "qa_f1", "qa_score", "shaped_reward"]

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def qa_exact_match(prediction: str, references: list[str]) -> float:
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(r) for r in references))


def _f1(prediction: str, reference: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not pred or not ref:
        return float(pred == ref)
    common = collections.Counter(pred) & collections.Counter(ref)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def qa_f1(prediction: str, references: list[str]) -> float:
    """Token F1 against the best-matching reference."""
    return max(_f1(prediction, r) for r in references)


def qa_score(prediction: str | None, references: list[str]) -> tuple[float, dict[str, float]]:
    """(reward = exact match, info with em and f1); no answer scores 0."""
    if prediction is None:
        return 0.0, {"em": 0.0, "f1": 0.0}
    em = qa_exact_match(prediction, references)
    return em, {"em": em, "f1": qa_f1(prediction, references)}


def exact_number_match(prediction: str | None, answer: str) -> float:
    """1 when the prediction is the same number as the answer ("1,200", "1200.0" and "1200" agree).
    "Infinity" and "NaN" are no number: an infinite result submitted must not match itself."""
    if prediction is None:
        return 0.0
    try:
        cleaned = Decimal(prediction.strip().replace(",", "").rstrip("."))
        return float(cleaned.is_finite() and cleaned == Decimal(answer))
    except InvalidOperation:
        return 0.0


def shaped_reward(score: float, format_reward: float, *, used: bool, grounded: bool) -> float:
    """``score`` when it is a pass; otherwise shaping for a policy that never solves a task yet:
    half of ``format_reward`` for using the tools on the task, half for submitting what they
    returned. A bare guess earns nothing: crediting any submission was gamed (the policy learned
    to guess at once, without the tools)."""
    if score >= 1.0:
        return score
    return format_reward * (0.5 * used + 0.5 * grounded)
