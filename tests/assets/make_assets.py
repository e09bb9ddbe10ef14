"""Rebuild tests/assets/data from the real data directory: python tests/assets/make_assets.py [DATA_DIR].

Every asset is real text copied verbatim (see README.md beside this script): TSVs are the header and the first
rows byte for byte; the SQuAD file keeps whole paragraphs of the first articles; the corpus keeps whole documents.
``tests/test_assets.py`` checks, wherever the real data is present, that the assets are exactly what this script
makes from it.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "data"
CORPUS = "wikipedia-enwiki-2015-wikiextractor"

# (path under the data directory, data rows after the header)
TSV_SLICES = [
    ("glue/RTE/train.tsv", 20), ("glue/RTE/dev.tsv", 20),
    ("glue/STS-B/train.tsv", 20), ("glue/STS-B/dev.tsv", 20),
    ("gap/gap-development.tsv", 10), ("gap/gap-validation.tsv", 5),
]
# SQuAD v1.1 dev: the first paragraph of each of the first 3 articles, with at most 6 of its questions
SQUAD_ARTICLES, SQUAD_QUESTIONS = 3, 6
# short whole articles (600 B - 2.2 KB each) from the first three corpus files, in corpus order
CORPUS_DOCS = {"wiki_00.gz": ["316", "330", "332", "340"], "wiki_01.gz": ["642", "675", "708"],
               "wiki_02.gz": ["742", "766", "779", "788", "809"]}


def head_lines(path: Path, rows: int) -> bytes:
    """The header and the first ``rows`` lines of ``path``, byte for byte."""
    data = path.read_bytes()
    end = -1
    for _ in range(rows + 1):
        end = data.index(b"\n", end + 1)
    return data[:end + 1]


def squad_slice(path: Path) -> str:
    real = json.loads(path.read_text(encoding="utf-8"))
    articles = [{"title": a["title"], "paragraphs": [{**a["paragraphs"][0],
                                                      "qas": a["paragraphs"][0]["qas"][:SQUAD_QUESTIONS]}]}
                for a in real["data"][:SQUAD_ARTICLES]]
    return json.dumps({"data": articles, "version": real["version"]}) + "\n"  # one line, as the real file


def corpus_slice(text_dir: Path) -> str:
    out = []
    for name, ids in CORPUS_DOCS.items():
        with gzip.open(text_dir / name, "rt", encoding="utf-8") as f:
            docs = {m.group(1): m.group(0) for m in re.finditer(r'<doc id="(\d+)".*?</doc>\n', f.read(), re.S)}
        out += [docs[i] for i in ids]
    return "".join(out)


def build(data_dir: Path) -> dict[str, bytes]:
    """Every asset file's content by its path under ``data/``, made from the real data directory."""
    out = {rel: head_lines(data_dir / rel, rows) for rel, rows in TSV_SLICES}
    out["squad/dev-v1.1.json"] = squad_slice(data_dir / "squad" / "dev-v1.1.json").encode()
    # plain text, not .gz: the corpus reader takes plain, .gz or .xz files, and plain text diffs well
    out[f"{CORPUS}/text/AA/wiki_00"] = corpus_slice(data_dir / CORPUS / "text" / "AA").encode()
    return out


def main(data_dir: Path) -> None:
    for rel, content in build(data_dir).items():
        (OUT / rel).parent.mkdir(parents=True, exist_ok=True)
        (OUT / rel).write_bytes(content)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[3] / "shared" / "data")
