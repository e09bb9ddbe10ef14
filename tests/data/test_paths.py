"""Where the data lives: the pointer every data-directory error ends with leads to a real README section."""

from __future__ import annotations

import re
from pathlib import Path

from sparsebert.data.paths import HOW_TO_POINT

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_section_the_errors_point_to_exists():
    (section,) = re.findall(r"see README, '([^']+)'", HOW_TO_POINT)
    headings = [line.lstrip("#").strip() for line in README.read_text().splitlines() if line.startswith("#")]
    assert section in headings, f"README has no section '{section}'"
