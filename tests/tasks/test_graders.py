"""QA normalisation (SQuAD) and exact numeric answers."""

from __future__ import annotations

import pytest

from tasks.graders import exact_number_match, normalize_answer, qa_exact_match, qa_f1, qa_score


@pytest.mark.parametrize(
    "raw,normal",
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  an  apple,   a pear. ", "apple pear"),
        ("Dr. Who?!", "dr who"),
        ("THE", ""),
        ("théâtre", "théâtre"),
        ("a-b", "ab"),
        ("Anthem", "anthem"),  # "an" only as a whole word
    ],
)
def test_normalize_answer(raw, normal):
    assert normalize_answer(raw) == normal


def test_exact_match_against_several_references():
    assert qa_exact_match("the Eiffel tower.", ["Tour Eiffel", "Eiffel Tower"]) == 1.0
    assert qa_exact_match("Eiffel", ["Eiffel Tower"]) == 0.0


def test_f1_takes_the_best_reference_and_partial_credit():
    # pred {eiffel}, ref {eiffel, tower}: precision 1, recall 1/2 -> F1 2/3
    assert qa_f1("Eiffel", ["Louvre", "Eiffel Tower"]) == pytest.approx(2 / 3)
    assert qa_f1("", ["x"]) == 0.0 and qa_f1("the", ["a"]) == 1.0  # both empty after normalisation


def test_no_answer_scores_zero():
    assert qa_score(None, ["x"]) == (0.0, {"em": 0.0, "f1": 0.0})
    assert qa_score("X!", ["x"]) == (1.0, {"em": 1.0, "f1": 1.0})


@pytest.mark.parametrize(
    "pred,answer,ok",
    [("1200", "1200", 1), ("1,200", "1200", 1), ("1200.0", "1200", 1), (" 1200. ", "1200", 1),
     ("1201", "1200", 0), ("twelve hundred", "1200", 0), (None, "1200", 0), ("", "1200", 0),
     ("Infinity", "Infinity", 0), ("-inf", "-inf", 0), ("NaN", "NaN", 0), ("sNaN", "1200", 0)],
)  # fmt: skip
def test_exact_number_match(pred, answer, ok):
    assert exact_number_match(pred, answer) == ok
