"""Helpers every finetuning task shares."""

from __future__ import annotations

from datasets import Dataset

from sparsebert.jobs.finetune.common import limit


def test_limit_keeps_the_first_rows_and_only_none_means_all():
    rows = Dataset.from_dict({"x": list(range(5))})
    assert limit(rows, None)["x"] == [0, 1, 2, 3, 4]
    assert limit(rows, 2)["x"] == [0, 1]
    assert limit(rows, 9)["x"] == [0, 1, 2, 3, 4]
    assert len(limit(rows, 0)) == 0  # no "0 = all" (the config refuses 0; a 0 reaching here must not mean all)
