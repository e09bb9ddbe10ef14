"""The CSV task's predictions file."""

from __future__ import annotations

import numpy as np
import pytest

from sparsebert.jobs.finetune.csv_task import write_csv_predictions


def test_write_csv_predictions(tmp_path):
    path = tmp_path / "out" / "predictions.csv"
    write_csv_predictions(path, ["a", "b"], [0, 1], [1, 1], np.array([[0.25, 0.75], [0.1, 0.9]]), ["neg", "pos"])
    assert path.read_text() == ("row_id,truth,prediction,prob_neg,prob_pos\n"
                                "a,neg,pos,0.250000,0.750000\n"
                                "b,pos,pos,0.100000,0.900000\n")
    with pytest.raises(ValueError):
        write_csv_predictions(path, ["a"], [0], [1], np.array([[0.5, 0.5]]), ["neg", "pos", "x"])
