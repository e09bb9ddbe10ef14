"""``python -m sparsebert``: the ``sparsebert`` command (see :mod:`sparsebert.cli`)."""

import sys

from sparsebert.cli import main

if __name__ == "__main__":
    sys.exit(main())
