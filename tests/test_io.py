"""Atomic writes: readers never see half a file, a failed write leaves the old file, results keep the default
permissions (tempfile's private 0600 would hide them from the rest of a team on a shared file system)."""

from __future__ import annotations

import errno
import os
import stat
from contextlib import contextmanager

import pytest

from sparsebert.io import atomic_path, atomic_write_all, atomic_write_json, atomic_write_text


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_written_files_get_default_permissions_not_tempfile_private(tmp_path, monkeypatch):
    import sparsebert.io as sio

    monkeypatch.setattr(sio, "_UMASK", 0o022)  # the usual umask; tempfile alone would give 0600
    atomic_write_text(tmp_path / "a.txt", "x")
    atomic_write_json(tmp_path / "b.json", {"k": 1})
    assert mode(tmp_path / "a.txt") == 0o644
    assert mode(tmp_path / "b.json") == 0o644


def test_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "metrics.json"
    atomic_write_text(target, "old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_atomic_path_keeps_the_suffix_for_format_sniffing_writers(tmp_path):
    with atomic_path(tmp_path / "plot.png", suffix=".png") as tmp:
        assert tmp.suffix == ".png" and tmp.parent == tmp_path
        tmp.write_bytes(b"png")
    assert (tmp_path / "plot.png").read_bytes() == b"png"


def test_a_directory_appears_whole_with_default_permissions_or_not_at_all(tmp_path, monkeypatch):
    import sparsebert.io as sio
    from sparsebert.errors import SparseBertError

    monkeypatch.setattr(sio, "_UMASK", 0o022)
    out = tmp_path / "export"
    with pytest.raises(RuntimeError), sio.atomic_dir(out, f"--to {out}") as tmp:
        (tmp / "half.json").write_text("{")
        raise RuntimeError("the export failed halfway")
    assert list(tmp_path.iterdir()) == []  # neither the directory nor its temporary one

    out.mkdir()  # an empty directory is taken over; one with files in it is refused
    with sio.atomic_dir(out, f"--to {out}") as tmp:
        (tmp / "config.json").write_text("{}")
        os.chmod(tmp / "config.json", 0o600)  # as safetensors writes its files
    assert [p.name for p in tmp_path.iterdir()] == ["export"] and mode(out) == 0o755
    assert mode(out / "config.json") == 0o644
    with pytest.raises(SparseBertError, match=f"--to {out} exists and is not an empty directory"):
        sio.check_new_dir(out, f"--to {out}")


def _full_disk(path) -> None:
    path.write_text("half")  # as a writer that got partway
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_files_written_together_appear_all_or_none(tmp_path, monkeypatch):
    """The first file was left in place when the second failed: half a result that a later reader would trust."""
    import sparsebert.io as sio

    monkeypatch.setattr(sio, "_UMASK", 0o022)
    first, second = tmp_path / "out" / "pred.json", tmp_path / "out" / "pred_nbest.json"
    with pytest.raises(OSError, match="No space left"):
        atomic_write_all([(first, lambda p: p.write_text("new")), (second, _full_disk)])
    assert list((tmp_path / "out").iterdir()) == []  # neither the first file nor a temporary

    first.write_text("old")
    second.write_text("old nbest")
    with pytest.raises(OSError):
        atomic_write_all([(first, lambda p: p.write_text("new")), (second, _full_disk)])
    assert first.read_text() == "old" and second.read_text() == "old nbest"
    assert sorted(p.name for p in first.parent.iterdir()) == ["pred.json", "pred_nbest.json"]

    atomic_write_all([(first, lambda p: atomic_write_text(p, "new")), (second, lambda p: p.write_text("nbest"))])
    assert first.read_text() == "new" and second.read_text() == "nbest"
    assert sorted(p.name for p in first.parent.iterdir()) == ["pred.json", "pred_nbest.json"]
    assert mode(first) == mode(second) == 0o644


def test_a_failed_rename_removes_the_files_already_renamed_and_the_guard_names_the_file(tmp_path):
    from sparsebert.errors import SparseBertError

    @contextmanager
    def naming(path):
        try:
            yield
        except OSError as e:
            raise SparseBertError(f"cannot write {path}: {e.strerror}") from None

    first, second = tmp_path / "pred.json", tmp_path / "pred_nbest.json"
    first.mkdir()  # written to a temporary fine; the rename over a directory fails, after the second's
    with pytest.raises(SparseBertError, match=f"^cannot write {first}: Is a directory$"):
        atomic_write_all([(first, lambda p: p.write_text("new")), (second, lambda p: p.write_text("nbest"))],
                         guard=naming)
    assert [p.name for p in tmp_path.iterdir()] == ["pred.json"] and first.is_dir()
