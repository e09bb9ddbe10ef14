"""Colours of the run plots: every run of a study gets its own, however many runs one plot holds."""

from __future__ import annotations

import pytest
from matplotlib.colors import to_hex, to_rgba

from sparsebert.results.plots import plot_loss_curves, run_colors


@pytest.mark.parametrize("n", [1, 10, 11, 12, 20, 21, 40])
def test_run_colors_are_distinct(n):
    colors = [to_rgba(c) for c in run_colors(n)]
    assert len(colors) == n
    assert len(set(colors)) == n


def test_up_to_ten_runs_keep_the_default_cycle():
    assert [to_rgba(c) for c in run_colors(10)] == [to_rgba(f"C{i}") for i in range(10)]


def test_a_twelve_run_loss_plot_draws_twelve_colours(tmp_path):
    histories = {f"run{i}": [{"step": 1, "loss": 9.0 - i * 0.1}, {"step": 2, "eval_loss": 8.0 - i * 0.1}]
                 for i in range(12)}
    out = tmp_path / "loss.svg"
    plot_loss_curves(histories, out)
    svg = out.read_text()
    # matplotlib writes each line's colour as a stroke: twelve runs, twelve colours (a run's two lines share one)
    strokes = {part.split(";")[0] for part in svg.split("stroke: ")[1:] if part.startswith("#")}
    assert len(strokes & {to_hex(c) for c in run_colors(12)}) == 12

