#!/usr/bin/env python
"""``python run.py ...`` from a checkout: the ``sparsebert`` command (``sparsebert --list`` shows the experiments)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))  # run from a checkout without pip install -e . too

from sparsebert.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
