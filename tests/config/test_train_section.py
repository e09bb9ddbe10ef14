"""The train section's scheduler and optimizer names: the common ones validate without importing transformers (and
so torch), every other name against the installed transformers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sparsebert.config.sections import (
    COMMON_OPTIMIZERS,
    COMMON_SCHEDULERS,
    TrainConfig,
    optimizer_names,
    scheduler_names,
)


def test_the_common_names_are_names_transformers_accepts():
    assert set(COMMON_SCHEDULERS) <= set(scheduler_names())
    assert set(COMMON_OPTIMIZERS) <= set(optimizer_names())


def test_a_rare_name_is_checked_against_transformers_and_a_wrong_one_lists_them_all():
    rare = next(name for name in scheduler_names() if name not in COMMON_SCHEDULERS)
    TrainConfig(lr_scheduler=rare).validate()
    with pytest.raises(ValueError, match=r"^train\.lr_scheduler must be one of linear, .*reduce_lr_on_plateau.*"
                                         r"got 'cosin'$"):
        TrainConfig(lr_scheduler="cosin").validate()
    with pytest.raises(ValueError, match=r"^train\.optim must be auto or a transformers optimizer name .*"
                                         r"got 'adamw'$"):
        TrainConfig(optim="adamw").validate()


def test_show_builds_an_experiment_without_importing_torch():
    probe = ("import contextlib, io, sys\n"
             "from sparsebert.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
             "    status = main(['--show', 'minilm_glue_sparse80'])\n"
             "assert status == 0 and 'lr_scheduler' in out.getvalue(), out.getvalue()\n"
             "print('torch' in sys.modules, 'transformers' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False False"
