"""Atomic writes: readers never see half a file, a failed write leaves the old file, results keep the default
permissions (tempfile's private 0600 would hide them from the rest of a team on a shared file system)."""

from __future__ import annotations

import os
import stat

import pytest

from sparsebert.io import atomic_path, atomic_write_json, atomic_write_text


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
