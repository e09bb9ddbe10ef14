"""Atomic writes: a reader never sees a half-written file or directory (a temp one beside it + rename), nor
some of a group of files that belong together without the others (:func:`atomic_write_all`).

Temp files and directories from ``tempfile`` are private to their owner (0600 / 0700); what is renamed into
place gets the permissions a plain ``open()`` or ``mkdir()`` would have given, so results on a shared file
system stay readable by the people the umask allows.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from sparsebert.errors import SparseBertError

# read once at import (os.umask can only be read by setting it; doing that later could race other threads)
_UMASK = os.umask(0)
os.umask(_UMASK)


def publish_permissions(path: str | os.PathLike) -> None:
    """Give a file or directory made by ``tempfile`` the default permissions under the process umask."""
    os.chmod(path, (0o777 if os.path.isdir(path) else 0o666) & ~_UMASK)


def publish_tree(path: str | os.PathLike) -> None:
    """:func:`publish_permissions` for a directory and everything under it: files that libraries wrote owner-only
    (safetensors writes 0600) become readable by whom the umask allows, as a plain ``open()`` would have made them."""
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            publish_permissions(os.path.join(root, name))
    publish_permissions(path)


def unwritable_reason(path: str | os.PathLike) -> str | None:
    """Why the file ``path`` cannot be written (with the directories above it that do not exist yet), or None.

    For a check before long work (loading a model, featurizing), so that a destination that cannot take the result
    fails at once, not at the end: a directory in its place, a file where a directory above it should be, or a
    nearest existing directory this process may not write in (``os.access``: as the write itself would find it)."""
    path = Path(path)
    if path.is_dir():
        return f"{path} is a directory"
    existing = next(p for p in path.parents if p.exists())  # "/" or "." at the latest
    if not existing.is_dir():
        return f"{existing} is a file, not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"the directory {existing} is not writable"
    return None


@contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Yields a temporary path beside ``path`` for the caller to write; on success it is renamed over ``path``,
    on any error removed. ``suffix`` matters to writers that pick a format from the name (matplotlib)."""
    path = Path(path)
    tmp = _temp_beside(path, suffix)
    try:
        yield tmp
        publish_permissions(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _temp_beside(path: Path, suffix: str = ".tmp") -> Path:
    """A new empty temporary file in ``path``'s directory (made if missing): in the same directory, so that renaming
    it over ``path`` is atomic (one file system)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    return Path(tmp)


def _no_guard(path: Path) -> AbstractContextManager[object]:
    return nullcontext()


def atomic_write_all(writers: Sequence[tuple[str | os.PathLike, Callable[[Path], object]]],
                     guard: Callable[[Path], AbstractContextManager[object]] = _no_guard) -> None:
    """Files that belong together (a prediction and the files beside it) appear all or none. Written one by one,
    each atomically, a failure of the second (a full disk) left the first in place: half a result that a later
    reader would trust. Here each writer writes a temporary file beside its destination, and only once every one
    has succeeded are they renamed into place. On any failure the temporaries are removed, so files that were there
    keep their old content; a rename that fails (rare: all temporaries are already written) also removes the files
    already renamed, whose old content is then lost, but no mix of old and new files is left.

    Args:
        writers: (destination, function that writes the path it is given) pairs, in the order they are written.
        guard: a context manager around each step of a destination (its temporary, its write, its rename), e.g.
            one that turns an OSError into an error that names the file.
    """
    staged: list[tuple[Path, Path]] = []  # (temporary, destination)
    placed: list[Path] = []
    try:
        for destination, write in writers:
            destination = Path(destination)
            with guard(destination):
                staged.append((_temp_beside(destination), destination))
                write(staged[-1][0])
                publish_permissions(staged[-1][0])
        for tmp, destination in reversed(staged):  # the first file, the one a reader looks for, appears last
            with guard(destination):
                os.replace(tmp, destination)
            placed.append(destination)
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        for destination in placed:
            destination.unlink(missing_ok=True)
        raise


def check_new_dir(path: str | os.PathLike, what: str) -> None:
    """Refuse a destination directory that is taken: a file, or a directory with anything in it (an exported model's
    files would be overwritten or mixed with ours). ``what`` names it in the one-line error (``--to DIR``)."""
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise SparseBertError(f"{what} exists and is not an empty directory; choose a new one")


@contextmanager
def atomic_dir(path: str | os.PathLike, what: str) -> Iterator[Path]:
    """Yields a new temporary directory beside ``path`` for the caller to fill; on success its tree gets the
    permissions of a plain ``mkdir`` and ``open`` and it is renamed to ``path`` (an empty directory there is
    replaced: a POSIX rename), on any error removed. So ``path`` holds the whole result or nothing. A taken ``path``
    is refused on entry (:func:`check_new_dir`), before the caller's long work.

    Args:
        path: the directory to make.
        what: how the one-line errors name it, e.g. ``--to DIR``.
    """
    check_new_dir(path, what)
    parent = Path(path).absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{Path(path).name}."))
    except OSError as e:
        raise SparseBertError(f"{what}: cannot write in {parent}: {e.strerror}") from None
    try:
        yield tmp
        publish_tree(tmp)  # mkdtemp made it 0700, and libraries write some files 0600 (safetensors)
        try:
            os.replace(tmp, path)
        except OSError as e:  # e.g. something else filled it meanwhile: what is there stays
            raise SparseBertError(f"{what}: cannot move the result there ({e.strerror}); choose a new "
                                  "directory") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    # numpy / torch scalars and paths end up in metrics and configs
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")
