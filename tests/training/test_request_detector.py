"""The gate detector as a typed part of the request (`training.job.request.DetectorSpec`): parameters travel from every
entry point (a request's mapping, `rlhfops train --detector 'paired(margin=0.1)'`, a platform round's scheduler name)
into the supervisor the one builder makes, the platform's settings fill what a name leaves out, and a wrong name or
parameter is one line naming `detector.params.<name>` before any work starts.

The behavioural oracle is a record set built by hand: at the second checkpoint every one of 64 prompts scores
0.05 (+-0.001) below the first, a decline beyond a margin of 0 by ~50 standard errors and well inside a margin of
0.1, so the paired rule with margin 0 pauses the run there and with margin 0.1 does not, whatever its alpha split."""

from __future__ import annotations

import math

import pytest

from common.errors import BadInput

PROMPTS = 64


def _scores(step: int) -> dict[str, float]:
    """Gate scores by prompt: prompt difficulty spreads them (0..0.9); step 4 is 0.05 below step 2 on every prompt,
    up to a +-0.001 wobble."""
    drop = 0.05 if step >= 4 else 0.0
    return {str(i): 0.1 * (i % 10) - drop + (0.001 if i % 2 else -0.001) * (step >= 4) for i in range(PROMPTS)}


def _record(step: int):
    from training.metrics import StepRecord

    scores = _scores(step)
    gold = sum(scores.values()) / PROMPTS if step % 2 == 0 else math.nan
    return StepRecord(step=step, policy_version=step, reward_mean=0.1 * step, gold_eval=gold, gold_eval_se=0.03,
                      kl=0.1, entropy=1.0, loss_policy=0.0, phase_seconds={"rollout": 0.5}, tokens_generated=10)


def paused_at(supervisor, steps: int = 4) -> int | None:
    """Feed the hand-built steps 1..`steps` to a job's supervisor (per-prompt scores at each gate); the step it
    paused at, or None."""
    from eval.states import RunState

    supervisor.begin()
    for step in range(1, steps + 1):
        rec = _record(step)
        supervisor.observe(rec, prompts=_scores(step) if step % 2 == 0 else None)
        if supervisor.machine.state is RunState.PAUSED_BY_GATE:
            return step
    return None


def _supervisor(tmp_path, detector):
    from training.job.request import build, parse_request

    request = parse_request({"config": "configs/ppo-tiny.yaml", "steps": 8, "detector": detector,
                             "out_root": str(tmp_path), "run_dir": "."})
    return build(request)[1]


def test_the_hand_built_decline_is_beyond_margin_0_and_inside_margin_0_1():
    """The oracle's own premise, by hand: the mean paired difference is -0.05 with a tiny SD."""
    diffs = [_scores(4)[k] - _scores(2)[k] for k in _scores(2)]
    assert sum(diffs) / PROMPTS == pytest.approx(-0.05) and max(diffs) < 0 and min(diffs) > -0.1


@pytest.mark.parametrize(("detector", "pauses"), [
    ({"name": "paired", "params": {"margin": 0.0}}, True),
    ({"name": "paired", "params": {"margin": 0.1}}, False),
    ("paired(margin=0)", True),
    ("paired(margin=0.1)", False),
    ("paired", False),  # the platform's setting: margin 0.1
    ({"name": "paired"}, False),
])
def test_a_requests_detector_parameters_reach_the_supervisor_it_builds(tmp_path, detector, pauses):
    assert paused_at(_supervisor(tmp_path, detector)) == (4 if pauses else None)


@pytest.mark.parametrize(("scheduler", "pauses"), [("Paired+SRTF", False), ("Paired(margin=0)+SRTF", True),
                                                   ("Paired(margin=0.1)+SRTF", False)])
def test_a_rounds_jobs_carry_its_schedulers_rule_with_the_same_settings(tmp_path, scheduler, pauses):
    """A round's jobs are gated by the detector their requests carry (the scheduler's rule), built by the same
    builder: `Paired+SRTF` is the paired rule with the platform's margin, as `rlhfops train --detector paired` is."""
    from flows.params import DEFAULT_JOBS, check_round, round_requests, scheduler_gate
    from training.job.request import build

    (job,) = [j for j in DEFAULT_JOBS if j["name"] == "healthy"]
    (request,) = round_requests([job], steps=8, slots=1, out_dir=str(tmp_path / "round"),
                                cache_dir=str(tmp_path / "cache"), detector=scheduler_gate(scheduler))
    (checked,) = check_round([request])
    assert paused_at(build(request, checked)[1]) == (4 if pauses else None)


def test_no_gate_for_a_bare_base_policy():
    from flows.params import scheduler_gate

    assert scheduler_gate("SRTF") is None


def test_the_spec_reads_back_from_its_label():
    from training.job.request import parse_detector

    for text in ("paired", "paired(margin=0.05, alpha=0.01)", "evalstop(k=3)", "noisepatience"):
        spec = parse_detector(text)
        assert parse_detector(spec.label) == spec
    assert parse_detector("Paired").label == "paired(margin=0.1)"
    assert parse_detector("evalstop").label == "evalstop"


@pytest.mark.parametrize(("detector", "start", "hint"), [
    ({"name": "paired", "params": {"margin": -1}}, "detector.params.margin: -1 is refused", "margin must be"),
    ({"name": "paired", "params": {"marign": 0.1}}, "detector.params.marign: paired has no parameter", "margin"),
    ("paired(margin=lots)", "detector.params.margin: 'lots' is not a number", "0.1"),
    ("paired(horizon=2.5)", "detector.params.horizon: 2.5 is not a whole number", "0"),
    ("evalstop(k=0)", "detector.params.k: 0 is refused", "k"),
    ("nope", "detector: 'nope' is not one of", "paired"),
    ("paired(margin=", "detector: cannot read", "paired(margin=0.1)"),
])
def test_a_bad_detector_is_one_line_naming_the_field_and_the_fix(detector, start, hint):
    from training.job.request import parse_request

    with pytest.raises(BadInput) as err:
        parse_request({"detector": detector})
    line = str(err.value)
    assert line.startswith(start) and hint in line and "\n" not in line, line
    with pytest.raises(BadInput, match=r"^jobs\[2\]\." + start.replace("(", r"\(").split(":")[0]):
        parse_request({"detector": detector}, "jobs[2]")


def test_train_refuses_a_bad_detector_parameter_exit_2_before_any_work(tmp_path, capsys, monkeypatch):
    from cli_helpers import run_cli, tripwire

    import training.trainer

    monkeypatch.setattr(training.trainer, "Trainer", tripwire)
    code, err = run_cli(["train", "configs/ppo-tiny.yaml", "--detector", "paired(margin=-0.1)", "--out",
                         tmp_path / "t"], capsys, monkeypatch)
    assert code == 2 and "--detector.params.margin: -0.1 is refused" in err[-1], err
    assert not (tmp_path / "t").exists()


def test_the_rlhf_job_form_takes_the_detector_as_an_object_or_a_name():
    from flows.rlhf_job import rlhf_job

    got = rlhf_job.validate_parameters({"request": {"detector": {"name": "paired", "params": {"margin": 0.05}}}})
    assert got["request"].detector.params == {"margin": 0.05}
    assert rlhf_job.validate_parameters({"request": {"detector": "evalstop"}})["request"].detector.label == "evalstop"
