"""The comma-separated values the commands share (`rlhfops/commands/args.py`): seeds and names parse the same way in
every command that takes them, and bad seeds are one line naming the flag (exit 2) before any work."""

from __future__ import annotations

import pytest
from cli_helpers import run_cli, tripwire

from common.errors import BadInput
from rlhfops.commands.args import comma_list, parse_seeds


def test_seeds_and_names_against_hand_written_lists():
    assert parse_seeds(None) is None
    assert parse_seeds("42, 123,,7 ") == [42, 123, 7]
    assert parse_seeds("") == []
    with pytest.raises(BadInput, match=r"^--seeds '1,x': expected comma-separated integers"):
        parse_seeds("1,x")
    assert comma_list(" a, b,,c ") == ["a", "b", "c"]
    assert comma_list(" , ") == []


@pytest.mark.parametrize("args", [["simulate", "E1", "--seeds", "1,x"], ["record-traces", "--seeds", "1,x"]])
def test_a_bad_seed_list_is_the_same_one_line_in_every_command(args, capsys, monkeypatch):
    monkeypatch.setattr("rlhfops.commands.traces.record", tripwire)
    monkeypatch.setattr("rlhfops.commands.simulate.run_with_progress", tripwire)
    code, err = run_cli(args, capsys, monkeypatch)
    assert code == 2 and err == ["error: --seeds '1,x': expected comma-separated integers, e.g. 42,123,456"], err


def test_paired_report_parts_of_blanks_name_no_part(tmp_path, capsys, monkeypatch):
    """`--parts ' , '` names no part (stripped like every other name list), rather than a part called ' '."""
    code, err = run_cli(["paired-report", "--corpus", tmp_path, "--parts", " , "], capsys, monkeypatch)
    assert code == 2 and len(err) == 1 and "parts: name at least one part" in err[0], err
