"""Reading delimited text files (GLUE and GAP TSVs, CSV tasks): rows with their line numbers, and one-line errors
for files that are not UTF-8 or break the CSV syntax."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from sparsebert.errors import SparseBertError


def csv_rows(path: str | Path, f: TextIO, **fmt: Any) -> Iterator[tuple[int, list[str]]]:
    """``csv.reader(f, **fmt)``'s rows with the line each starts on (a quoted field may span lines).

    A file that is not UTF-8 text or breaks the CSV syntax (an unclosed quote runs into the field size limit)
    is a one-line SparseBertError naming ``path`` and the line, not a traceback from the csv module.
    """
    reader = csv.reader(f, **fmt)
    while True:
        line = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except UnicodeDecodeError:
            raise not_utf8_error(path) from None
        except csv.Error as e:
            raise SparseBertError(f"{path}: line {line}: {e}") from None
        yield line, row


def not_utf8_error(path: str | Path) -> SparseBertError:
    """The error for a file that does not decode as UTF-8, naming the line of its first bad byte.

    The text layer decodes ahead in blocks, so the reader's position says little: the bytes are read again.
    """
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):  # b"\n" never occurs inside a UTF-8 character
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return SparseBertError(f"{path}: line {number}: not UTF-8 text (byte 0x{raw[e.start]:02x}); "
                                       "save the file as UTF-8")
    return SparseBertError(f"{path}: not UTF-8 text; save the file as UTF-8")
