"""Bad input, table-driven: every case exits 2 with one line on stderr naming the field (and the fix), before any
work starts and before anything is written.

The CLI runs in-process (`rlhfops.cli.main`), in a scratch directory. The entry points that do work (the trainer,
the simulator's unit runner, benchmarks, the Prefect server) are replaced by a tripwire, so a case that slips
through fails at once ("work started") instead of training for a minute; the test also asserts that the
directory holds exactly the files it set up. Cases marked `was: traceback` / `was: accepted` are the ones the
issue-11 audit (and this branch's own sweep) found; the rest guard the neighbouring checks.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from cli_helpers import run_cli
from cli_helpers import tripwire as _tripwire

from common.errors import BadInput

REPO = Path(__file__).resolve().parents[2]




@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A working directory with the inputs the cases name, and every work entry point tripwired."""
    import rlhfops.commands.bench_health as bench_health
    import rlhfops.commands.canary as canary
    import rlhfops.commands.flowrun as flowrun
    import rlhfops.commands.nightly as nightly
    import rlhfops.commands.traces as traces
    import scheduling.bench
    import scheduling.experiments
    import scheduling.reproduce
    import studies.detector_report
    import training.benches.oppo
    import training.trainer

    for target in (
        (training.trainer, "Trainer"), (training.trainer, "train"), (scheduling.experiments, "run_units"),
        (scheduling.reproduce, "run_all"), (studies.detector_report, "run_report"),
        (scheduling.bench, "bench_matrix"), (training.benches.oppo, "bench_oppo"), (bench_health, "bench_health"),
        (flowrun, "start_prefect_api"), (nightly, "start_prefect_api"), (traces, "record"),
        (canary, "run_canary"),
    ):
        monkeypatch.setattr(*target, _tripwire)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLHFOPS_MEMORY_LIMIT_GIB", "16")  # the same bound on any machine
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    (tmp_path / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    (tmp_path / "latin1.csv").write_bytes("run_id,step,eval_score\ncaf\xe9,1,0.5\n".encode("latin-1"))
    (tmp_path / "latin1.json").write_bytes('["caf\xe9"]'.encode("latin-1"))
    for name in ("ppo-tiny", "alerts", "E1"):
        shutil.copy(REPO / "configs" / f"{name}.yaml", tmp_path / f"{name}.yaml")
    (tmp_path / "configs").mkdir()
    shutil.copy(REPO / "configs" / "ppo-bench.yaml", tmp_path / "configs" / "ppo-bench.yaml")
    return tmp_path


def ppo_yaml(d: Path, name: str, changes: dict) -> str:
    """configs/ppo-tiny.yaml with dotted `changes`, written to d/name."""
    raw = yaml.safe_load((REPO / "configs" / "ppo-tiny.yaml").read_text())
    for dotted, value in changes.items():
        node = raw
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    (d / name).write_text(yaml.safe_dump(raw))
    return name


def trace_csv(d: Path, name: str, extra_rows: list[str], header: str = "run_id,step,eval_score,reward,kl") -> str:
    """Two clean 40-step runs plus `extra_rows` (the bad ones)."""
    rows = [f"{r},{s},{0.1 + 0.01 * s:.3f},{0.1 + 0.01 * s:.3f},0.1" for r in ("a", "b") for s in range(1, 41)]
    (d / name).write_text("\n".join([header, *rows, *extra_rows]) + "\n")
    return name




# (case id, files to write: fn(dir) -> None or None, argv, substrings the one stderr line must contain)
# `was`: what the unfixed code did (traceback: an exception escaped; accepted: it started work / exited 0).
CASES = [
    # --- non-UTF-8 files (was: traceback UnicodeDecodeError) ---
    ("experiment-yaml-latin1", None, ["simulate", "latin1.yaml"], ["latin1.yaml", "not UTF-8", "line 1"]),
    ("train-yaml-latin1", None, ["train", "latin1.yaml"], ["config:", "not UTF-8"]),
    ("alerts-yaml-latin1", "trace_ok", ["health", "ok.csv", "--alerts", "latin1.yaml"], ["alerts:", "not UTF-8"]),
    ("canary-alerts-latin1", None, ["canary", "--alerts", "latin1.yaml"], ["alerts:", "not UTF-8"]),
    ("bench-oppo-config-latin1", None, ["bench", "oppo", "--config", "latin1.yaml"], ["config:", "not UTF-8"]),
    ("platform-jobs-latin1", None, ["platform", "--jobs", "latin1.json"], ["jobs:", "not UTF-8"]),
    ("trace-latin1", None, ["detect", "latin1.csv"], ["latin1.csv", "not UTF-8"]),
    # --- model shapes and sizes (was: accepted; heads 3 failed inside transformers, 1e8 tried to allocate) ---
    ("num-heads-not-dividing", lambda d: ppo_yaml(d, "c.yaml", {"policy.num_heads": 3}),
     ["train", "c.yaml"], ["policy", "num_heads (3) must divide hidden_size (64)"]),
    ("reward-num-heads-not-dividing", lambda d: ppo_yaml(d, "c.yaml", {"reward.num_heads": 5}),
     ["train", "c.yaml"], ["reward", "num_heads (5) must divide hidden_size"]),
    ("odd-head-dim-rotary", lambda d: ppo_yaml(d, "c.yaml", {"policy.hidden_size": 12, "policy.num_heads": 4}),
     ["train", "c.yaml"], ["policy", "must be even"]),
    ("hidden-size-1e8", lambda d: ppo_yaml(d, "c.yaml", {"policy.hidden_size": 100_000_000}),
     ["train", "c.yaml"], ["policy.hidden_size", "give a value <= 65536"]),
    ("model-over-memory-limit", lambda d: ppo_yaml(d, "c.yaml", {
        "policy.hidden_size": 8192, "policy.num_layers": 64, "policy.num_heads": 64,
        "policy.intermediate_size": 16384}),
     ["train", "c.yaml"], ["policy/reward", "GiB", "RLHFOPS_MEMORY_LIMIT_GIB", "lower hidden_size"]),
    ("missing-local-checkpoint", lambda d: ppo_yaml(d, "c.yaml", {"policy.model_name_or_path": "no/such"}),
     ["train", "c.yaml"], ["policy.model_name_or_path", "config.json"]),
    # --- numeric bounds in the training config (was: accepted, half-written run directory) ---
    ("actor-lr-1e308", lambda d: ppo_yaml(d, "c.yaml", {"ppo.actor_lr": 1e308}),
     ["train", "c.yaml"], ["c.yaml", "ppo.actor_lr", "1e+308 is out of range: give a value <= 1.0"]),
    ("actor-lr-nan", lambda d: ppo_yaml(d, "c.yaml", {"ppo.actor_lr": float("nan")}),
     ["train", "c.yaml"], ["ppo.actor_lr", "finite"]),
    ("kl-coef-inf", lambda d: ppo_yaml(d, "c.yaml", {"ppo.kl_coef": float("inf")}),
     ["train", "c.yaml"], ["ppo.kl_coef", "finite"]),
    ("temperature-tiny", lambda d: ppo_yaml(d, "c.yaml", {"ppo.temperature": 1e-300}),
     ["train", "c.yaml"], ["ppo.temperature"]),
    ("seed-negative", lambda d: ppo_yaml(d, "c.yaml", {"seed": -1}), ["train", "c.yaml"], ["'seed'"]),
    ("eval-prompts-over-heldout", lambda d: ppo_yaml(d, "c.yaml", {"eval_prompts": 1000}),
     ["train", "c.yaml"], ["eval_prompts (1000) exceeds task.n_heldout_prompts"]),
    ("n-train-prompts-1e10", lambda d: ppo_yaml(d, "c.yaml", {"task.n_train_prompts": 10**10}),
     ["train", "c.yaml"], ["task.n_train_prompts"]),
    ("cache-dir-is-a-file", lambda d: ppo_yaml(d, "c.yaml", {"cache_dir": "afile"}),
     ["train", "c.yaml"], ["cache_dir", "existing file"]),
    ("overlap-names-field", None, ["train", "ppo-tiny.yaml", "--overlap", "bogus"], ["overlap: 'bogus'"]),
    # --- output paths, checked before any work (was: failed after the work, or a traceback) ---
    ("train-out-existing-file", None, ["train", "ppo-tiny.yaml", "--out", "afile"],
     ["out:", "existing file", "directory is expected"]),
    ("train-out-under-a-file", None, ["train", "ppo-tiny.yaml", "--out", "afile/run"], ["out:", "'afile'"]),
    ("train-trace-is-a-dir", None, ["train", "ppo-tiny.yaml", "--trace", "adir"], ["trace:", "file is expected"]),
    ("simulate-out-existing-file", None, ["simulate", "E1", "--out", "afile"], ["out:", "existing file"]),
    ("reproduce-out-is-a-dir", None, ["reproduce", "--out", "adir"], ["out:", "file is expected"]),
    ("compare-out-is-a-dir", None, ["compare-detectors", "--out", "adir"], ["out:", "file is expected"]),
    ("detect-out-is-a-dir", "trace_ok", ["detect", "ok.csv", "--out", "adir"], ["out:", "file is expected"]),
    ("health-out-is-a-dir", "trace_ok", ["health", "ok.csv", "--out", "adir"], ["out:", "file is expected"]),
    ("health-metrics-file-is-a-dir", "trace_ok", ["health", "ok.csv", "--metrics-file", "adir"],
     ["metrics_file:", "file is expected"]),
    ("bench-sim-out-is-a-dir", None, ["bench", "sim", "--out", "adir"], ["out:", "file is expected"]),
    ("bench-health-out-is-a-dir", None, ["bench", "health", "--out", "adir"], ["out:", "file is expected"]),
    ("bench-oppo-out-is-a-dir", None, ["bench", "oppo", "--out", "adir"], ["out:", "file is expected"]),
    ("canary-out-is-a-dir", None, ["canary", "--out", "adir"], ["out:", "file is expected"]),
    ("nightly-out-existing-file", None, ["nightly", "--out", "afile"], ["out:", "existing file"]),
    ("platform-out-existing-file", None, ["platform", "--out", "afile"], ["out:", "existing file"]),
    ("report-out-is-a-dir", None, ["report", "--out", "adir"], ["out:", "file is expected"]),
    ("record-traces-out-is-a-dir", None, ["record-traces", "--out", "adir"], ["out:", "file is expected"]),
    # --- sizes bounded by the memory estimate (was: MemoryError / accepted) ---
    ("simulate-jobs-50M", None, ["simulate", "E1", "--jobs", "50000000"],
     ["workload.jobs", "50,000,000 jobs", "GiB", "RLHFOPS_MEMORY_LIMIT_GIB"]),
    ("bench-sim-jobs-1e9", None, ["bench", "sim", "--jobs", "1000000000"], ["jobs:", "GiB"]),
    ("bench-health-runs-1e9", None, ["bench", "health", "--runs", "1000000000"], ["runs/steps:", "GiB"]),
    # --- workers (was: accepted) ---
    ("simulate-workers-0", None, ["simulate", "E1", "--workers", "0"], ["workers: 0 must be >= 1"]),
    ("simulate-workers-negative", None, ["simulate", "E1", "--workers", "-2"], ["workers: -2 must be >= 1"]),
    ("simulate-workers-huge", None, ["simulate", "E1", "--workers", "100000"], ["workers: 100000", "cores"]),
    ("reproduce-workers-0", None, ["reproduce", "--workers", "0"], ["workers: 0"]),
    ("nightly-workers-0", None, ["nightly", "--workers", "0"], ["workers: 0"]),
    # --- --set overrides are named as overrides, not blamed on the YAML file (was: blamed on E1.yaml) ---
    ("set-wrong-type", None, ["simulate", "E1", "--set", "workload.jobs=abc"],
     ["override 'workload.jobs=abc'", "field 'workload.jobs'"]),
    ("set-unknown-key", None, ["simulate", "E1", "--set", "workload.gpuz=3"], ["override 'workload.gpuz=3'"]),
    ("set-bad-yaml-value", None, ["simulate", "E1", "--set", "workload.jobs=[1,"],  # was: traceback ParserError
     ["override 'workload.jobs=[1,'", "not valid YAML"]),
    ("set-unknown-scheduler", None, ["simulate", "E1", "--set", "schedulers=[Bogus]"],
     ["override 'schedulers=", "Bogus"]),
    # --- experiment config bounds (was: accepted) ---
    ("set-sigma-1e308", None, ["simulate", "E1", "--set", "workload.eval_noise.sigma=1e308"],
     ["workload.eval_noise.sigma"]),
    ("set-arrival-inf", None, ["simulate", "E1", "--set", "workload.arrival_rate=.inf"],
     ["workload.arrival_rate", "finite"]),
    ("set-eval-interval-tiny", None, ["simulate", "E1", "--set", "workload.lora.eval_interval=1e-9"],
     ["workload.lora.eval_interval"]),
    ("set-duration-zero", None, ["simulate", "E1", "--set", "workload.lora.duration_min=[0,0]"],
     ["workload.lora.duration_min"]),
    ("set-tenants-1e9", None, ["simulate", "E1", "--set", "workload.tenants=1000000000"], ["workload.tenants"]),
    ("set-schedulers-empty", None, ["simulate", "E1", "--set", "schedulers=[]"], ["schedulers"]),
    ("experiment-seeds-negative", lambda d: (d / "x.yaml").write_text((d / "E1.yaml").read_text() + "seeds: [-1]\n"),
     ["simulate", "x.yaml"], ["x.yaml", "seeds.0"]),
    ("seeds-negative", None, ["simulate", "E1", "--seeds", "-1"], ["seeds: -1"]),
    ("seeds-duplicate", None, ["simulate", "E1", "--seeds", "1,1"], ["seeds:", "twice"]),
    ("nightly-seeds-negative", None, ["nightly", "--seeds", "-1"], ["seeds: -1"]),
    # --- traces: NaN / inf / absurd values per column (was: accepted; inf reward raised no alert) ---
    ("trace-eval-nan", lambda d: trace_csv(d, "t.csv", ["c,1,nan,0.1,0.1"]), ["detect", "t.csv"],
     ["line 82", "run 'c'", "column 'eval_score'"]),
    ("trace-step-empty", lambda d: trace_csv(d, "t.csv", ["c,,0.5,0.1,0.1"]), ["detect", "t.csv"],
     ["column 'step'", "empty"]),
    ("trace-eval-inf", lambda d: trace_csv(d, "t.csv", ["c,1,inf,0.1,0.1"]), ["detect", "t.csv"],
     ["column 'eval_score'", "finite"]),
    ("trace-eval-1e308", lambda d: trace_csv(d, "t.csv", ["c,1,1e308,0.1,0.1"]), ["detect", "t.csv"],
     ["column 'eval_score'", "outside"]),
    ("trace-reward-inf", lambda d: trace_csv(d, "t.csv", [f"c,{s},0.5,{'inf' if s == 30 else 0.1},0.1"
                                                          for s in range(1, 41)]),
     ["health", "t.csv"], ["line 111", "run 'c', step 30", "column 'reward'", "finite"]),
    ("trace-reward-1e308", lambda d: trace_csv(d, "t.csv", [f"c,{s},0.5,{'1e308' if s == 30 else 0.1},0.1"
                                                            for s in range(1, 41)]),
     ["health", "t.csv"], ["step 30", "column 'reward'", "outside"]),
    ("trace-reward-nan-text", lambda d: trace_csv(d, "t.csv", ["c,1,0.5,NaN,0.1"]), ["health", "t.csv"],
     ["column 'reward'", "leave the cell empty"]),
    ("trace-kl-minus-inf", lambda d: trace_csv(d, "t.csv", ["c,1,0.5,0.1,-inf"]), ["health", "t.csv"],
     ["column 'kl'"]),
    ("trace-step-negative", lambda d: trace_csv(d, "t.csv", ["c,-1,0.5,0.1,0.1"]), ["detect", "t.csv"],
     ["column 'step'"]),
    ("trace-step-inf", lambda d: trace_csv(d, "t.csv", ["c,inf,0.5,0.1,0.1"]), ["detect", "t.csv"],
     ["column 'step'"]),
    ("trace-progress-above-1", lambda d: (d / "t.csv").write_text("run_id,step,eval_score,progress\na,1,0.5,2.5\n"),
     ["detect", "t.csv"], ["column 'progress'", "[0, 1]"]),
    ("trace-eval-se-negative", lambda d: (d / "t.csv").write_text("run_id,step,eval_score,eval_se\na,1,0.5,-1\n"),
     ["detect", "t.csv"], ["column 'eval_se'"]),
    ("trace-grad-norm-negative", lambda d: trace_csv(d, "t.csv", ["c,1,0.5,0.1,0.1,-5"],
                                                     "run_id,step,eval_score,reward,kl,grad_norm"),
     ["health", "t.csv"], ["column 'grad_norm'"]),
    ("trace-truncation-rate-inf",
     lambda d: (d / "t.csv").write_text("run_id,step,eval_score,truncation_rate\na,1,0.5,inf\n"),
     ["health", "t.csv"], ["column 'truncation_rate'"]),
    # --- other arguments (was: traceback or accepted) ---
    ("canary-port-negative", None, ["canary", "--metrics-port", "-1"], ["metrics_port: -1"]),  # was: gaierror
    ("canary-port-too-big", None, ["canary", "--metrics-port", "99999"], ["metrics_port: 99999"]),  # OverflowError
    ("canary-cache-dir-file", None, ["canary", "--cache-dir", "afile"], ["cache_dir:"]),
    ("health-unknown-algorithm", "trace_ok", ["health", "ok.csv", "--algorithm", "bogus"],
     ["algorithm: 'bogus'", "ppo"]),
    ("alerts-threshold-nan",
     lambda d: (d / "a.yaml").write_text((d / "alerts.yaml").read_text().replace("ceiling: 1.0", "ceiling: .nan")),
     ["health", "ok.csv", "--alerts", "a.yaml"], ["a.yaml", "alerts.kl_blowup.params.ceiling", "finite"]),
    ("alerts-threshold-1e308",
     lambda d: (d / "a.yaml").write_text(
         (d / "alerts.yaml").read_text().replace("k: 4.0, persist", "k: 1e308, persist")),
     ["health", "ok.csv", "--alerts", "a.yaml"], ["a.yaml", "alerts.reward_band.params.k"]),
    ("detect-param-nan", "trace_ok", ["detect", "ok.csv", "--param", "z=nan"], ["param z: nan"]),  # was: accepted
    ("detect-param-inf", "trace_ok", ["detect", "ok.csv", "--param", "window=inf"],  # was: OverflowError
     ["param window: inf"]),
    ("health-only-names-nothing", "trace_ok", ["health", "ok.csv", "--only", ","], ["--only", "names no alert"]),
    ("nightly-unknown-experiment", None, ["nightly", "--experiments", "E99"], ["experiments: 'E99'"]),
    ("nightly-unknown-canary", None, ["nightly", "--canaries", "bogus"], ["canaries:", "bogus"]),
    ("platform-unknown-scheduler", None, ["platform", "--scheduler", "Bogus"], ["scheduler:", "Bogus"]),
    ("bench-sim-load-nan", None, ["bench", "sim", "--load", "nan"], ["--load"]),  # was: a multi-line usage box
    ("record-traces-seed-negative", None, ["record-traces", "--seeds", "-1"], ["seeds: -1"]),
]

TRACEBACK_BEFORE = {"experiment-yaml-latin1", "train-yaml-latin1", "alerts-yaml-latin1", "canary-alerts-latin1",
                    "bench-oppo-config-latin1", "platform-jobs-latin1", "detect-out-is-a-dir", "health-out-is-a-dir",
                    "health-metrics-file-is-a-dir", "set-bad-yaml-value", "canary-port-negative",
                    "canary-port-too-big", "detect-param-inf"}


@pytest.mark.parametrize("case_id, setup, argv, needles", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(case_id, setup, argv, needles, scratch, capsys,
                                                            monkeypatch):
    if setup == "trace_ok" or "ok.csv" in argv:
        trace_csv(scratch, "ok.csv", [])
    if callable(setup):
        setup(scratch)
    before = sorted(p.relative_to(scratch) for p in scratch.rglob("*"))
    code, lines = run_cli(argv, capsys, monkeypatch)
    assert code == 2, (case_id, code, lines)
    assert len(lines) == 1, (case_id, lines)
    assert lines[0].startswith("error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (case_id, needle, lines[0])
    after = sorted(p.relative_to(scratch) for p in scratch.rglob("*"))
    assert after == before, f"{case_id} wrote {sorted(set(after) - set(before))}"


def test_the_table_is_the_audit_and_more():
    """The issue's audit cases are all here; more than half of the table was found beyond the issue's list."""
    ids = {c[0] for c in CASES}
    assert TRACEBACK_BEFORE <= ids
    for listed in ("num-heads-not-dividing", "train-out-existing-file", "actor-lr-1e308", "hidden-size-1e8",
                   "simulate-jobs-50M", "trace-eval-nan", "trace-reward-inf", "trace-reward-1e308",
                   "simulate-workers-0", "simulate-workers-negative", "set-wrong-type"):
        assert listed in ids
    assert len(ids) == len(CASES)


# --- the valid side: shipped configs still load, valid values still pass ---

@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "configs").glob("ppo-*.yaml")))
def test_shipped_training_configs_validate(name, monkeypatch):
    from training.job.config import load_config

    if name == "ppo-qwen2-0.5b":  # a GPU job, sized for a GPU box's memory (its estimate is ~72 GiB), not this one's
        monkeypatch.setenv("RLHFOPS_MEMORY_LIMIT_GIB", "128")
    cfg = load_config(REPO / "configs" / f"{name}.yaml")
    assert cfg.name == name


@pytest.mark.parametrize("exp", [f"E{i}" for i in range(1, 9)])
def test_shipped_experiments_validate_with_every_variant(exp):
    from scheduling.experiments import load_experiment, units_for

    cfg = load_experiment(exp)
    assert len(units_for(cfg)) == len(cfg.seeds) * len(cfg.variants)


def test_shipped_alerts_and_prices_validate():
    from eval.health import load_alerts_config
    from infra.ledger import load_prices

    assert load_alerts_config(REPO / "configs" / "alerts.yaml").alerts
    assert load_prices(REPO / "configs" / "prices.yaml").gpu_hour["cpu"] == "0.05"


def test_override_fills_a_section_the_file_leaves_to_defaults():
    """E1.yaml has no `workload.lora`: before, `--set workload.lora.eval_minutes=2` replaced the whole default
    section with {eval_minutes: 2} and failed with "duration_min: Field required"."""
    from scheduling.experiments import load_experiment

    cfg = load_experiment("E1", {"workload.lora.eval_minutes": 2})
    assert cfg.workload.lora.eval_minutes == 2
    assert cfg.workload.lora.duration_min == (10, 60)  # the documented default (README: LoRA 10-60 min)
    assert cfg.workload.lora.gpus == (1, 2)


def test_empty_optional_cell_is_missing_but_nan_text_is_rejected(tmp_path):
    """Per-column rule: an empty optional cell is 'not recorded' (NaN for the alerts), a spelled-out NaN is not."""
    from eval.traces import load_trace

    (tmp_path / "t.csv").write_text("run_id,step,eval_score,reward\nr,1,0.5,\nr,2,,0.3\n")
    df = load_trace(tmp_path / "t.csv")
    assert df["reward"].isna().tolist() == [True, False]
    assert df["reward"].iloc[1] == 0.3
    assert df["eval_score"].isna().tolist() == [False, True]  # a step without an eval
    (tmp_path / "t.csv").write_text("run_id,step,eval_score,reward\nr,1,0.5,nan\nr,2,0.6,0.3\n")
    with pytest.raises(BadInput, match=r"column 'reward' line 2 \(run 'r', step 1.0\)"):
        load_trace(tmp_path / "t.csv")


def test_run_ids_that_look_like_missing_values_are_ids(tmp_path):
    """Only an empty cell is missing: a run called 'NA' is a run."""
    from eval.traces import load_trace

    (tmp_path / "t.csv").write_text("run_id,step,eval_score\nNA,1,0.5\nnull,1,0.4\n")
    assert sorted(load_trace(tmp_path / "t.csv")["run_id"]) == ["NA", "null"]


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_parameter_count_matches_the_built_model(arch):
    """The memory estimate's parameter count against transformers' own model (the independent oracle)."""
    from training.inputs.tokenizer import make_tokenizer
    from training.job.config import ModelConfig, parameter_count
    from training.models import build_causal_lm

    tok = make_tokenizer()
    mc = ModelConfig(arch=arch, hidden_size=32, num_layers=3, num_heads=4, intermediate_size=48)
    model = build_causal_lm(mc, tok, 100)
    assert parameter_count(mc, 100, tok.vocab_size) == sum(p.numel() for p in model.parameters())


def test_byte_vocab_constant_is_the_tokenizer():
    from training.inputs.tokenizer import make_tokenizer
    from training.job.config import BYTE_VOCAB

    assert make_tokenizer().vocab_size == BYTE_VOCAB


def test_memory_limit_is_the_environment_variable(monkeypatch):
    """The same config passes under a roomy limit and fails under a tiny one, naming how to raise it."""
    from training.job.config import load_config

    monkeypatch.setenv("RLHFOPS_MEMORY_LIMIT_GIB", "64")
    load_config(REPO / "configs" / "ppo-tiny.yaml")
    monkeypatch.setenv("RLHFOPS_MEMORY_LIMIT_GIB", "0.0001")
    with pytest.raises(BadInput, match="RLHFOPS_MEMORY_LIMIT_GIB=0.0001"):
        load_config(REPO / "configs" / "ppo-tiny.yaml")
    monkeypatch.setenv("RLHFOPS_MEMORY_LIMIT_GIB", "lots")
    with pytest.raises(BadInput, match="RLHFOPS_MEMORY_LIMIT_GIB: 'lots'"):
        load_config(REPO / "configs" / "ppo-tiny.yaml")


def test_weights_count_in_the_memory_estimate(tmp_path, monkeypatch):
    """A 43B-parameter policy with almost no activations (batch 2, one new token, no overcommitment) still needs
    its weights: actor + Adam + reference >= 20 B per parameter, far over a 100 GiB limit."""
    import re

    from training.job.config import load_config

    monkeypatch.setenv("RLHFOPS_MEMORY_LIMIT_GIB", "100")
    h, layers, inter = 8192, 64, 16384
    params = 259 * h + layers * (4 * h * h + 3 * h * inter + 2 * h) + h  # llama, tied embeddings (hand count)
    changes = {"policy.hidden_size": h, "policy.num_layers": layers, "policy.num_heads": 64,
               "policy.intermediate_size": inter, "ppo.batch_size": 2, "ppo.num_mini_batches": 1,
               "ppo.max_new_tokens": 1, "oppo.delta_init": 0, "oppo.delta_max": 0}
    with pytest.raises(BadInput) as err:
        load_config(tmp_path / ppo_yaml(tmp_path, "c.yaml", changes))
    needs = float(re.search(r"needs ~([\d,.]+) GiB", str(err.value)).group(1).replace(",", ""))
    assert needs >= 20 * params / 2**30
    assert f"policy {params / 1e6:,.1f}M parameters" in str(err.value)


def test_flow_parameters_go_through_the_same_validators(tmp_path):
    """A deployment parameter gets the same one-line error as the CLI, naming the parameter."""
    from scheduling.request import ExperimentRequest, plan_experiment

    with pytest.raises(BadInput, match=r"override 'seeds=\[-1\]': field 'seeds.0'"):
        plan_experiment(ExperimentRequest(experiment="E1", overrides={"seeds": [-1]}))
    with pytest.raises(BadInput, match=r"^seeds: -1 must be a whole number"):
        ExperimentRequest(experiment="E1", seeds=[-1])
    (tmp_path / "f").write_text("x")
    from common.validate import check_out_dir

    with pytest.raises(BadInput, match="out_dir: "):
        check_out_dir(tmp_path / "f", "out_dir")


def test_a_job_request_goes_through_the_same_config_validators(tmp_path):
    """The rlhf-job flow's request gets the config loader's one-line errors, naming the override or the field."""
    from training.job.request import parse_request

    def job(**fields):
        return parse_request({"out_root": str(tmp_path / "runs"), **fields}).checked()

    with pytest.raises(BadInput, match=r"override 'ppo.actor_lr=1e\+308': field 'ppo.actor_lr'"):
        job(config=str(REPO / "configs" / "ppo-tiny.yaml"), overrides={"ppo.actor_lr": 1e308})
    with pytest.raises(BadInput, match="policy"):
        job(config={"policy": {"hidden_size": 64, "num_heads": 3}})
    with pytest.raises(BadInput, match="steps: 0"):
        job(config=str(REPO / "configs" / "ppo-tiny.yaml"), steps=0)


def _numeric_leaves(model, prefix=""):
    """Dotted paths of every int/float field (or tuple/list of them) of a pydantic config model."""
    import typing

    from pydantic import BaseModel

    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _numeric_leaves(ann, f"{prefix}{name}.")
            continue
        text = str(ann)
        if ann is bool or "bool" in text or "str" in text or "Literal" in text:
            continue
        if ann in (int, float) or "int" in text or "float" in text:
            yield f"{prefix}{name}", typing.get_origin(ann) in (tuple, list)


def test_every_numeric_config_field_rejects_nan_inf_and_1e308(monkeypatch):
    """The audit's sweep, kept: NaN, infinity and 1e308 in any numeric field of a training or experiment config
    (as an override on a shipped config) is one BadInput naming that field."""
    from scheduling.config import ExperimentConfig
    from scheduling.experiments import load_experiment
    from training.job.config import TrainConfig, resolve_config

    monkeypatch.setenv("RLHFOPS_MEMORY_LIMIT_GIB", "16")
    checked = 0
    for model, load in ((TrainConfig, lambda o: resolve_config(REPO / "configs" / "ppo-tiny.yaml", o)),
                        (ExperimentConfig, lambda o: load_experiment("E2", o))):
        for path, is_seq in _numeric_leaves(model):
            for bad in (float("nan"), float("inf"), 1e308):
                with pytest.raises(BadInput) as err:
                    load({path: [bad, bad] if is_seq else bad})
                assert path in str(err.value), (path, bad, str(err.value))
                checked += 1
    assert checked > 3 * 60  # every numeric field of both configs, not a handful
