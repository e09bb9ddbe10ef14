"""Pretraining corpora as documents: WikiExtractor output, plain text files, or a hub dataset.

Every reader yields whole documents (``{"id", "title", "text"}``), because the evaluation split is drawn by
document: lines of one article never land on both sides.
"""

from __future__ import annotations

import gzip
import lzma
import re
import zlib
from collections.abc import Iterator
from pathlib import Path

from sparsebert.errors import SparseBertError

Document = dict[str, str]

_DOC_OPEN = re.compile(r'^<doc id="([^"]*)" url="[^"]*" title="([^"]*)">$')


def _open_text(path: Path):
    # utf-8-sig: a byte-order mark (Windows editors write one) would otherwise start the first line
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig")
    if path.suffix == ".xz":  # about 30 % smaller than .gz: what fits a size-limited transfer
        return lzma.open(path, "rt", encoding="utf-8-sig")
    return open(path, encoding="utf-8-sig")


def _lines(path: Path) -> Iterator[str]:
    """Lines of a plain, .gz or .xz file; a corrupt or truncated archive is a one-line error naming the file."""
    try:
        with _open_text(path) as f:
            yield from f
    except (OSError, EOFError, zlib.error, lzma.LZMAError) as e:  # BadGzipFile is an OSError
        raise SparseBertError(f"cannot read corpus file {path}: {e}") from None
    except UnicodeDecodeError as e:
        raise SparseBertError(f"corpus file {path} is not UTF-8 text: {e}") from None


def iter_wikiextractor(path: Path) -> Iterator[Document]:
    """Documents of one WikiExtractor file: ``<doc ...>``, the title line, paragraphs, ``</doc>``."""
    doc: Document | None = None
    paragraphs: list[str] = []
    for lineno, raw in enumerate(_lines(path), start=1):
        line = raw.rstrip("\n")
        if line.startswith("<doc "):
            if doc is not None:
                raise SparseBertError(f"{path}:{lineno}: <doc> opened before the previous </doc>")
            m = _DOC_OPEN.match(line)
            if m is None:
                raise SparseBertError(f"{path}:{lineno}: malformed <doc> line: {line[:80]!r}")
            doc, paragraphs = {"id": m.group(1), "title": m.group(2)}, []
        elif line == "</doc>":
            if doc is None:
                raise SparseBertError(f"{path}:{lineno}: </doc> without an open <doc>")
            # WikiExtractor repeats the title as the first line; it is not body text
            if paragraphs and paragraphs[0] == doc["title"]:
                paragraphs = paragraphs[1:]
            doc["text"] = "\n".join(paragraphs)
            if doc["text"]:
                yield doc
            doc = None
        elif doc is not None:
            if line.strip():
                paragraphs.append(line.strip())
        elif line.strip():
            raise SparseBertError(f"{path}:{lineno}: text outside a <doc> element")
    if doc is not None:
        raise SparseBertError(f"{path}: ends inside <doc id=\"{doc['id']}\"> (truncated file?)")


def iter_plain_text(path: Path) -> Iterator[Document]:
    """Documents of a plain text file: blank lines separate documents, one paragraph or sentence a line."""
    lines: list[str] = []
    count = 0
    for raw in _lines(path):
        line = raw.strip()
        if line:
            lines.append(line)
        elif lines:
            yield {"id": f"{path.name}:{count}", "title": "", "text": "\n".join(lines)}
            count, lines = count + 1, []
    if lines:
        yield {"id": f"{path.name}:{count}", "title": "", "text": "\n".join(lines)}


READERS = {"wikiextractor": iter_wikiextractor, "text": iter_plain_text}


def corpus_files(root: Path, max_files: int | None = None) -> list[Path]:
    """The corpus files under ``root`` (or ``root`` itself), sorted so every run reads the same order; the first
    ``max_files`` of them (None: all)."""
    if max_files is not None and max_files < 1:  # 0 must not read all: data.max_files=0 is refused the same way
        raise SparseBertError(f"--max-files {max_files}: read at least 1 corpus file, or leave it out to read "
                              "them all")
    if not root.exists():
        raise SparseBertError(f"corpus not found: {root}")
    if root.is_file():
        return [root]
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))
    if not files:
        raise SparseBertError(f"corpus directory {root} is empty")
    return files[:max_files]


def iter_documents(files: list[str], fmt: str, max_documents: int | None = None) -> Iterator[Document]:
    """All documents of ``files`` in order (a generator for ``datasets.Dataset.from_generator``)."""
    reader = READERS[fmt]
    count = 0
    for name in files:
        for doc in reader(Path(name)):
            yield doc
            count += 1
            if max_documents is not None and count >= max_documents:
                return
