"""The eval gate's per-prompt records with common random numbers (training/gate.py, Trainer.gate/extend_gate):
the same checkpoint scored twice gives identical records, two checkpoints share each prompt's sampling seed, the
records' mean is the gate's reported mean (recomputed here from the CSV), and the extension batches stay within
their budget and in held-out order.

The gate's extension on close decisions (eval/supervisor.py `RunSupervisor.observe(prompts=, extend=)`,
training/job/lifecycle.py `gate_evidence`): while the paired rule is undecided and its point estimate says decline, the
supervisor asks for more prompts for the two checkpoints in question, the rule decides again, and the extra eval
seconds land in the tenant's ledger `eval` phase. Oracles: a running total of the seconds the fake gate handed out;
the rule's verdict before and after, from scores whose decline the test chose."""

import csv
import math

import numpy as np
import pytest
from tiny_job import tiny_config

from eval.health import Catalog
from eval.paired import PairedStop, Verdict
from eval.supervisor import RunSupervisor
from infra.ledger import Ledger
from training.gate import GATE_RECORDS, RECORD_COLUMNS, batch_seed, heldout_batches
from training.job.config import TrainConfig
from training.job.lifecycle import gate_evidence
from training.metrics import StepRecord
from training.trace import export_prompt_records
from training.trainer import Trainer, gold_eval, latest_checkpoint


def tiny(cache_dir, **over) -> TrainConfig:
    return tiny_config(cache_dir, **{"seed": 5, "n_heldout_prompts": 16, "eval_extra_batch": 4, **over})


def varied_gold(prompt: str, text: str, cfg) -> float:
    """A stand-in world scorer that varies with the response (the tiny models here write unparseable bytes, which
    the real gold scorer gives -2 each): makes the mean, SE and per-prompt checks below non-trivial."""
    return (len(text) % 7) / 3.0 - 1.0 + (0.5 if prompt.endswith("?") else 0.0)


@pytest.fixture(scope="module")
def scorer():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("training.gate.gold_score", varied_gold)  # HeldoutScorer (training/gate.py) calls it
        yield varied_gold


@pytest.fixture(scope="module")
def run(cache, tmp_path_factory, scorer):
    """A 4-step run with gates at steps 2 and 4, its run directory and step records."""
    out = tmp_path_factory.mktemp("run")
    trainer = Trainer(tiny(cache), overlap="none", out_dir=out, resume=False)
    recs = list(trainer.run(4))
    return trainer, out, recs


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_records_file_matches_the_gate_means(run):
    trainer, out, recs = run
    rows = _rows(out / GATE_RECORDS)
    assert tuple(rows[0]) == RECORD_COLUMNS
    gates = [r for r in recs if not math.isnan(r.gold_eval)]
    assert [r.step for r in gates] == [2, 4]
    for rec in gates:
        mine = [r for r in rows if int(r["step"]) == rec.step]
        assert sorted(int(r["prompt_id"]) for r in mine) == list(range(8))
        golds = np.array([float(r["gold_score"]) for r in mine])
        assert golds.std() > 0  # a varied score: the recomputation below is not of a constant
        # independent recomputation of the gate's reported mean and SE from the file
        assert golds.mean() == pytest.approx(rec.gold_eval, abs=1e-5)
        assert golds.std(ddof=1) / math.sqrt(len(golds)) == pytest.approx(rec.gold_eval_se, abs=1e-5)
        assert all(np.isfinite(float(r["proxy_score"])) and int(r["response_len"]) >= 1 for r in mine)


def test_same_checkpoint_twice_identical_and_checkpoints_share_seeds(run):
    trainer, out, _ = run
    ckpt = latest_checkpoint(out)
    a = gold_eval(ckpt)
    b = gold_eval(ckpt)
    assert a.records == b.records  # CRN: the same checkpoint scored twice gives the same per-prompt records
    # and it reads what the trainer's gate read at step 4 (the default seed is the run's gate seed)
    assert [r.gold_score for r in a.records] == pytest.approx([r.gold_score for r in trainer.gate_records[4]],
                                                              abs=1e-6)
    rows = _rows(out / GATE_RECORDS)
    seeds = {(int(r["step"]), int(r["prompt_id"])): int(r["seed"]) for r in rows}
    for pid in range(8):
        assert seeds[(2, pid)] == seeds[(4, pid)] == batch_seed(5, 0)
    # the two checkpoints differ (training moved the policy), so equal records are not a constant scorer
    assert [r["proxy_score"] for r in rows if r["step"] == "2"] != [r["proxy_score"] for r in rows if r["step"] == "4"]


def test_gold_of_the_sampled_text_is_the_record(cache, scorer):
    """The gold column is the world score of the response sampled with the gate's seed (recomputed from the text)."""
    from training.trainer import generate

    cfg = tiny(cache)
    trainer = Trainer(cfg, overlap="none", out_dir=None, resume=False)
    ev = trainer.score_batch(0)
    prompts = trainer.inputs.heldout_prompts(range(8))
    responses = generate(trainer.actor, trainer.tok, prompts, cfg.ppo.max_new_tokens, cfg.ppo.temperature,
                         seed=batch_seed(cfg.seed, 0))
    expect = [scorer(p, trainer.tok.decode(r), cfg.task) for p, r in zip(prompts, responses, strict=True)]
    assert len(set(expect)) > 1
    assert [r.gold_score for r in ev.records] == pytest.approx(expect)
    assert [r.response_len for r in ev.records] == [len(r) for r in responses]


def test_extension_batches_and_budget(cache, tmp_path):
    cfg = tiny(cache, eval_extra_budget=16)  # two batches of 4 prompts for two checkpoints
    assert [list(b) for b in heldout_batches(16, 8, 4)] == [list(range(8)), [8, 9, 10, 11], [12, 13, 14, 15]]
    trainer = Trainer(cfg, overlap="none", out_dir=tmp_path, resume=False)
    list(trainer.run(4))
    got, secs = trainer.extend_gate((2, 4))
    assert sorted(got) == [2, 4] and secs > 0
    assert [r.prompt_id for r in got[2]] == [8, 9, 10, 11] and {r.seed for r in got[4]} == {batch_seed(5, 1)}
    # the extension of step 2 (its weights kept in memory) equals scoring its saved checkpoint on those prompts
    ckpt = gold_eval(tmp_path / "checkpoints" / "step-000002", trainer.inputs.heldout_prompts(range(8, 12)), cfg,
                     seed=batch_seed(5, 1))
    assert [r.gold_score for r in got[2]] == pytest.approx([r.gold_score for r in ckpt.records])
    got2, _ = trainer.extend_gate((2, 4))
    assert [r.prompt_id for r in got2[4]] == [12, 13, 14, 15] and trainer.extra_evals == 16
    assert trainer.extend_gate((2, 4)) == ({}, 0.0)  # budget (and pool) spent: nothing more
    rows = _rows(tmp_path / GATE_RECORDS)
    assert sum(r["step"] == "2" for r in rows) == 16  # 8 gate prompts + two extensions of 4


def test_export_prompt_records(run, tmp_path):
    _, out, _ = run
    n = export_prompt_records(out / GATE_RECORDS, tmp_path / "prompts.csv", run_id="r9")
    rows = _rows(tmp_path / "prompts.csv")
    assert n == 16 == len(rows) and {r["run_id"] for r in rows} == {"r9"}
    assert tuple(rows[0]) == RECORD_COLUMNS

def _record(step: int) -> StepRecord:
    return StepRecord(step=step, policy_version=step, reward_mean=0.0, gold_eval=0.0, gold_eval_se=0.1,
                      phase_seconds={"eval": 1.0})


def _supervisor(ledger):
    sup = RunSupervisor("run-x", "acme", Catalog({}).start(tenant="acme"), gate_detector=PairedStop(alpha=0.02),
                        ledger=ledger, gpu_kind="cpu", n_gpus=2)
    sup.begin()
    return sup


def test_close_decision_extends_charges_eval_and_then_stops():
    rng = np.random.default_rng(0)
    base = rng.normal(0.0, 1.0, 16)
    first = {str(i): float(v) for i, v in enumerate(base)}
    second = {str(i): float(v - 0.1 + rng.normal(0, 0.2)) for i, v in enumerate(base)}
    ledger = Ledger()
    sup = _supervisor(ledger)
    spent = []  # the test's own running total of the seconds the fake gate handed out
    calls = []

    def extend(pair):
        calls.append(tuple(pair))
        if len(calls) > 3:
            return {}, 0.0
        ids = range(16 + 64 * (len(calls) - 1), 16 + 64 * len(calls))
        more = rng.normal(0.0, 1.0, 64)
        spent.append(0.25 * len(calls))
        return ({5: {str(i): float(v) for i, v in zip(ids, more, strict=True)},
                 10: {str(i): float(v - 0.4) for i, v in zip(ids, more, strict=True)}}, spent[-1])

    sup.observe(_record(5), prompts=first, extend=extend)
    sup.observe(_record(10), prompts=second, extend=None)
    assert sup.gate_monitor.verdict is Verdict.EXTEND  # close: decline by the point estimate, not yet shown
    assert not sup.gate_monitor.comparisons[0].upper < 0
    # the same step again through the extension path: a fresh supervisor sees it with `extend`
    ledger2 = Ledger()
    sup2 = _supervisor(ledger2)
    sup2.observe(_record(5), prompts=first, extend=extend)
    sup2.observe(_record(10), prompts=second, extend=extend)
    assert calls and calls[0] == (5.0, 10.0)
    assert sup2.gate_monitor.verdict is Verdict.STOP and sup2.machine.state.value == "PAUSED_BY_GATE"
    assert sup2.extensions == len(spent) and sup2.extra_eval_s == pytest.approx(sum(spent))
    eval_s = ledger2.run_totals()["run-x"].gpu_us_by_phase["eval"] / 1e6
    # the two gates' own eval (1 s each x 2 GPUs) plus the extensions' seconds x 2 GPUs
    assert eval_s == pytest.approx(2 * 2 * 1.0 + 2 * sum(spent))


def test_no_extension_when_not_close_or_no_budget():
    same = {str(i): float(i % 5) for i in range(16)}
    calls = []
    sup = _supervisor(Ledger())
    sup.observe(_record(5), prompts=same, extend=lambda pair: calls.append(pair) or ({}, 0.0))
    sup.observe(_record(10), prompts=same, extend=lambda pair: calls.append(pair) or ({}, 0.0))
    assert sup.gate_monitor.verdict is Verdict.CONTINUE and not calls  # identical checkpoints: nothing to extend


def test_gate_evidence_from_a_real_trainer(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    trainer = Trainer(tiny(cache, eval_extra_budget=8), overlap="none", out_dir=None, resume=False)
    recs = list(trainer.run(4))
    assert gate_evidence(trainer, recs[0]) == {}  # no gate at step 1
    ev = gate_evidence(trainer, recs[3])
    assert ev["prompts"] == {str(r.prompt_id): r.gold_score for r in trainer.gate_records[4]}
    got, seconds = ev["extend"]((2.0, 4.0))
    assert sorted(got) == [2, 4] and set(got[4]) == {"8", "9", "10", "11"} and seconds > 0
    assert ev["extend"]((2.0, 4.0)) == ({}, 0.0)  # the budget (8 prompt evaluations) is spent
    assert math.isfinite(sum(got[2].values()))
    no_budget = Trainer(tiny(cache), overlap="none", out_dir=None, resume=False)
    rec = list(no_budget.run(2))[-1]
    assert "extend" not in gate_evidence(no_budget, rec)
