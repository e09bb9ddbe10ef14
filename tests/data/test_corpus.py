"""Corpus readers on the real WikiExtractor files, the checked-in slice and malformed input; corpus file
discovery."""

from __future__ import annotations

import gzip
import lzma
import re
from pathlib import Path

import pytest

from sparsebert.data.corpus import corpus_files, iter_documents, iter_plain_text, iter_wikiextractor
from sparsebert.errors import SparseBertError

CORPUS = "wikipedia-enwiki-2015-wikiextractor"


@pytest.fixture(scope="module")
def wiki_00(data_dir) -> Path:
    return data_dir / CORPUS / "text" / "AA" / "wiki_00.gz"


@pytest.fixture(scope="module")
def wiki_01(data_dir) -> Path:
    return data_dir / CORPUS / "text" / "AA" / "wiki_01.gz"


@pytest.fixture(scope="module")
def wiki_asset(asset_data_dir) -> Path:
    """The checked-in slice: 12 short whole articles of wiki_00.gz - wiki_02.gz, as a plain (not gzipped) file."""
    return asset_data_dir / CORPUS / "text" / "AA" / "wiki_00"


def read_text(path: Path) -> str:
    """A corpus file's text (plain or .gz), read independently of the code under test."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read()


def doc_open_lines(path: Path) -> list[tuple[str, str]]:
    """(id, title) of every ``<doc `` line, read independently of the code under test."""
    return [(re.search(r'id="([^"]*)"', line).group(1), re.search(r'title="([^"]*)"', line).group(1))
            for line in read_text(path).split("\n") if line.startswith("<doc ")]


# --- WikiExtractor on the real files and the checked-in slice ------------------------------------------------


def assert_body_text_only(docs: list[dict]) -> None:
    for doc in docs:
        text = doc["text"]
        assert text
        assert "<doc" not in text and "</doc>" not in text
        lines = text.split("\n")
        assert lines[0] != doc["title"], f"title line left in the text of {doc['title']!r}"
        assert all(line and line == line.strip() for line in lines), "blank or unstripped paragraph"


def first_document_text(path: Path, doc_id: str, title: str) -> str:
    """The first document's paragraphs: the non-blank lines between its title line and </doc>."""
    raw = read_text(path).split("\n")
    assert raw[0].startswith(f'<doc id="{doc_id}"') and raw[1] == title
    return "\n".join(line.strip() for line in raw[2:raw.index("</doc>")] if line.strip())


def test_real_file_yields_every_document_in_order(wiki_00):
    docs = list(iter_wikiextractor(wiki_00))
    expected = doc_open_lines(wiki_00)
    assert len(expected) == 38
    assert len(docs) == len(expected)
    assert [(d["id"], d["title"]) for d in docs] == expected
    assert docs[0]["id"] == "12" and docs[0]["title"] == "Anarchism"


def test_real_documents_hold_body_text_only(wiki_00):
    docs = list(iter_wikiextractor(wiki_00))
    assert_body_text_only(docs)
    anarchism = docs[0]["text"]
    assert anarchism.startswith("Anarchism is a political philosophy that advocates stateless societies")


def test_real_document_text_matches_the_file(wiki_00):
    assert next(iter_wikiextractor(wiki_00))["text"] == first_document_text(wiki_00, "12", "Anarchism")


def test_asset_file_reads_like_the_real_ones(wiki_asset):
    docs = list(iter_wikiextractor(wiki_asset))
    assert [(d["id"], d["title"]) for d in docs] == doc_open_lines(wiki_asset)
    assert len(docs) == 12 and (docs[0]["id"], docs[0]["title"]) == ("316", "Academy Award for Best Production Design")
    assert_body_text_only(docs)
    assert docs[0]["text"] == first_document_text(wiki_asset, "316", "Academy Award for Best Production Design")
    assert corpus_files(wiki_asset.parents[2]) == [wiki_asset]


def test_second_real_file(wiki_01):
    docs = list(iter_wikiextractor(wiki_01))
    assert [(d["id"], d["title"]) for d in docs] == doc_open_lines(wiki_01)
    assert len(docs) == 53


# --- WikiExtractor on small temp files -------------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    elif path.suffix == ".xz":
        with lzma.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def doc(id_: str, title: str, *paragraphs: str) -> str:
    body = "".join(f"{p}\n" for p in paragraphs)
    return f'<doc id="{id_}" url="http://x/?curid={id_}" title="{title}">\n{title}\n{body}</doc>\n'


@pytest.mark.parametrize("suffix", ["", ".gz", ".xz"])
def test_small_wikiextractor_file(tmp_path, suffix):
    text = doc("1", "First", "", "Para one.", "  Para two.  ", "") + "\n" + doc("2", "Second", "Only para.")
    path = write(tmp_path / f"wiki_00{suffix}", text)
    docs = list(iter_wikiextractor(path))
    assert docs == [
        {"id": "1", "title": "First", "text": "Para one.\nPara two."},
        {"id": "2", "title": "Second", "text": "Only para."},
    ]


@pytest.mark.parametrize("suffix", ["", ".gz", ".xz"])
def test_a_byte_order_mark_is_accepted(tmp_path, suffix):
    wiki = write(tmp_path / f"wiki_00{suffix}", "\ufeff" + doc("1", "First", "Body."))
    assert [d["text"] for d in iter_wikiextractor(wiki)] == ["Body."]
    text = write(tmp_path / f"plain{suffix}", "\ufeffFirst line.\n")
    assert [d["text"] for d in iter_plain_text(text)] == ["First line."]


def test_document_without_body_is_skipped(tmp_path):
    path = write(tmp_path / "wiki_00", doc("1", "Stub") + doc("2", "Real", "Body."))
    assert [d["id"] for d in iter_wikiextractor(path)] == ["2"]


def test_title_line_is_kept_when_it_is_not_the_title(tmp_path):
    text = '<doc id="5" url="u" title="Name">\nSomething else\nMore.\n</doc>\n'
    path = write(tmp_path / "wiki_00", text)
    assert next(iter_wikiextractor(path))["text"] == "Something else\nMore."


@pytest.mark.parametrize("text,lineno,what", [
    (doc("1", "A", "x").replace("</doc>\n", "") + doc("2", "B", "y"), 4, "<doc> opened before"),  # nested
    ("</doc>\n", 1, "without an open"),
    (doc("1", "A", "x") + "stray text\n", 5, "outside a <doc>"),
    ('<doc id="1" title="A">\nA\n</doc>\n', 1, "malformed <doc>"),
])
def test_malformed_wikiextractor_names_file_and_line(tmp_path, text, lineno, what):
    path = write(tmp_path / "wiki_07", text)
    with pytest.raises(SparseBertError) as e:
        list(iter_wikiextractor(path))
    msg = str(e.value)
    assert f"{path}:{lineno}:" in msg
    assert what in msg


def test_file_ending_inside_a_document_is_an_error(tmp_path):
    path = write(tmp_path / "wiki_08", doc("1", "A", "x") + '<doc id="77" url="u" title="B">\nB\nhalf a para')
    with pytest.raises(SparseBertError) as e:
        list(iter_wikiextractor(path))
    msg = str(e.value)
    assert str(path) in msg and 'id="77"' in msg and "truncated" in msg


def test_truncated_real_gz_names_the_file(tmp_path, wiki_00):
    data = wiki_00.read_bytes()
    path = tmp_path / "wiki_00.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(SparseBertError) as e:
        list(iter_wikiextractor(path))
    assert f"cannot read corpus file {path}" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("suffix", [".gz", ".xz"])
def test_garbage_archive_names_the_file(tmp_path, suffix):
    path = tmp_path / f"wiki_00{suffix}"
    path.write_bytes(b"this is not a compressed file at all" * 50)
    with pytest.raises(SparseBertError) as e:
        list(iter_wikiextractor(path))
    assert str(path) in str(e.value)


def test_truncated_xz_names_the_file(tmp_path):
    full = lzma.compress(("".join(doc(str(i), f"T{i}", f"para {i} " * 50) for i in range(200))).encode())
    path = tmp_path / "wiki_00.xz"
    path.write_bytes(full[: len(full) // 2])
    with pytest.raises(SparseBertError) as e:
        list(iter_wikiextractor(path))
    assert str(path) in str(e.value)


def test_non_utf8_file_names_the_file(tmp_path):
    path = tmp_path / "wiki_00"
    path.write_bytes(b'<doc id="1" url="u" title="A">\nA\ncaf\xe9 \xff\xfe\n</doc>\n')
    with pytest.raises(SparseBertError) as e:
        list(iter_wikiextractor(path))
    assert str(path) in str(e.value) and "UTF-8" in str(e.value)


# --- plain text --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".txt", ".txt.gz"])
def test_plain_text_documents_are_separated_by_blank_lines(tmp_path, suffix):
    path = write(tmp_path / f"corpus{suffix}", "\n\nfirst line\n  second line \n\n\n   \nother doc\n\nlast\nend")
    docs = list(iter_plain_text(path))
    assert docs == [
        {"id": f"{path.name}:0", "title": "", "text": "first line\nsecond line"},
        {"id": f"{path.name}:1", "title": "", "text": "other doc"},
        {"id": f"{path.name}:2", "title": "", "text": "last\nend"},
    ]


def test_plain_text_empty_file_has_no_documents(tmp_path):
    assert list(iter_plain_text(write(tmp_path / "e.txt", "\n\n  \n"))) == []


# --- corpus files --------------------------------------------------------------------------------------------


def test_corpus_files_sorted_recursive_without_hidden(tmp_path):
    for rel in ["b/wiki_00", "a/wiki_01", "a/wiki_00", "c.txt", ".hidden", "a/.DS_Store"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    (tmp_path / "emptydir").mkdir()
    files = corpus_files(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in files] == ["a/wiki_00", "a/wiki_01", "b/wiki_00", "c.txt"]
    assert [p.relative_to(tmp_path).as_posix() for p in corpus_files(tmp_path, max_files=2)] == \
        ["a/wiki_00", "a/wiki_01"]
    assert corpus_files(tmp_path, max_files=100) == files


def test_corpus_files_of_a_single_file(tmp_path):
    path = write(tmp_path / "one.txt", "a\n")
    assert corpus_files(path) == [path]
    assert corpus_files(path, max_files=1) == [path]


def test_corpus_files_real_corpus(data_dir):
    root = data_dir / CORPUS
    first_two = corpus_files(root, max_files=2)
    assert [p.relative_to(root).as_posix() for p in first_two] == ["text/AA/wiki_00.gz", "text/AA/wiki_01.gz"]
    everything = corpus_files(root)
    assert len(everything) == 200
    assert everything[:2] == first_two
    assert everything == sorted(everything)


@pytest.mark.parametrize("max_files", [0, -1])
def test_corpus_files_refuses_a_limit_below_one(tmp_path, max_files):
    (tmp_path / "a.txt").write_text("x\n")
    with pytest.raises(SparseBertError, match=f"--max-files {max_files}: read at least 1 corpus file"):
        corpus_files(tmp_path, max_files=max_files)  # 0 once read every file


def test_corpus_files_empty_dir_is_an_error(tmp_path):
    (tmp_path / "corpus" / "sub").mkdir(parents=True)
    (tmp_path / "corpus" / ".hidden").write_text("x")
    with pytest.raises(SparseBertError) as e:
        corpus_files(tmp_path / "corpus")
    assert str(tmp_path / "corpus") in str(e.value) and "empty" in str(e.value)


def test_corpus_files_missing_path_is_an_error(tmp_path):
    with pytest.raises(SparseBertError) as e:
        corpus_files(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(e.value)


# --- iter_documents ------------------------------------------------------------------------------------------


def test_iter_documents_reads_files_in_order(wiki_00, wiki_01):
    docs = list(iter_documents([str(wiki_00), str(wiki_01)], "wikiextractor"))
    expected = doc_open_lines(wiki_00) + doc_open_lines(wiki_01)
    assert [(d["id"], d["title"]) for d in docs] == expected
    assert len(docs) == 38 + 53


@pytest.mark.parametrize("limit", [1, 38, 40])
def test_iter_documents_max_documents(wiki_00, wiki_01, limit):
    docs = list(iter_documents([str(wiki_00), str(wiki_01)], "wikiextractor", max_documents=limit))
    expected = (doc_open_lines(wiki_00) + doc_open_lines(wiki_01))[:limit]
    assert [(d["id"], d["title"]) for d in docs] == expected


def test_iter_documents_plain_text(tmp_path):
    a = write(tmp_path / "a.txt", "one\n\ntwo\n")
    b = write(tmp_path / "b.txt", "three\n")
    docs = list(iter_documents([str(a), str(b)], "text"))
    assert [d["text"] for d in docs] == ["one", "two", "three"]
    assert [d["id"] for d in docs] == ["a.txt:0", "a.txt:1", "b.txt:0"]
    assert [d["text"] for d in iter_documents([str(a), str(b)], "text", max_documents=2)] == ["one", "two"]
