"""The bench's model fidelity: |predicted/measured − 1| and Spearman's rank correlation, on rows computed by hand."""
from __future__ import annotations

import math

import pytest

from casync.bench.fidelity import fidelity_by_group, fidelity_lines, fidelity_text, model_fidelity, spearman
from casync.bench.runner import Row


def test_spearman_of_a_perfect_a_reversed_and_a_tied_ranking():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 400]) == pytest.approx(1.0)  # ranks, not values
    assert spearman([1, 2, 3, 4], [9, 5, 2, 1]) == pytest.approx(-1.0)
    # x ranks [1, 2.5, 2.5, 4], y ranks [1, 3, 2, 4]: 4.5 / sqrt(4.5 * 5) = 3 / sqrt(10)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(3 / math.sqrt(10))


@pytest.mark.parametrize("x, y, match", [([1.0], [2.0], "at least 2"), ([1, 2], [1], "paired"),
                                         ([1, 1, 1], [1, 2, 3], "all equal"), ([1, math.nan], [1, 2], "finite")])
def test_spearman_refuses_where_it_is_undefined(x, y, match):
    with pytest.raises(ValueError, match=match):
        spearman(x, y)


def _row(system: str, strategy: str, predicted: float | None, measured: float, **kw) -> Row:
    return Row("resnet50", 4, system, strategy, kw.pop("codec", "onebit"), sync_s=measured, predicted_s=predicted, **kw)


#: predicted / measured: errors 0, 0.5, 0.5, 0.7; ranks predicted [2, 1, 4, 3], measured [1.5, 1.5, 3, 4]
ROWS = [_row("casync", "ring", 0.10, 0.10), _row("casync", "ps-twoway", 0.05, 0.10),
        _row("hook", "ddp-casync:ring:onebit", 0.30, 0.20), _row("casync", "allgather", 0.12, 0.40),
        # never counted: a baseline, a failed row, a row without a prediction
        _row("baseline", "gloo-bucket", None, 0.2, codec="none"),
        _row("casync", "auto", 0.1, math.nan, error="RuntimeError: boom"), _row("casync", "ring.p8", None, 0.3)]


def test_fidelity_over_casync_and_hook_rows_by_hand():
    got = model_fidelity(ROWS)
    assert got["rows"] == 4 and got["reason"] is None
    assert got["median_error"] == pytest.approx(0.5) and got["worst_error"] == pytest.approx(0.7)
    assert got["worst_row"] == "resnet50 N=4 allgather / onebit"
    # d_pred [-0.5, -1.5, 1.5, 0.5], d_meas [-1, -1, 0.5, 1.5]: 3.5 / sqrt(5 * 4.5)
    assert got["spearman"] == pytest.approx(3.5 / math.sqrt(22.5))
    text = fidelity_text(got)
    assert "median 0.50" in text and "worst 0.70 (resnet50 N=4 allgather / onebit)" in text and "0.74" in text


def test_fewer_than_three_rows_give_no_figures_and_say_why():
    got = model_fidelity(ROWS[:2] + ROWS[4:])
    assert got["rows"] == 2 and got["median_error"] is got["worst_error"] is got["spearman"] is None
    assert "2 casync rows with a prediction and a measurement; at least 3 needed" in got["reason"]
    assert fidelity_text(got).startswith("n/a (2 casync rows")
    assert model_fidelity([])["reason"].startswith("0 casync rows")


def test_equal_predictions_have_errors_but_no_rank_correlation():
    got = model_fidelity([_row("casync", s, 0.1, m) for s, m in (("ring", 0.1), ("ps-twoway", 0.2), ("allgather", 0.4))])
    assert got["median_error"] == pytest.approx(0.5) and got["spearman"] is None
    assert "all equal" in got["reason"] and "Spearman rank correlation of predicted and measured times n/a" in \
        fidelity_text(got)


def test_several_groups_are_also_judged_one_by_one():
    other = [Row("bert-base", 2, "casync", s, "none", sync_s=m, predicted_s=p)
             for s, p, m in (("ring", 1.0, 2.0), ("ps-twoway", 2.0, 1.0), ("allgather", 3.0, 3.0))]
    by = fidelity_by_group(ROWS + other)
    assert set(by) == {"all", "resnet50/4", "bert-base/2"} and by["all"]["rows"] == 7
    assert by["resnet50/4"] == model_fidelity(ROWS) and by["bert-base/2"]["spearman"] == pytest.approx(0.5)
    lines = fidelity_lines(by)
    assert len(lines) == 3 and lines[1].startswith("- resnet50/4: over 4 casync rows")
    assert set(fidelity_by_group(ROWS)) == {"all"}
