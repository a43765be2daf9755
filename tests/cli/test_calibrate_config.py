"""`eval.calibrate.write_config` reads the detector config it rewrites through the one strict reader: a key given
twice, a number written as text, a section of the wrong kind is one line naming the file and the field (exit 2
from the CLI), and the file is left as it was, instead of a plain YAML read silently keeping the last copy."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml
from cli_helpers import run_cli

from common.errors import BadInput
from eval.calibrate import write_config

GOOD = """\
version: 3
detectors:
  divergence:
    params:
      z: 0.5
      z_own: 1.0
    target_false_stop_rate: 0.02
  noisepatience:
    params:
      patience: 6
changelog:
- 'v3: by hand'
"""

#: line 7 repeats line 6's key `z_own` (lines counted from 1)
DUPLICATE = GOOD.replace("      z_own: 1.0\n", "      z_own: 1.0\n      z_own: 2.0\n")


def test_a_key_given_twice_is_refused_naming_both_lines_and_the_file_is_kept(tmp_path):
    config = tmp_path / "detectors.yaml"
    config.write_text(DUPLICATE)
    assert DUPLICATE.splitlines()[5:7] == ["      z_own: 1.0", "      z_own: 2.0"]
    with pytest.raises(BadInput) as err:
        write_config("divergence", {"z": 0.7}, 0.02, "fleet", 20, 0, path=config)
    assert str(err.value) == (f"detector config: '{config}': field 'detectors.divergence.params.z_own' is given twice "
                              "(lines 6 and 7; keep one)")
    assert config.read_text() == DUPLICATE


@pytest.mark.parametrize("edit, field", [
    (("version: 3", "version: '3'"), "version"),
    (("version: 3", "version: true"), "version"),
    (("changelog:\n- 'v3: by hand'", "changelog: 'v3: by hand'"), "changelog"),
])
def test_a_field_of_the_wrong_kind_is_refused_naming_it(tmp_path, edit, field):
    config = tmp_path / "detectors.yaml"
    text = GOOD.replace(*edit)
    assert text != GOOD
    config.write_text(text)
    with pytest.raises(BadInput, match=rf"^detector config: '.*detectors.yaml': field '{field}'"):
        write_config("divergence", {"z": 0.7}, 0.02, "fleet", 20, 0, path=config)
    assert config.read_text() == text


def test_an_empty_config_is_refused(tmp_path):
    config = tmp_path / "detectors.yaml"
    config.write_text("")
    with pytest.raises(BadInput, match="is empty"):
        write_config("divergence", {"z": 0.7}, 0.02, "fleet", 20, 0, path=config)


def test_a_good_config_gets_the_next_version_and_keeps_the_rest(tmp_path):
    """The expected document is the original with three hand edits: the version, the one entry, a changelog line."""
    config = tmp_path / "detectors.yaml"
    config.write_text(GOOD)
    write_config("divergence", {"z": 0.7, "z_own": 1.5}, 0.05, "my fleet", 20, 1, path=config)
    got = yaml.safe_load(config.read_text())
    want = yaml.safe_load(GOOD)
    want["version"] = 4
    want["detectors"]["divergence"] = {"params": {"z": 0.7, "z_own": 1.5}, "target_false_stop_rate": 0.05,
                                       "calibrated_on": got["detectors"]["divergence"]["calibrated_on"]}
    assert got["detectors"]["divergence"]["calibrated_on"]["healthy_runs"] == 20
    want["changelog"].append(got["changelog"][-1])
    assert got == want
    assert got["changelog"][-1].startswith("v4: divergence {'z': 0.7, 'z_own': 1.5} calibrated to a 5.0%")


def test_detect_calibrate_exits_2_on_a_config_with_a_key_given_twice(tmp_path, capsys, monkeypatch):
    """`rlhfops detect --calibrate`: one line on stderr, exit 2, the config unchanged."""
    rng = np.random.default_rng(0)
    rows = [{"run_id": f"h{r}", "step": 10 * i, "eval_score": float(1 - np.exp(-i / 8) + rng.normal(0, 0.03)),
             "label": 0} for r in range(12) for i in range(20)]
    trace = tmp_path / "healthy.csv"
    pd.DataFrame(rows).to_csv(trace, index=False)
    config = tmp_path / "detectors.yaml"
    config.write_text(DUPLICATE)
    code, err = run_cli(["detect", "--calibrate", trace, "--detector", "divergence", "--config", config], capsys,
                        monkeypatch)
    assert code == 2 and len(err) == 1, err
    assert "field 'detectors.divergence.params.z_own' is given twice (lines 6 and 7" in err[0]
    assert config.read_text() == DUPLICATE
