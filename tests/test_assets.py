"""The checked-in assets (``tests/assets/data``) are what ``tests/assets/README.md`` says they are: small, listed,
and real rows copied verbatim. Tests that moved from the real files to the assets rely on the last point."""

from __future__ import annotations

from pathlib import Path

from module_loading import load_module

ASSETS = Path(__file__).resolve().parent / "assets"


def asset_files(asset_data_dir: Path) -> dict[str, bytes]:
    return {p.relative_to(asset_data_dir).as_posix(): p.read_bytes()
            for p in sorted(asset_data_dir.rglob("*")) if p.is_file()}


def test_assets_stay_small(asset_data_dir):
    sizes = {name: len(content) for name, content in asset_files(asset_data_dir).items()}
    assert sum(sizes.values()) < 100_000, sizes  # the repository stays small
    assert max(sizes.values()) < 20_000, sizes


def test_every_asset_is_described_in_the_readme(asset_data_dir):
    readme = (ASSETS / "README.md").read_text(encoding="utf-8")
    for name in asset_files(asset_data_dir):
        assert f"`{name}`" in readme, name


def test_assets_are_what_make_assets_makes_from_the_real_data(data_dir, asset_data_dir):
    """Byte for byte: the real files' first rows, whole SQuAD paragraphs, whole corpus documents."""
    make_assets = load_module(ASSETS / "make_assets.py")
    assets, made = asset_files(asset_data_dir), make_assets.build(data_dir)
    assert sorted(assets) == sorted(made)
    for name, content in made.items():
        assert assets[name] == content, f"{name} differs: run python tests/assets/make_assets.py"
