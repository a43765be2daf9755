"""training/inputs/datafiles.py: a tenant's data files read into Arrow and checked.

Each kind of bad data gives one BadInput line naming the file, the line (or row index) and the column; the four
formats read the same rows, checked against rows written by hand with the json and csv modules (the oracle); chat
prompts, token counts, dropping over-long prompts, `columns(rows)`, `overlap_count`; and the scale figure, small
(scripts/bench-datafiles, 1k against 200k rows, the budget scaled to 200k rows).
"""

from __future__ import annotations

import csv
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.errors import BadInput
from training.inputs import datafiles
from training.inputs.datafiles import byte_token_counts, load_datafile, overlap_count, read_table

ROOT = Path(__file__).resolve().parents[2]

ROWS = [
    {"question": "What is 2 + 2?", "answer": "2 + 2 = 4 #### 4", "level": 1, "topic": "add"},
    {"question": "Ünïcödé: how many bytes is é?", "answer": "two #### 2", "level": 2, "topic": "utf8"},
    {"question": "A line, with a comma\nand a newline", "answer": "#### 0", "level": 3, "topic": "csv"},
    {"question": "Why?", "answer": None, "level": 1, "topic": "none"},
]


def load(path, prompt_key="question", sft_key=None, max_tokens=1000, **kw):
    return load_datafile(path, "task.train", prompt_key, sft_key, max_tokens, **kw)


def write_jsonl(path: Path, rows, blank_after: int | None = None) -> Path:
    lines = [json.dumps(r) for r in rows]
    if blank_after is not None:
        lines.insert(blank_after, "")
    path.write_text("\n".join(lines) + "\n")
    return path


def write_csv(path: Path, rows) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def write_parquet(path: Path, rows) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def bad(path, match_all: list[str], **kw) -> str:
    """The BadInput message of loading `path`: one line holding every string of `match_all`."""
    with pytest.raises(BadInput) as info:
        load(path, **kw)
    msg = str(info.value)
    assert "\n" not in msg, msg
    for part in match_all:
        assert part in msg, (part, msg)
    return msg


# --- the good path: four formats, one set of rows --------------------------------------------------------------------


def write_all(tmp_path: Path, rows) -> dict[str, Path]:
    rows_csv = [{k: ("" if v is None else v) for k, v in r.items()} for r in rows]
    return {"jsonl": write_jsonl(tmp_path / "t.jsonl", rows),
            "json": (tmp_path / "t.json").write_text(json.dumps(rows)) and tmp_path / "t.json",
            "csv": write_csv(tmp_path / "t.csv", rows_csv),
            "parquet": write_parquet(tmp_path / "t.parquet", rows)}


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet"])
def test_every_format_reads_the_same_rows(tmp_path, fmt):
    path = write_all(tmp_path, ROWS)[fmt]
    data = load(path, sft_key="answer")
    assert data.digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (len(data), data.rows_read, data.dropped_long) == (4, 4, 0)
    assert data.column_names == ["question", "answer", "level", "topic"]
    assert [data.prompt(i) for i in range(4)] == [r["question"] for r in ROWS]
    # csv has no null: an empty cell is empty text
    assert [data.sft(i) for i in range(3)] == [r["answer"] for r in ROWS[:3]]
    assert data.sft(3) in (None, "")
    cols = data.columns([2, 0])
    assert list(cols) == ["answer", "level", "topic"]
    assert cols["level"] == [3, 1] and cols["topic"] == ["csv", "add"]
    assert cols["answer"] == ["#### 0", "2 + 2 = 4 #### 4"]
    assert read_table(path, "task.train").num_rows == 4


def test_columns_takes_just_the_rows_asked_in_their_order(tmp_path):
    rows = [{"q": f"prompt {i}", "a": f"ans {i}", "k": i} for i in range(50)]
    data = load(write_jsonl(tmp_path / "t.jsonl", rows), prompt_key="q", sft_key="a")
    assert data.columns([7, 3, 7, 49]) == {"a": ["ans 7", "ans 3", "ans 7", "ans 49"], "k": [7, 3, 7, 49]}
    assert data.columns([]) == {"a": [], "k": []}
    assert data.sft(5) == "ans 5" and data.prompt(5) == "prompt 5"


def test_without_sft_key_sft_is_none_and_a_whole_number_answer_becomes_text(tmp_path):
    path = write_csv(tmp_path / "t.csv", [{"q": "one?", "a": 1}, {"q": "two?", "a": 2}])
    assert load(path, prompt_key="q").sft(0) is None
    data = load(path, prompt_key="q", sft_key="a")
    assert [data.sft(0), data.sft(1)] == ["1", "2"]


def test_chat_prompts(tmp_path):
    chats = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
             [{"role": "user", "content": "é"}],
             [{"role": "user", "content": "x" * 10}, {"role": "assistant", "content": "ok"},
              {"role": "user", "content": "again"}]]
    rows = [{"messages": m, "answer": str(i)} for i, m in enumerate(chats)]
    for path in (write_jsonl(tmp_path / "c.jsonl", rows), write_parquet(tmp_path / "c.parquet", rows)):
        data = load(path, prompt_key="messages", sft_key="answer")
        assert [data.prompt(i) for i in range(3)] == chats
        expected = [sum(len(m["content"].encode()) for m in c) for c in chats]
        assert byte_token_counts(data.table.column("messages")).tolist() == expected == [13, 2, 17]
        # sliced and chunked: the counts follow each chunk's offsets
        column = data.table.column("messages")
        rechunked = pa.chunked_array([column.combine_chunks()[:1], column.combine_chunks()[1:]])
        assert byte_token_counts(rechunked).tolist() == expected
        assert byte_token_counts(column.combine_chunks()[1:]).tolist() == expected[1:]


def test_byte_token_counts_are_utf8_bytes(tmp_path):
    texts = ["", "abc", "é", "日本", None]
    assert byte_token_counts(pa.chunked_array([pa.array(texts[:2]), pa.array(texts[2:])])).tolist() == [
        0, 3, 2, 6, 0]
    assert byte_token_counts(pa.chunked_array([], type=pa.string())).tolist() == []


def test_count_tokens_of_the_caller_and_its_length_is_checked(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"q": f"p{i}"} for i in range(200)])
    seen = []

    def words(column):
        seen.append(len(column))
        return np.full(len(column), 3)

    assert load(path, prompt_key="q", count_tokens=words, max_tokens=3).dropped_long == 0 and seen == [200]
    with pytest.raises(ValueError, match="counts for 200"):
        load(path, prompt_key="q", count_tokens=lambda c: np.zeros(5))


# --- over-long prompts -------------------------------------------------------------------------------------------


def test_a_few_long_prompts_are_dropped_with_one_warning(tmp_path):
    rows = [{"q": f"short {i}", "a": str(i)} for i in range(300)]
    rows[17]["q"] = "L" * 50
    rows[250]["q"] = "L" * 60
    rows[251]["q"] = "L" * 21  # exactly the limit: kept
    warnings = []
    data = load(write_jsonl(tmp_path / "t.jsonl", rows), prompt_key="q", max_tokens=21, warn=warnings.append,
                max_long_frac=0.01)
    assert (data.rows_read, data.dropped_long, len(data)) == (300, 2, 298)
    assert len(warnings) == 1 and "dropped 2 of 300" in warnings[0] and "60 tokens at line 251" in warnings[0]
    assert data.prompt(17) == "short 18" and data.columns([17])["a"] == ["18"]
    assert data.prompt(249) == "L" * 21


def test_too_many_long_prompts_is_bad_input_naming_the_longest(tmp_path):
    rows = [{"q": "short"} for _ in range(100)]
    rows[5]["q"], rows[40]["q"] = "x" * 30, "y" * 99
    path = write_jsonl(tmp_path / "t.jsonl", rows, blank_after=3)  # the blank line moves row 40 to line 42
    bad(path, ["'t.jsonl'", "2 of 100 prompts", "raise task.max_prompt_tokens or shorten the prompts",
               "the longest is 99 tokens at line 42"], prompt_key="q", max_tokens=20)
    # 1% is still dropped: the limit is "more than max_long_frac"
    rows[5]["q"] = "short"
    assert load(write_jsonl(tmp_path / "u.jsonl", rows), prompt_key="q", max_tokens=20,
                warn=lambda _: None).dropped_long == 1


# --- bad data: one line naming file, line/row, column -----------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(BadInput, match=r"task.heldout: '.*nope.jsonl' does not exist \(paths are relative to the "):
        load_datafile(tmp_path / "nope.jsonl", "task.heldout", "q", None, 10)


def test_unknown_extension(tmp_path):
    (tmp_path / "t.txt").write_text("hi\n")
    bad(tmp_path / "t.txt", ["task.train", "'t.txt'", "'.txt'", ".jsonl, .json, .parquet or .csv"])


def test_empty_files(tmp_path):
    (tmp_path / "e.jsonl").write_bytes(b"")
    bad(tmp_path / "e.jsonl", ["'e.jsonl' is empty (0 bytes)"])
    (tmp_path / "w.jsonl").write_text("\n  \n")
    bad(tmp_path / "w.jsonl", ["'w.jsonl' has no rows"])
    (tmp_path / "h.csv").write_text("question,answer\n")
    bad(tmp_path / "h.csv", ["'h.csv' has no rows (only a header)"])
    (tmp_path / "l.json").write_text("[]")
    bad(tmp_path / "l.json", ["'l.json' has no rows"])
    pq.write_table(pa.table({"question": pa.array([], pa.string())}), tmp_path / "z.parquet")
    bad(tmp_path / "z.parquet", ["'z.parquet' has no rows"])


def test_invalid_json_line_past_pyarrows_first_block(tmp_path):
    """pyarrow counts rows from its 1 MiB block and skips blank lines: the line is found by a scan."""
    lines = [json.dumps({"question": f"row {i} " + "x" * 60}) for i in range(20_000)]
    lines.insert(10, "")
    lines.insert(19_000, '{"question": "oops", }')
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    bad(tmp_path / "t.jsonl", ["task.train: 't.jsonl' line 19001 is not valid JSON", "column 22"])


def test_jsonl_line_that_is_not_an_object_and_a_column_that_changes_kind(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"question": "a"}\n[1, 2]\n')
    bad(tmp_path / "a.jsonl", ["'a.jsonl' line 2 holds a list", "not a JSON object"])
    rows = [{"question": "a"}, {"question": "b"}, {"question": [{"role": "user", "content": "c"}]}]
    bad(write_jsonl(tmp_path / "k.jsonl", rows), ["'k.jsonl' line 3: column 'question' holds a list of object",
                                                  "line 1 holds text"])


def test_json_file_errors(tmp_path):
    (tmp_path / "i.json").write_text('[\n {"question": "a"},\n {"question": "b",}\n]')
    bad(tmp_path / "i.json", ["'i.json' line 3 column 19 is not valid JSON"])
    (tmp_path / "d.json").write_text(json.dumps({"data": [{"question": "a"}], "version": 2}))
    bad(tmp_path / "d.json", ["'d.json' holds a JSON object (keys: data, version)", "write the list itself"])
    (tmp_path / "s.json").write_text(json.dumps([{"question": "a"}, "b"]))
    bad(tmp_path / "s.json", ["'s.json' row index 1 holds text, not a JSON object"])
    (tmp_path / "k.json").write_text(json.dumps([{"question": "a", "n": 1}, {"question": "b", "n": "two"}]))
    bad(tmp_path / "k.json", ["'k.json' row index 1: column 'n' holds text, but row index 0 holds a number"])


def test_csv_row_with_the_wrong_number_of_fields(tmp_path):
    (tmp_path / "t.csv").write_text('question,answer\n"two\nlines",a\n\nq2,b\nq3,c,extra\nq4,d\n')
    bad(tmp_path / "t.csv", ["task.train: 't.csv' line 6 has 3 fields but the header has 2"])


def test_missing_prompt_and_sft_columns_list_the_columns(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [{"q": "x", "a": "y"}])
    bad(path, ["task.train: 'train.jsonl' has no column 'question' (task.prompt_key); its columns: q, a"])
    bad(path, ["has no column 'answer' (task.sft_key); its columns: q, a"], prompt_key="q", sft_key="answer")


@pytest.mark.parametrize("fmt, cell, where", [
    ("jsonl", None, "line 4"), ("jsonl", "", "line 4"), ("jsonl", "  \t", "line 4"), ("jsonl", [], "line 4"),
    ("csv", "", "line 5"), ("parquet", None, "row index 2"), ("json", "", "row index 2"),
])
def test_empty_prompt_names_the_line_or_row_and_the_column(tmp_path, fmt, cell, where):
    rows = [{"question": "fine", "answer": "a"} for _ in range(5)]
    if isinstance(cell, list):
        rows = [{"question": [{"role": "user", "content": "fine"}], "answer": "a"} for _ in range(5)]
    rows[2]["question"] = cell
    rows[0]["answer"] = "has\ntwo lines"  # csv: the record spans lines 2-3
    path = tmp_path / f"t.{fmt}"
    if fmt == "jsonl":
        write_jsonl(path, rows, blank_after=1)
    elif fmt == "csv":
        write_csv(path, rows)
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    else:
        write_parquet(path, rows)
    what = "has no messages" if isinstance(cell, list) else "is empty"
    bad(path, [f"task.train: 't.{fmt}' {where}: column 'question' {what}"])


def test_chat_message_without_content(tmp_path):
    rows = [{"q": [{"role": "user", "content": "a"}]}, {"q": [{"role": "user", "content": "b"}, {"role": "user"}]}]
    bad(write_jsonl(tmp_path / "t.jsonl", rows), ["line 2: column 'q' has a message without a role or content"],
        prompt_key="q")


def test_prompt_column_of_the_wrong_type(tmp_path):
    bad(write_jsonl(tmp_path / "t.jsonl", [{"q": 1}, {"q": 2}]), ["column 'q' (task.prompt_key) holds int64"],
        prompt_key="q")


def test_bytes_that_are_not_utf8(tmp_path):
    good = b"".join(b'{"question": "row %d"}\n' % i for i in range(3))
    (tmp_path / "t.jsonl").write_bytes(good + b'{"question": "bad \xff"}\n')
    bad(tmp_path / "t.jsonl", ["task.train: 't.jsonl' line 4 is not UTF-8 text", "save the file as UTF-8"])
    (tmp_path / "t.csv").write_bytes(b"question\nok\n\xe9t\xe9\n")
    bad(tmp_path / "t.csv", ["'t.csv' line 3 is not UTF-8 text (byte 12"])
    (tmp_path / "end.jsonl").write_bytes(good + b'{"question": "cut \xc3')  # the file ends inside a character
    bad(tmp_path / "end.jsonl", ["'end.jsonl' line 4 is not UTF-8"])


def test_utf8_check_across_the_1mib_blocks(tmp_path, monkeypatch):
    """A character cut by a block's end is fine; a bad byte after the first block names its own line."""
    monkeypatch.setattr(datafiles, "BLOCK_BYTES", 16)
    head = '{"question": "ééééééé"}\n{"question": "ok"}\n'.encode()
    (tmp_path / "t.jsonl").write_bytes(head)
    assert len(load(tmp_path / "t.jsonl")) == 2
    for cut in range(len(head) - 8, len(head)):
        (tmp_path / "b.jsonl").write_bytes(head + b'{"question": "ok"}\n' + head[:cut] + b"\xc3\x28" + head[cut:])
        line = 4 + head[:cut].count(b"\n")
        bad(tmp_path / "b.jsonl", [f"line {line} is not UTF-8", f"byte {len(head) + 19 + cut}"])


@pytest.mark.parametrize("name", ["bad-name", "2nd", "class", "prompts", "completions"])
def test_column_names_that_cannot_be_keyword_arguments(tmp_path, name):
    msg = bad(write_jsonl(tmp_path / "t.jsonl", [{"question": "q", name: 1}]), [f"column '{name}'", "rename"])
    assert ("clashes" in msg) == (name in ("prompts", "completions"))


def test_the_prompt_column_may_have_any_name(tmp_path):
    assert len(load(write_jsonl(tmp_path / "t.jsonl", [{"my prompt": "q", "a": 1}]), prompt_key="my prompt")) == 1


def test_unreadable_parquet(tmp_path):
    (tmp_path / "t.parquet").write_bytes(b"not a parquet file at all")
    bad(tmp_path / "t.parquet", ["'t.parquet' is not a readable Parquet file"])


# --- overlap -------------------------------------------------------------------------------------------------------


def test_overlap_count_on_hand_made_files(tmp_path):
    train = load(write_jsonl(tmp_path / "train.jsonl", [{"q": p} for p in ["a", "b", "c", "d"]]), prompt_key="q")
    held = load(write_csv(tmp_path / "held.csv", [{"q": p} for p in ["b", "x", "d", "b", "bd"]]), prompt_key="q")
    assert overlap_count(train, held) == 3  # b, d, b again: rows, not distinct prompts
    assert overlap_count(held, train) == 2  # the other way round: train's b and d


def test_overlap_count_of_chat_prompts(tmp_path):
    def user(*texts):
        return [{"role": "user", "content": t} for t in texts]

    train = load(write_jsonl(tmp_path / "train.jsonl", [{"m": user("ab", "c")}, {"m": user("hi")},
                                                        {"m": [{"role": "system", "content": "s"}] + user("x")}]),
                 prompt_key="m")
    held = load(write_parquet(tmp_path / "held.parquet", [{"m": user("a", "bc")}, {"m": user("ab", "c")},
                                                          {"m": user("x")}, {"m": user("hi")}]), prompt_key="m")
    assert overlap_count(train, held) == 2  # ["ab","c"] and ["hi"]; ["a","bc"] joins to the same text but is not
    text = load(write_jsonl(tmp_path / "text.jsonl", [{"m": "hi"}, {"m": "x"}]), prompt_key="m")
    assert overlap_count(train, text) == 1  # "hi" is the lone user message ["hi"]


# --- scale -----------------------------------------------------------------------------------------------------------


def test_a_large_file_loads_within_the_budget_scaled():
    """1k against 200k rows, each in a fresh process: within 30 s and 2 GiB a million rows, scaled to 200k (6 s,
    410 MiB); scripts/bench-datafiles with its defaults gives the 1M figure."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench-datafiles"), "--rows", "1000", "200000",
                           "--formats", "jsonl"], capture_output=True, text=True, timeout=240)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0 and out["ok"], out
    assert out["delta"]["jsonl"]["rss_mib"] < 410 and out["delta"]["jsonl"]["wall_s"] < 6, out
