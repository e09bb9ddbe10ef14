"""``python run.py --predict RUN --input FILE``: a finished finetuning run's model on a file given later.

Each task reads the file with the reader its runner trains with (labels optional), featurizes it the same way
(the run's own settings from its config.json) and writes the task's own output format; when the file carries
labels, the task's metrics come back too. Every check (the run, the file, its columns and rows) happens before
the model loads and before anything is written; outputs are written atomically, a prediction's files all or
none (a failed second file leaves no first one behind).

``--sparse24-kernel`` runs a 2:4 run's sparse encoder Linears through our CUTLASS kernel
(:func:`sparsebert.export.to_sparse24_kernel`): the model in bf16 on an sm90 GPU, the library built once with
``python -m sparsebert.kernels.build``. A run that is not 2:4, a machine without CUDA, another GPU or a missing
library is a one-line error before the model loads.
"""


from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sparsebert.data.gap import LONG_ROWS
from sparsebert.errors import SparseBertError
from sparsebert.predict.finished_run import (
    apply_overrides,
    check_input_format,
    check_output,
    check_readable,
    check_sparse24_device,
    check_two_four_run,
    open_run,
)
from sparsebert.predict.tasks import PREDICTORS, Prediction


def predict(run: str | Path, input_file: str | Path, output: str | Path | None = None,
            output_root: Path = Path("runs"), sparse24_kernel: bool = False, overrides: Sequence[str] = (),
            long_rows: str | None = None) -> Prediction:
    """Predict ``input_file`` with the finished finetuning run ``run``.

    Args:
        run: the run directory, or its path relative to ``output_root``.
        input_file: a file in the task's format (GLUE TSV, CSV/TSV, SQuAD JSON, GAP TSV); labels optional.
        output: the predictions file; default ``<run>/predict/<input stem>.<ext>``.
        output_root: where relative run paths are looked up.
        sparse24_kernel: run a 2:4 run's sparse Linears through our 2:4 kernel (an sm90 GPU, the built library).
        overrides: ``--set key=value`` items for how the input is read (``PREDICT_KEYS``).
        long_rows: GAP runs only: truncate (None: the default), skip or error for rows whose mentions do not fit.

    Returns:
        The files written and, when the input has labels, the metrics (and the Linears the kernel ran).
    """
    finished = open_run(run, output_root)
    apply_overrides(finished, overrides)
    if long_rows is not None:
        if finished.kind != "gap":
            raise SparseBertError(f"--long-rows is for GAP runs; run {finished.path} is of task "
                                  f"{finished.config['task']} (its long inputs are windowed or folded)")
        if long_rows not in LONG_ROWS:
            raise SparseBertError(f"--long-rows {long_rows}: use one of {', '.join(LONG_ROWS)}")
        finished.long_rows = long_rows
    if sparse24_kernel:
        check_two_four_run(finished)
        finished.sparse24_kernel = True
    input_file = Path(input_file)
    check_readable(input_file)
    check_input_format(finished, input_file)
    outputs = check_output(Path(output) if output is not None else None, finished, input_file)
    if sparse24_kernel:
        check_sparse24_device()
    result = PREDICTORS[finished.kind](finished, input_file, outputs)
    result.kernel_layers = finished.kernel_layers
    return result
