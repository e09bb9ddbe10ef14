"""Reading delimited text files (GLUE and GAP TSVs, CSV tasks): rows with their line numbers, blank lines left out,
and one-line errors for files that are not UTF-8 or break the CSV syntax."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from sparsebert.errors import SparseBertError

# csv's default field limit (131,072 characters) rejects any longer text, yet the CSV task exists to fold long texts.
# The limit is process-wide; csv_rows raises it before reading (again if other code lowered it since). 2**31 - 1 is
# the largest value every platform takes: csv keeps it in a C long, 32 bits on Windows, where sys.maxsize overflows.
# With no limit to stop it, an unclosed quote is caught by the CSV task's strict reading ("unexpected end of data").
FIELD_SIZE_LIMIT = 2**31 - 1


def csv_rows(path: str | Path, f: TextIO, *, hint: str = "", **fmt: Any) -> Iterator[tuple[int, list[str]]]:
    """``csv.reader(f, **fmt)``'s rows with the line each starts on (a quoted field may span lines), leaving out
    blank lines (:func:`is_blank`): every reader skips the same ones.

    A file that is not UTF-8 text or breaks the CSV syntax (with ``strict=True``: an unclosed quote) is a one-line
    SparseBertError naming ``path`` and the line, then ``hint`` (what to change), not a traceback from csv.
    """
    if csv.field_size_limit() < FIELD_SIZE_LIMIT:
        csv.field_size_limit(FIELD_SIZE_LIMIT)
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
            raise SparseBertError(f"{path}: line {line}: {_readable(e)}{hint}") from None
        if not is_blank(row):
            yield line, row


def is_blank(row: list[str]) -> bool:
    """Whether a row is a blank line: empty, or spaces only (a file's trailing empty line, a CRLF file's last line
    break). Editors and exports leave these, so they are skipped. A line with delimiters is a row even when every
    field is empty (a line of tabs only): its missing values or wrong field count are the reader's to report.
    """
    return len(row) <= 1 and not "".join(row).strip()


def _readable(e: csv.Error) -> str:
    """csv's message with a tab written as \\t: csv quotes the raw delimiter (a tab expected after a closing
    quote), which a terminal shows as blank space."""
    return str(e).replace("\t", "\\t")


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
