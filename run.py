#!/usr/bin/env python
"""Run sparsebert experiments: ``python run.py bert_100k sparse_80_rigl`` (``--list`` shows them all)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "src"))  # run from a checkout without pip install -e . too

from sparsebert.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(experiments_dir=ROOT / "experiments"))
