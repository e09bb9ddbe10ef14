"""SQuAD reading (the real dev files and a checked-in slice), splitting, windowed features (on real dev data),
span decoding and metrics."""

from __future__ import annotations

import json
import math
import unicodedata

import datasets
import numpy as np
import pytest

from sparsebert.data.squad import (
    postprocess_predictions,
    prepare_eval_features,
    prepare_train_features,
    read_squad,
    split_by_article,
)
from sparsebert.errors import SparseBertError
from sparsebert.jobs.finetune.squad import (
    squad_metrics,
)

SEQ, STRIDE = 128, 32


@pytest.fixture(scope="module")
def v1(data_dir):
    return read_squad(data_dir / "squad" / "dev-v1.1.json")


@pytest.fixture(scope="module")
def v2(data_dir):
    return read_squad(data_dir / "squad" / "dev-v2.0.reconstructed.json")


@pytest.fixture(scope="module")
def v1_asset(asset_data_dir):
    """The checked-in slice of dev-v1.1.json: the first paragraph of each of its first 3 articles, 6 questions or
    fewer each."""
    return asset_data_dir / "squad" / "dev-v1.1.json"


@pytest.fixture(scope="module")
def sample(v1, v2):
    """Answerable v1 questions plus v2 questions of both kinds, as a Dataset (what datasets.map sees)."""
    rows = v1[:150] + [ex for ex in v2[:400] if ex["is_impossible"]][:40] + v2[1000:1040]
    return datasets.Dataset.from_list(rows)


@pytest.fixture(scope="module")
def features(sample, tokenizer):
    kw = dict(tokenizer=tokenizer, max_seq_length=SEQ, doc_stride=STRIDE)
    train = sample.map(prepare_train_features, batched=True, remove_columns=sample.column_names, fn_kwargs=kw)
    evals = sample.map(prepare_eval_features, batched=True, remove_columns=sample.column_names, fn_kwargs=kw)
    return train, evals


def squash(text: str) -> str:
    """What an uncased WordPiece decode can be compared on: no accents, case, spaces or punctuation."""
    text = unicodedata.normalize("NFD", text.lower())
    return "".join(c for c in text if c.isalnum() and not unicodedata.combining(c))


# ---------------------------------------------------------------------------------------------- reading


def test_read_real_files(v1, v2):
    assert len(v1) == 10570 and len({ex["title"] for ex in v1}) == 48
    assert not any(ex["is_impossible"] for ex in v1)
    assert len(v2) == 11873
    assert sum(not ex["is_impossible"] for ex in v2) == 5928
    assert sum(ex["is_impossible"] for ex in v2) == 5945
    first = v1[0]
    assert first["id"] == "56be4db0acb8001400a502ec"
    assert first["title"] == "Super_Bowl_50"
    assert first["answers"]["text"][0] == "Denver Broncos"
    assert first["context"][first["answers"]["answer_start"][0] :].startswith("Denver Broncos")
    assert all(ex["answers"]["text"] == [] for ex in v2 if ex["is_impossible"])


def test_read_asset_file(v1_asset):
    examples = read_squad(v1_asset)
    assert [ex["title"] for ex in examples] == ["Super_Bowl_50"] * 6 + ["Warsaw"] * 5 + ["Normans"] * 5
    assert not any(ex["is_impossible"] for ex in examples)
    first = examples[0]
    assert first["id"] == "56be4db0acb8001400a502ec" and first["answers"]["text"][0] == "Denver Broncos"
    for ex in examples:  # every answer is where its offset says
        for text, start in zip(ex["answers"]["text"], ex["answers"]["answer_start"]):
            assert ex["context"][start:start + len(text)] == text
    train, evals = split_by_article(examples, 1 / 3, seed=3)
    assert len({ex["title"] for ex in evals}) == 1 and len(train) + len(evals) == len(examples)


def test_a_byte_order_mark_is_accepted(tmp_path, v1_asset):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + v1_asset.read_bytes())
    assert read_squad(path) == read_squad(v1_asset)


def test_truncated_json_names_file(tmp_path, v1_asset):
    text = v1_asset.read_text(encoding="utf-8")
    bad = tmp_path / "cut.json"
    bad.write_text(text[:5000], encoding="utf-8")
    with pytest.raises(SparseBertError, match="cut.json"):
        read_squad(bad)


def test_missing_key_names_file_and_question(tmp_path):
    data = {
        "data": [{"title": "T", "paragraphs": [{"context": "abc", "qas": [{"id": "q1", "answers": []}]}]}]
    }
    path = tmp_path / "noq.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(SparseBertError, match=r"noq\.json.*q1.*question"):
        read_squad(path)


def test_answer_not_at_start_is_an_error(tmp_path):
    qa = {"id": "q9", "question": "?", "answers": [{"text": "abc", "answer_start": 1}]}
    data = {"data": [{"title": "T", "paragraphs": [{"context": "xabcx", "qas": [qa]}]}]}
    (tmp_path / "ok.json").write_text(json.dumps(data), encoding="utf-8")
    qa["answers"][0]["answer_start"] = 2
    (tmp_path / "bad.json").write_text(json.dumps(data), encoding="utf-8")
    assert read_squad(tmp_path / "ok.json")[0]["answers"] == {"text": ["abc"], "answer_start": [1]}
    with pytest.raises(SparseBertError, match=r"bad\.json.*q9"):
        read_squad(tmp_path / "bad.json")


@pytest.mark.parametrize("answer, why", [
    ({"text": "abc", "answer_start": -4}, "not found"),  # would slice from the end: "abc" of "xabcx" is at -4
    ({"text": "", "answer_start": 99999}, "empty answer"),  # matches anywhere, trained as unanswerable
    ({"text": "  ", "answer_start": 0}, "empty answer"),
])
def test_negative_offsets_and_empty_answers_are_errors(tmp_path, answer, why):
    qa = {"id": "q7", "question": "?", "answers": [answer]}
    (tmp_path / "bad.json").write_text(json.dumps(
        {"data": [{"title": "T", "paragraphs": [{"context": "xabcx  ", "qas": [qa]}]}]}), encoding="utf-8")
    with pytest.raises(SparseBertError, match=rf"bad\.json.*q7.*{why}"):
        read_squad(tmp_path / "bad.json")


def test_non_utf8_file_and_non_object_question_are_one_line_errors(tmp_path):
    (tmp_path / "latin1.json").write_bytes(b'{"data": [{"title": "caf\xe9"}]}')  # Latin-1, not UTF-8
    with pytest.raises(SparseBertError, match=r"latin1\.json: not UTF-8"):
        read_squad(tmp_path / "latin1.json")
    (tmp_path / "qas.json").write_text(json.dumps(
        {"data": [{"title": "T", "paragraphs": [{"context": "abc", "qas": ["oops"]}]}]}), encoding="utf-8")
    with pytest.raises(SparseBertError, match=r"qas\.json.*not an object"):
        read_squad(tmp_path / "qas.json")


def _one_question(**changes) -> dict:
    """A SQuAD file of one answerable question, with ``changes`` to its fields (``title`` and ``context`` go to
    the article and the paragraph)."""
    article = {"title": changes.pop("title", "T"), "paragraphs": [{"context": changes.pop("context", "xabcx"), "qas": [
        {"id": "q1", "question": "Where?", "answers": [{"text": "abc", "answer_start": 1}], **changes}]}]}
    return {"data": [article]}


@pytest.mark.parametrize("changes, message", [
    ({"question": 42}, "question 0 (id q1): 'question' is int 42, not text"),
    ({"question": None}, "question 0 (id q1): 'question' is NoneType None, not text"),
    ({"question": ""}, "question 0 (id q1): 'question' is empty"),
    ({"id": 7}, "question 0: 'id' is int 7, not text"),
    ({"context": ["xabcx"]}, "paragraph 0: 'context' is list ['xabcx'], not text"),
    ({"title": 3}, "article 0: 'title' is int 3, not text"),
    ({"answers": {"text": "abc"}}, "(id q1): 'answers' is dict, not a list"),
    ({"answers": [{"text": 5, "answer_start": 1}]}, "(id q1), answer 0: 'text' is int 5, not text"),
    ({"answers": [{"text": "abc", "answer_start": "1"}]}, "answer 0: 'answer_start' is str '1', not an integer"),
    ({"answers": ["abc"]}, "(id q1): answer 0 is not an object with 'text' and 'answer_start'"),
    ({"is_impossible": "no"}, "(id q1): 'is_impossible' is str 'no', not true or false"),
])
@pytest.mark.parametrize("answers_optional", [False, True], ids=["training", "predict"])
def test_a_field_of_the_wrong_type_is_one_line_naming_file_entry_and_field(tmp_path, changes, message,
                                                                          answers_optional):
    """Every field is checked where it is read, for training and --predict alike: a number for a question would
    otherwise fail in pyarrow or the tokenizer, long after the file was read."""
    path = tmp_path / "typed.json"
    path.write_text(json.dumps(_one_question(**changes)), encoding="utf-8")
    with pytest.raises(SparseBertError) as refused:
        read_squad(path, answers_optional=answers_optional)
    assert str(refused.value).startswith(f"{path}: article 0") and message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_training_run_on_a_squad_file_with_a_number_for_a_question_is_refused_before_its_directory(
        tmp_path, capsys):
    """Training reads the same way (the issue: a pyarrow ArrowInvalid traceback while featurizing)."""
    from pathlib import Path

    from sparsebert.cli import main

    data = tmp_path / "data"
    (data / "squad").mkdir(parents=True)
    good = {"id": "q0", "question": "Where?", "answers": [{"text": "abc", "answer_start": 1}]}
    (data / "squad" / "dev-v1.1.json").write_text(json.dumps({"data": [
        {"title": f"T{k}", "paragraphs": [{"context": "xabcx", "qas": [{**good, "id": f"q{k}"}]}]}
        for k in range(4)] + [_one_question(question=42, title="T9", id="q9")["data"][0]]}), encoding="utf-8")
    code = main(["tiny_squad", "--output-dir", str(tmp_path / "runs"), "--data-dir", str(data)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: ") and "'question' is int 42, not text" in err[-1], err[-5:]
    assert not (tmp_path / "runs" / "tiny_squad").exists()


def test_split_by_article(v1):
    train, evals = split_by_article(v1, 0.25, seed=3)
    train_titles = {ex["title"] for ex in train}
    eval_titles = {ex["title"] for ex in evals}
    assert not train_titles & eval_titles
    assert len(eval_titles) == 12 and len(train_titles) == 36
    assert len(train) + len(evals) == len(v1)
    assert {ex["id"] for ex in train} | {ex["id"] for ex in evals} == {ex["id"] for ex in v1}
    # deterministic, independent of input order, and the seed matters
    again = split_by_article(list(reversed(v1)), 0.25, seed=3)[1]
    assert {ex["title"] for ex in again} == eval_titles
    assert {ex["title"] for ex in split_by_article(v1, 0.25, seed=4)[1]} != eval_titles
    with pytest.raises(SparseBertError):
        split_by_article(v1, 1.0, seed=0)


# ---------------------------------------------------------------------------------------------- features


def test_train_labels_decode_to_answer(sample, features, tokenizer):
    train, evals = features
    assert train["input_ids"] == evals["input_ids"]  # same windows, so eval offsets describe train rows
    by_id = {ex["id"]: ex for ex in sample}
    found = set()
    n_windows = n_exact = 0
    for feat, ev in zip(train, evals):
        ex = by_id[ev["example_id"]]
        s, e = feat["start_positions"], feat["end_positions"]
        offs = [o for o in ev["offset_mapping"] if o is not None]
        if not ex["answers"]["text"]:
            assert s == e == 0
            continue
        a0 = ex["answers"]["answer_start"][0]
        a1 = a0 + len(ex["answers"]["text"][0])
        inside = offs[0][0] <= a0 and a1 <= offs[-1][1]
        assert (s != 0) == inside, ex["id"]
        if inside:
            found.add(ex["id"])
            assert 0 < s <= e
            assert ev["offset_mapping"][s] is not None and ev["offset_mapping"][e] is not None
            om = ev["offset_mapping"]
            # the labelled tokens are the smallest token span covering the answer characters
            assert om[s][0] <= a0 < om[s][1] and om[e][0] < a1 <= om[e][1], ex["id"]
            decoded = squash(tokenizer.decode(feat["input_ids"][s : e + 1]))
            assert decoded == squash(ex["context"][om[s][0] : om[e][1]])
            # ... which decodes to the answer itself unless the answer is part of a token ("gold" in "golden")
            n_windows += 1
            n_exact += decoded == squash(ex["answers"]["text"][0])
    # every answerable question's (short) answer is labelled in at least one window
    assert found == {ex["id"] for ex in sample if ex["answers"]["text"]}
    assert n_exact >= 0.9 * n_windows  # 173 of 181 here; the rest are answers like "8" inside "18"


def test_windows_cover_context_with_stride_overlap(sample, features):
    _, evals = features
    windows: dict[str, list] = {}
    for ev in evals:
        windows.setdefault(ev["example_id"], []).append(ev)
    assert len(evals) > len(sample)  # some contexts need several windows at 128 tokens
    n_multi = 0
    for ex in sample:
        ctx = ex["context"]
        wins = windows[ex["id"]]
        spans = [[tuple(o) for o in w["offset_mapping"] if o is not None] for w in wins]
        assert spans[0][0][0] == len(ctx) - len(ctx.lstrip())
        assert spans[-1][-1][1] == len(ctx.rstrip())
        for prev, nxt in zip(spans, spans[1:]):
            n_multi += 1
            assert prev[-STRIDE:] == nxt[:STRIDE]  # doc_stride = tokens shared by consecutive windows
        for w in wins:
            assert len(w["input_ids"]) == SEQ
    assert n_multi > 50


def test_question_truncated_to_max_query_length(tokenizer):
    batch = {
        "id": ["q"],
        "question": ["why " * 100 + "?"],
        "context": ["A short context about nothing in particular."],
        "answers": [{"text": ["nothing"], "answer_start": [22]}],
    }
    out = prepare_train_features(batch, tokenizer, max_seq_length=64, doc_stride=8, max_query_length=10)
    assert len(out["input_ids"]) == 1
    assert out["input_ids"][0][:12] == [tokenizer.cls_token_id] + [
        tokenizer.convert_tokens_to_ids("why")
    ] * 10 + [tokenizer.sep_token_id]
    s, e = out["start_positions"][0], out["end_positions"][0]
    assert tokenizer.decode(out["input_ids"][0][s : e + 1]) == "nothing"


def test_oracle_logits_recover_answers(sample, features):
    """Logits peaked at the train labels → postprocessing reproduces the gold answers."""
    train, evals = features
    n = len(train)
    start = np.zeros((n, SEQ))
    end = np.zeros((n, SEQ))
    start[np.arange(n), train["start_positions"]] = 10.0
    end[np.arange(n), train["end_positions"]] = 10.0
    answerable = sample.filter(lambda ex: len(ex["answers"]["text"]) > 0)
    preds, _ = postprocess_predictions(answerable, evals, start, end)
    metrics = squad_metrics(answerable, preds, version_2=False)
    assert metrics["total"] == len(answerable)
    assert metrics["exact"] > 95.0


# ---------------------------------------------------------------------------------------------- decoding

CTX = "Paris is the capital of France and its largest city."
# char offsets of each word of CTX
WORDS = [
    (0, 5),
    (6, 8),
    (9, 12),
    (13, 20),
    (21, 23),
    (24, 30),
    (31, 34),
    (35, 38),
    (39, 46),
    (47, 51),
    (51, 52),
]


def _feature(example_id: str, words: list[tuple[int, int]], length: int = 16) -> tuple[str, list]:
    # [CLS] q q [SEP] <context words> [SEP] <pad>: tokens 0-3 are not context
    offsets: list = [None] * 4 + [list(w) for w in words] + [None]
    return example_id, offsets + [None] * (length - len(offsets))


def _run(features, logits, **kw):
    ids, offs = zip(*features)
    start = np.array([s for s, _ in logits], dtype=float)
    end = np.array([e for _, e in logits], dtype=float)
    return postprocess_predictions(
        [{"id": "q", "context": CTX}], {"example_id": ids, "offset_mapping": offs}, start, end, **kw
    )


def _logits(starts: dict[int, float], ends: dict[int, float], length: int = 16):
    s = np.full(length, -5.0)
    e = np.full(length, -5.0)
    for i, v in starts.items():
        s[i] = v
    for i, v in ends.items():
        e[i] = v
    return s, e


def test_postprocess_picks_best_valid_span():
    feat = _feature("q", WORDS)
    # token 4 = "Paris", 9 = "France"; question token 1 has the highest start logit but is not context
    pred, _ = _run([feat], [_logits({1: 9.0, 9: 4.0, 4: 3.0}, {9: 4.0, 1: 8.0})])
    assert pred == {"q": "France"}
    # end before start is rejected even though 9→4 has the highest sum
    pred, _ = _run([feat], [_logits({9: 6.0, 4: 1.0}, {4: 0.5, 5: 6.0})])
    assert pred == {"q": "Paris is"}
    # span "capital of France" (tokens 7..9) is 3 tokens: allowed at 3, rejected at 2
    lg = _logits({7: 5.0, 8: 1.0}, {9: 5.0, 8: 0.0})
    assert _run([feat], [lg], max_answer_length=3)[0] == {"q": "capital of France"}
    assert _run([feat], [lg], max_answer_length=2)[0] == {"q": "of France"}
    # padding tokens after the context are not candidates either
    assert _run([feat], [_logits({15: 9.0, 4: 1.0}, {15: 9.0, 4: 1.0})])[0] == {"q": "Paris"}


def test_postprocess_n_best_across_windows():
    w1 = _feature("q", WORDS[:7])  # "Paris ... and"
    w2 = _feature("q", WORDS[4:])  # "of France ... city."
    other = _feature("z", WORDS)
    logits = [
        _logits({5: 3.0}, {5: 3.0}),  # window 1: "is", score 6
        _logits({6: 4.0}, {10: 4.0}),  # window 2: "and" .. "." (tokens 6..10), score 8 wins
        _logits({4: 50.0}, {4: 50.0}),  # another example's window must not leak in
    ]
    pred, odds = _run([w1, w2, other], logits)
    assert pred == {"q": "and its largest city."}
    assert math.isclose(odds["q"], -10.0 - 8.0)  # min CLS score (-5 + -5) minus best span score (8)


def test_postprocess_version_2_null_threshold():
    feat = _feature("q", WORDS)
    s, e = _logits({0: 4.0, 9: 3.0}, {0: 4.0, 9: 2.0})  # null score 8, best span 5 → null odds 3
    pred, odds = _run([feat], [(s, e)], version_2=True)
    assert pred == {"q": ""} and math.isclose(odds["q"], 3.0)
    pred, _ = _run([feat], [(s, e)], version_2=True, null_score_diff_threshold=3.5)
    assert pred == {"q": "France"}
    pred, _ = _run([feat], [(s, e)], version_2=False)  # v1 never answers ""
    assert pred == {"q": "France"}
    # the null score is the lowest over the windows: a second window with a weak CLS tips it
    feat2 = _feature("q", WORDS)
    pred, odds = _run([feat, feat2], [(s, e), _logits({0: -4.0}, {0: -4.0})], version_2=True)
    assert pred == {"q": "France"} and math.isclose(odds["q"], -8.0 - 5.0)


# ---------------------------------------------------------------------------------------------- metrics
