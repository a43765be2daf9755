"""Promotion by evidence (eval/promotion.py, infra/promotion.py): the registry's `best` alias moves only when a new
version beats the holder by the paired test on the same prompts. The error rate by simulation with known truth; the
registry cases on a real SQLite MLflow store, with the evidence of real trainer checkpoints where the prompt set
matters."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from eval.promotion import ALPHA, Evidence, decide
from infra import tracking as T

N = 32


def scores(values) -> dict[str, float]:
    return {str(i): float(v) for i, v in enumerate(values)}


def pair(rng, delta: float, noise: float = 0.3) -> tuple[Evidence, Evidence]:
    """A holder and a candidate on the same prompts and gate: prompt difficulty shared, the candidate's true mean
    `delta` above the holder's, independent sampling noise per prompt."""
    difficulty = rng.normal(0.3, 0.6, N)
    h = Evidence("P", "G", scores(difficulty + rng.normal(0, noise, N)))
    c = Evidence("P", "G", scores(difficulty + delta + rng.normal(0, noise, N)))
    return c, h


# ------------------------------------------------------------------------------------------ the rule, by simulation
def test_a_candidate_truly_no_better_is_promoted_at_most_alpha_of_the_time():
    rng = np.random.default_rng(0)
    reps = 2000
    promoted = sum(decide(*pair(rng, 0.0), has_holder=True).promote for _ in range(reps))
    assert promoted / reps <= stats.binom.ppf(0.999, reps, ALPHA) / reps


def test_a_candidate_truly_better_is_promoted():
    rng = np.random.default_rng(1)
    assert np.mean([decide(*pair(rng, 0.4), has_holder=True).promote for _ in range(200)]) >= 0.95


def test_a_higher_mean_that_is_not_significant_keeps_the_holder():
    rng = np.random.default_rng(2)
    for _ in range(50):
        c, h = pair(rng, -0.02)  # truly a little worse
        if np.mean(list(c.scores.values())) > np.mean(list(h.scores.values())):
            break
    else:
        pytest.fail("no sample with the higher mean")
    d = decide(c, h, has_holder=True, holder_name="version 1")
    diffs = np.array([c.scores[p] - h.scores[p] for p in h.scores])
    assert d.tested and not d.promote and d.diff == pytest.approx(diffs.mean()) and d.diff > 0
    assert d.lower < 0 and d.n == N and "kept version 1" in d.reason


def test_refusals_name_what_differs():
    c, h = pair(np.random.default_rng(3), 1.0)
    other_prompts = Evidence("Q", "G", c.scores)
    other_gate = Evidence("P", "H", c.scores)
    assert "different prompt sets" in decide(other_prompts, h, has_holder=True).reason
    assert "different gate configs" in decide(other_gate, h, has_holder=True).reason
    assert not decide(None, h, has_holder=True).promote
    assert not decide(c, None, has_holder=True).promote
    assert decide(None, None, has_holder=False).promote  # the first version takes best
    assert all("\n" not in decide(x, h, has_holder=True).reason for x in (other_prompts, other_gate, None))


def test_evidence_round_trips_through_tags():
    c, _ = pair(np.random.default_rng(4), 0.0)
    back = Evidence.from_tags(c.tags())
    assert back == Evidence(c.prompt_set, c.gate, {k: pytest.approx(v) for k, v in c.scores.items()})
    assert Evidence.from_tags({"evidence.scores": "not json"}) is None


# ------------------------------------------------------------------------------------------ on a real registry


def register(tmp_path, model: str, job: str, evidence: Evidence | None, run_state: str = "SUCCEEDED"):
    from infra.promotion import promote

    c = T.client()
    run_id, _ = T.open_run(f"test/{model}/{job}", job)
    T.finish(run_id)
    d = tmp_path / job
    d.mkdir(parents=True, exist_ok=True)
    (d / "weights.txt").write_text(job)
    try:
        c.create_registered_model(model)
    except Exception:  # noqa: BLE001 - exists
        pass
    mv = c.create_model_version(model, str(d), run_id=run_id, tags={"run_state": run_state})
    return mv, promote(c, model, mv, evidence, run_state=run_state)


def best_version(model: str) -> str:
    return str(T.client().get_model_version_by_alias(model, "best").version)


def test_registry_keeps_best_on_an_insignificant_higher_mean_and_records_the_evidence(store, tmp_path, model):
    rng = np.random.default_rng(5)
    first, d1 = register(tmp_path, model, "holder", pair(rng, 0.0)[1])
    assert d1.promote and best_version(model) == str(first.version)
    # a candidate whose sample mean is higher, by less than the noise: best stays
    h = Evidence.from_tags(T.client().get_model_version(model, first.version).tags)
    noise = rng.normal(0, 0.3, N)
    noise -= noise.mean()  # the candidate's mean is exactly 0.01 above the holder's
    noisy = Evidence("P", "G", {p: v + 0.01 + e for (p, v), e in zip(h.scores.items(), noise, strict=True)})
    second, d2 = register(tmp_path, model, "noisy", noisy)
    assert not d2.promote and best_version(model) == str(first.version)
    tags = T.client().get_model_version(model, second.version).tags
    assert tags["promotion.decision"] == "kept holder" and tags["promotion.vs_version"] == str(first.version)
    assert int(tags["promotion.n_prompts"]) == N and float(tags["promotion.lower_bound"]) <= 0
    assert json.loads(tags["evidence.scores"]) == pytest.approx(noisy.scores)
    # a clearly better one moves it, and its tags carry the difference, the bound and the prompts
    better = Evidence("P", "G", {p: v + 0.5 for p, v in h.scores.items()})
    third, d3 = register(tmp_path, model, "better", better)
    assert d3.promote and best_version(model) == str(third.version)
    tags = T.client().get_model_version(model, third.version).tags
    assert float(tags["promotion.diff"]) == pytest.approx(0.5) and float(tags["promotion.lower_bound"]) > 0
    assert tags["promotion.decision"] == "promoted"


def test_a_failed_run_never_takes_best(store, tmp_path, model):
    rng = np.random.default_rng(6)
    first, _ = register(tmp_path, model, "good", pair(rng, 0.0)[1])
    _, d = register(tmp_path, model, "bad", Evidence("P", "G", {str(i): 9.0 for i in range(N)}),
                    run_state="FAILED(algorithmic_non_convergence)")
    assert not d.promote and "FAILED" in d.reason and best_version(model) == str(first.version)


# ------------------------------------------------------------------------------------------ real checkpoints
@pytest.fixture(scope="module")
def two_prompt_sets(tmp_path_factory, warm_start_cache):
    """Two tiny real training runs with different seeds (so different held-out prompts) and one more with the first
    one's seed: each leaves checkpoints and its gate records."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "sweeps"))
    from sweep_helpers import BASE

    from training.job.config import resolve_config
    from training.trainer import Trainer

    out = {}
    for name, seed in (("a", 2), ("b", 7), ("a2", 2)):
        cfg = resolve_config({**BASE, "seed": seed, "steps": 4, "cache_dir": str(warm_start_cache)}, {})
        d = tmp_path_factory.mktemp(name)
        for _ in Trainer(cfg, "none", d).run(4):
            pass
        out[name] = d
    return out


def test_a_promotion_across_different_prompt_sets_is_refused(store, two_prompt_sets, model):
    from infra.promotion import checkpoint_evidence, promote

    ckpt = {k: sorted((d / "checkpoints").glob("step-*"))[-1] for k, d in two_prompt_sets.items()}
    ev = {k: checkpoint_evidence(p) for k, p in ckpt.items()}
    assert all(e is not None and len(e.scores) == 8 for e in ev.values())
    assert ev["a"].prompt_set == ev["a2"].prompt_set and ev["a"].prompt_set != ev["b"].prompt_set
    c = T.client()
    c.create_registered_model(model)
    versions = {}
    for k in ("a", "b"):
        run_id, _ = T.open_run(f"test/{model}/{k}", k)
        T.finish(run_id)
        versions[k] = c.create_model_version(model, str(ckpt[k]), run_id=run_id, tags={"run_state": "SUCCEEDED"})
    assert promote(c, model, versions["a"], ev["a"]).promote
    d = promote(c, model, versions["b"], ev["b"])
    assert not d.promote and d.reason.startswith("refused: different prompt sets")
    assert best_version(model) == str(versions["a"].version)
    assert c.get_model_version(model, versions["b"].version).tags["promotion.reason"] == d.reason


def test_checkpoint_evidence_is_the_gate_records_at_its_step(two_prompt_sets):
    import csv

    from infra.promotion import checkpoint_evidence

    d = two_prompt_sets["a"]
    ckpt = sorted((d / "checkpoints").glob("step-*"))[-1]
    step = int(ckpt.name.split("-")[1])
    with (d / "gate_records.csv").open() as f:
        rows = {r["prompt_id"]: float(r["gold_score"]) for r in csv.DictReader(f) if int(r["step"]) == step}
    ev = checkpoint_evidence(ckpt)
    assert ev.scores == pytest.approx(rows) and len(rows) == 8
    assert checkpoint_evidence(d) is None  # a directory without config.yaml: no evidence
    assert not math.isnan(sum(ev.scores.values()))


# ------------------------------------------------------------------------------------------ rlhfops promote
def test_rlhfops_promote_copies_a_sweep_version_into_a_job_model_through_the_test(store, tmp_path, model):
    from click.testing import CliRunner

    from common.errors import BadInput
    from rlhfops.cli import load_command

    cmd = load_command("promote", "promote")
    rng = np.random.default_rng(7)
    job_model, sweep_model = f"{model}-job", f"{model}-sweep"
    holder_version, _ = register(tmp_path, job_model, "job", pair(rng, 0.0)[1])
    h = Evidence.from_tags(holder_version.tags | T.client().get_model_version(job_model, holder_version.version).tags)
    noise = rng.normal(0, 0.3, N)
    noise -= noise.mean()  # higher by 0.002 on average, by nothing that counts
    same = Evidence("P", "G", {p: v + 0.002 + e for (p, v), e in zip(h.scores.items(), noise, strict=True)})
    better = Evidence("P", "G", {p: v + 0.4 for p, v in h.scores.items()})
    register(tmp_path, sweep_model, "trial-0", same)
    register(tmp_path, sweep_model, "trial-1", better)  # takes the sweep model's own best
    assert best_version(sweep_model) == "2"

    kept = CliRunner().invoke(cmd, [f"models:/{sweep_model}/1", "--to", job_model])
    assert kept.exit_code == 1 and "kept version 1" in kept.output
    assert best_version(job_model) == str(holder_version.version)  # the job's best stays

    moved = CliRunner().invoke(cmd, [f"models:/{sweep_model}@best", "--to", job_model])
    assert moved.exit_code == 0 and "promoted" in moved.output
    mv = T.client().get_model_version_by_alias(job_model, "best")
    assert mv.tags["promoted_from"] == f"{sweep_model}/2" and float(mv.tags["promotion.diff"]) == pytest.approx(0.4)

    bad = CliRunner().invoke(cmd, [f"models:/{sweep_model}/99", "--to", job_model])
    assert isinstance(bad.exception, BadInput) and str(bad.exception).startswith("source:")


# ------------------------------------------------------------------------------------------ a sweep beside a job
def test_a_sweep_in_the_nightly_registers_under_its_own_model_and_leaves_the_jobs_best(store, tmp_path, model):
    """The nightly's sweep stage ends in `MlflowSweepTracker.finish`, the one place a sweep registers: with the job's
    model already holding `best`, the sweep's best trial (scoring far higher, on other prompts and budgets) goes to
    the sweep's own model and the job's `best` stays."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "sweeps"))
    from sweep_helpers import BASE

    from tasks.sweep import MlflowSweepTracker, prepare, sweep_model

    job_model = "acme-policy"
    job_version, _ = register(tmp_path, job_model, "nightly-job", pair(np.random.default_rng(8), 0.0)[1])
    spec, ledger = prepare({"name": "job-and-sweep", "base": BASE,
                            "space": {"ppo.kl_coef": {"grid": [0.1]}}, "trials": 1, "tenant": "acme",
                            "out_dir": str(tmp_path / "sweep"), "mlflow_experiment": "sweeps-test"})
    tracker = MlflowSweepTracker(ledger)
    tracker.start(spec, resume=False)
    trial_run = tracker.trial_started(0, {"ppo.kl_coef": 0.1})
    ckpt = tmp_path / "sweep" / "trial-0000" / "seed-0" / "checkpoints" / "step-000012"
    ckpt.mkdir(parents=True)
    (ckpt / "weights.txt").write_text("trial")
    best = {"number": 0, "run_id": trial_run, "best_checkpoint": str(ckpt), "best_step": 12, "objective": 0.99,
            "objective_se": 0.01}
    registry = tracker.finish({"best": best, "trials_done": 1, "trials_pruned": 0, "trials_failed": 0,
                               "gpu_seconds": 1.0, "wall_s": 1.0}, [])
    assert registry["model"] == sweep_model(spec) == f"{spec.name}-sweep" and registry["alias_best"]
    assert best_version(job_model) == str(job_version.version)
    assert {v.run_id for v in T.client().search_model_versions(f"name = '{job_model}'")} == {job_version.run_id}
    # the nightly's copy of the example spec: a study of its own each night, one sweep model for every night
    from flows.nightly import nightly_sweep_spec

    tonight = nightly_sweep_spec("configs/sweeps/example.yaml", tmp_path, "0123456789abcdef", "sweeps-test")
    assert tonight["name"] == "example-nightly-01234567" and tonight["registered_model"] == "example-sweep"
    assert sweep_model(prepare(tonight)[0]) == "example-sweep"
