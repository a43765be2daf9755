"""The GSM8K-format arithmetic data set (data/arith/, made by scripts/make-arith-data) and the built-in GSM8K rewards
on it.

The answers are checked independently of the generator: every `<<a op b=c>>` annotation is recomputed with Python's
own arithmetic, the operands are found in the question's text in order (template knowledge: "more" marks an
addition), the steps chain, and `#### N` is the last result. Train and held-out share no question, the committed
files are exactly what the README's command writes, and the script is deterministic in its seed.
"""

from __future__ import annotations

import json
import operator
import re
import subprocess
import sys
from pathlib import Path

import pytest

from training.inputs.rewards import gsm8k

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "make-arith-data"
DATA = ROOT / "data" / "arith"
OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
#: one reasoning line: "12-7 = <<12-7=5>>5", the last with its unit ("5 pens.")
ANNOTATION = re.compile(r"(\d+)([-+*])(\d+) = <<(\d+)([-+*])(\d+)=(-?\d+)>>(-?\d+)(?: [a-z]+\.)?")


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def make(out: Path, *args: str) -> str:
    res = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *args], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout


def check_row(row: dict) -> None:
    """Recompute one row's answer from its annotations and its question (raises AssertionError on any mismatch)."""
    q, answer = row["question"], row["answer"]
    assert set(row) == {"question", "answer"}
    lines = answer.split("\n")
    assert lines[-1].startswith("#### ") and len(lines) >= 2, answer
    steps = [ANNOTATION.fullmatch(line) for line in lines[:-1]]
    assert all(steps), answer
    prev = None
    operands = []
    for m in steps:
        a, op, b, a2, op2, b2, c, shown = m.groups()
        assert (a, op, b) == (a2, op2, b2), answer  # the text before the annotation is the annotation's sum
        assert OPS[op](int(a), int(b)) == int(c) == int(shown), answer
        if prev is None:
            operands += [int(a), int(b)]
        else:
            assert int(a) == prev, answer  # each step starts from the last result
            operands.append(int(b))
        prev = int(c)
    assert lines[-1] == f"#### {prev}", answer
    assert [int(n) for n in re.findall(r"\d+", q)] == operands, (q, answer)
    ops = [m.group(2) for m in steps]
    later = ops[1:] if ops[0] == "*" else ops
    assert q.count(" more") == later.count("+"), (q, answer)  # "buys 4 more", "adds 4 more": an addition
    assert prev >= 1


@pytest.fixture(scope="module")
def train():
    return load(DATA / "train.jsonl")


@pytest.fixture(scope="module")
def heldout():
    return load(DATA / "heldout.jsonl")


def test_sizes_and_lengths(train, heldout):
    assert (len(train), len(heldout)) == (4000, 500)
    assert sum((DATA / f).stat().st_size for f in ("train.jsonl", "heldout.jsonl")) < 1_000_000
    for row in train + heldout:
        assert len(row["question"]) <= 100 and len(row["answer"]) <= 60, row


def test_every_answer_recomputes(train, heldout):
    for row in train + heldout:
        check_row(row)


def test_both_rewards_score_every_answer_against_itself(train, heldout):
    rows = train + heldout
    answers = [r["answer"] for r in rows]
    prompts = [r["question"] for r in rows]
    assert gsm8k.strict_match(prompts, answers, answers) == [1.0] * len(rows)
    assert gsm8k.flexible_extract(prompts, answers, answers) == [1.0] * len(rows)
    # and an off-by-one final line scores 0 under strict-match
    off = [a[: a.rindex("#### ")] + f"#### {int(a.split('#### ')[1]) + 1}" for a in answers]
    assert gsm8k.strict_match(prompts, off, answers) == [0.0] * len(rows)


def test_train_and_heldout_are_disjoint_and_varied(train, heldout):
    tq, hq = [r["question"] for r in train], [r["question"] for r in heldout]
    assert len(set(tq)) == len(tq) and len(set(hq)) == len(hq)
    assert not set(tq) & set(hq)
    steps = {r["answer"].count("<<") for r in train}
    assert steps == {1, 2}
    finals = [int(r["answer"].split("#### ")[1]) for r in train]
    assert max(finals.count(v) for v in set(finals)) < 0.15 * len(finals)  # no answer a constant guess wins with
    assert len({q.split()[0] for q in tq}) > 10  # names / "A" for the container templates


def test_committed_files_are_the_readme_command(tmp_path):
    make(tmp_path)  # the defaults, as data/arith/README.md says
    for name in ("train.jsonl", "heldout.jsonl"):
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name


def test_deterministic_in_the_seed(tmp_path):
    args = ("--train", "300", "--heldout", "50", "--seed", "7", "--ops", "+,-,*", "--max-operand", "20")
    make(tmp_path / "a", *args)
    make(tmp_path / "b", *args)
    make(tmp_path / "c", *args[:5], "8", *args[6:])
    for name in ("train.jsonl", "heldout.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "c" / name).read_bytes()
    rows = load(tmp_path / "a" / "train.jsonl") + load(tmp_path / "a" / "heldout.jsonl")
    assert any("*" in r["answer"] for r in rows)
    for row in rows:
        check_row(row)


def test_knobs(tmp_path):
    make(tmp_path, "--train", "200", "--heldout", "20", "--max-steps", "1", "--ops", "+", "--max-operand", "5")
    rows = load(tmp_path / "train.jsonl") + load(tmp_path / "heldout.jsonl")
    for row in rows:
        check_row(row)
        assert row["answer"].count("<<") == 1 and "+" in row["answer"] and "-" not in row["answer"]
        assert int(row["answer"].split("#### ")[1]) <= 10


# --- real GSM8K-format rows, written by hand ---------------------------------------------------------------------

HAND = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                 "How many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
               "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
     "right": "In May she sold 48/2 = 24 clips. In total 48+24 = 72.\n#### 72",
     "wrong": "In May she sold 48*2 = 96 clips. In total 48+96 = 144.\n#### 144"},
    {"question": "A baker makes 5 trays of 12 rolls and sells 38. How many rolls are left?",
     "answer": "He makes 5*12 = <<5*12=60>>60 rolls.\nHe has 60-38 = <<60-38=22>>22 rolls left.\n#### 22",
     "right": "5*12 = <<5*12=60>>60 rolls, 60-38 = <<60-38=22>>22 left.\n#### 22",
     "wrong": "5*12 = <<5*12=60>>60 rolls, 60-38 = <<60-38=32>>32 left.\n#### 32"},
    {"question": "Tickets cost $8 each. Sam buys 150 tickets. How much does he pay?",
     "answer": "Sam pays 8*150 = $<<8*150=1200>>1,200.\n#### 1,200",
     "right": "150 tickets at $8 is $1,200.\n#### 1200",
     "wrong": "150 tickets at $8 is $1,500.\n#### 1500"},
]


@pytest.mark.parametrize("row", HAND, ids=["natalia", "baker", "tickets"])
def test_hand_rows_right_and_wrong(row):
    comps, gold = [row["right"], row["wrong"]], [row["answer"]] * 2
    assert gsm8k.strict_match([row["question"]] * 2, comps, gold) == [1.0, 0.0]
    assert gsm8k.flexible_extract([row["question"]] * 2, comps, gold) == [1.0, 0.0]
    assert gsm8k.strict_match([row["question"]], [row["answer"]], [row["answer"]]) == [1.0]


def test_the_checker_catches_wrong_rows():
    good = {"question": "Ann has 9 pens, buys 4 more and then loses 2. How many pens does Ann have now?",
            "answer": "9+4 = <<9+4=13>>13\n13-2 = <<13-2=11>>11 pens.\n#### 11"}
    check_row(good)
    bad = [good["answer"].replace("=11>>11", "=12>>12").replace("#### 11", "#### 12"),  # wrong sum
           good["answer"].replace("#### 11", "#### 13"),  # final line not the last result
           good["answer"].replace("13-2 = <<13-2", "14-2 = <<14-2").replace("=11>>11", "=12>>12")
           .replace("#### 11", "#### 12")]  # a step that does not start from the last result
    for answer in bad:
        with pytest.raises(AssertionError):
            check_row({"question": good["question"], "answer": answer})
    with pytest.raises(AssertionError):  # operands not the question's numbers
        check_row({"question": good["question"].replace("buys 4", "buys 5"), "answer": good["answer"]})
    with pytest.raises(AssertionError):  # "more" says +, the answer says -
        check_row({"question": good["question"].replace("loses 2", "gets 2 more"), "answer": good["answer"]})
