"""Run states (append-only enum, legal transitions, driven by alerts and gates) and failure attribution."""

import itertools

import pytest

from eval.attribution import (
    PlatformError,
    RewardFunctionGuard,
    RunEvidence,
    TenantCodeError,
    attribute,
)
from eval.health import AlertEvent
from eval.states import TRANSITIONS, FailureClass, IllegalTransition, RunState, RunStateMachine

# The published API. New members may only be appended after these.
PUBLISHED_STATES = ["QUEUED", "PROVISIONING", "RUNNING", "DEGRADED", "PAUSED_BY_GATE", "SUCCEEDED", "FAILED"]
PUBLISHED_CLASSES = ["platform_fault", "tenant_code_fault", "algorithmic_non_convergence"]


def test_enums_are_append_only():
    assert [s.value for s in RunState][: len(PUBLISHED_STATES)] == PUBLISHED_STATES
    assert [c.value for c in FailureClass][: len(PUBLISHED_CLASSES)] == PUBLISHED_CLASSES
    assert set(TRANSITIONS) == set(RunState)  # every state has a row


def event(alert, severity="paging", action="degrade", step=40):
    return AlertEvent(alert=alert, severity=severity, action=action, step=step, index=step, detail="d",
                      reason=f"{alert} reason", first_response="fr")


def running():
    m = RunStateMachine("r1", tenant="acme")
    m.provision()
    m.start()
    return m


def test_every_illegal_transition_raises_and_every_legal_one_works():
    for src, dst in itertools.product(RunState, RunState):
        m = RunStateMachine("x")
        m.history[-1] = type(m.status)(src)
        needs_reason = dst in (RunState.DEGRADED, RunState.PAUSED_BY_GATE, RunState.FAILED)
        kwargs = {"reason": "why"} if needs_reason else {}
        if dst is RunState.FAILED:
            kwargs["failure"] = FailureClass.PLATFORM_FAULT
        if dst in TRANSITIONS[src]:
            assert m.transition(dst, **kwargs).state is dst
        else:
            with pytest.raises(IllegalTransition):
                m.transition(dst, **kwargs)
    assert not TRANSITIONS[RunState.SUCCEEDED] and not TRANSITIONS[RunState.FAILED]


def test_reasons_and_exactly_one_failure_class_are_enforced():
    m = running()
    with pytest.raises(IllegalTransition, match="needs a reason"):
        m.transition(RunState.DEGRADED)
    with pytest.raises(IllegalTransition, match="exactly one FailureClass"):
        m.transition(RunState.FAILED, reason="x")
    with pytest.raises(IllegalTransition, match="only FAILED"):
        m.transition(RunState.SUCCEEDED, failure=FailureClass.PLATFORM_FAULT)
    m.transition(RunState.FAILED, reason="x", failure=FailureClass.TENANT_CODE_FAULT)
    assert m.status.label == "FAILED(tenant_code_fault)"


def test_alerts_drive_the_state_and_advisories_do_not():
    m = running()
    assert m.on_alert(event("grad_norm_spike", severity="advisory")) is None
    assert m.state is RunState.RUNNING and len(m.advisories) == 1
    m.on_alert(event("dead_run"))
    assert m.status.label == "DEGRADED(dead_run: dead_run reason)"
    # a pausing alert (hacking) pauses at the next checkpoint, with its reason
    m.on_alert(event("reward_hacking", action="pause"))
    assert m.state is RunState.DEGRADED
    m.on_checkpoint(50)
    assert m.state is RunState.PAUSED_BY_GATE and "reward_hacking" in m.status.reason and m.status.step == 50
    m.resume()
    assert m.state is RunState.RUNNING


def test_gate_stop_pauses_and_finish_attributes():
    m = running()
    assert m.on_checkpoint(10) is None
    m.on_checkpoint(20, gate_says_stop=True)
    assert m.status.label.startswith("PAUSED_BY_GATE(")
    m.finish(attribute(RunEvidence(completed=True)))
    assert m.state is RunState.SUCCEEDED and m.terminal
    with pytest.raises(IllegalTransition):
        m.start()


def test_reward_function_guard_and_tenant_fault_with_examples():
    def reward(text):
        if "!" in text:
            raise ValueError(f"cannot parse {text!r}")
        return float(len(text))

    guard = RewardFunctionGuard(reward)
    samples = [f"s{i}!" if i % 33 == 0 else f"s{i}" for i in range(400)]
    scores = [guard(s) for s in samples]
    summary = guard.summary()
    assert summary.failures == 13 and summary.calls == 400 and sum(s != s for s in scores) == 13
    att = attribute(RunEvidence(completed=True, reward_errors=summary))
    assert att.failure_class is FailureClass.TENANT_CODE_FAULT
    assert "raised on 3.2% of samples (13 of 400" in att.reason and "ValueError" in att.reason
    assert len(att.examples) == 5 and "cannot parse" in att.examples[0]
    # under the threshold the run is not blamed on the tenant
    lenient = attribute(RunEvidence(completed=True, reward_errors=summary), tenant_error_rate=0.05)
    assert lenient.failure_class is None


def test_exception_origin_decides_the_class():
    def raise_in(fn):
        try:
            fn()
        except Exception as err:  # noqa: BLE001
            return err

    def tenant_fn():
        raise KeyError("label")

    err = raise_in(tenant_fn)
    att = attribute(RunEvidence(completed=False, exception=err, tenant_code=(__file__,)))
    assert att.failure_class is FailureClass.TENANT_CODE_FAULT and "KeyError" in att.reason
    att = attribute(RunEvidence(completed=False, exception=TenantCodeError("dataset row 7 is empty")))
    assert att.failure_class is FailureClass.TENANT_CODE_FAULT
    att = attribute(RunEvidence(completed=False, exception=PlatformError("weight sync timed out after 60 s")))
    assert att.failure_class is FailureClass.PLATFORM_FAULT and "weight sync timed out" in att.reason
    # the same KeyError outside tenant code is the platform's
    assert attribute(RunEvidence(completed=False, exception=err)).failure_class is FailureClass.PLATFORM_FAULT


def test_mechanics_alert_is_a_platform_fault():
    stall = AlertEvent("sync_stall", "paging", "degrade", 30, 30, "lag 9", "weights stopped", "fr",
                       layer="mechanics")
    att = attribute(RunEvidence(completed=True, alerts=[event("dead_run"), stall]))
    assert att.failure_class is FailureClass.PLATFORM_FAULT and "weights stopped" in att.reason


def test_nonconvergence_and_exactly_one_class_per_terminal_run():
    pages = [event("dead_run", step=120), event("grad_norm_spike", severity="advisory")]
    att = attribute(RunEvidence(completed=True, alerts=pages))
    assert att.failure_class is FailureClass.ALGORITHMIC_NON_CONVERGENCE
    assert "dead_run reason" in att.reason and "grad_norm_spike" not in att.reason
    # a week of mixed terminal runs: each carries exactly one class, and the count adds up
    evidences = [
        RunEvidence(completed=True),
        RunEvidence(completed=False, exception=PlatformError("node lost")),
        RunEvidence(completed=False, exception=TenantCodeError("reward fn")),
        RunEvidence(completed=True, alerts=pages),
        RunEvidence(completed=False),
    ]
    machines = []
    for i, ev in enumerate(evidences):
        m = running()
        m.run_id = f"r{i}"
        m.finish(attribute(ev))
        machines.append(m)
    failed = [m for m in machines if m.state is RunState.FAILED]
    assert all(isinstance(m.status.failure, FailureClass) for m in failed)
    assert [m.status.failure for m in failed] == [
        FailureClass.PLATFORM_FAULT, FailureClass.TENANT_CODE_FAULT,
        FailureClass.ALGORITHMIC_NON_CONVERGENCE, FailureClass.PLATFORM_FAULT,
    ]
    assert sum(m.state is RunState.SUCCEEDED for m in machines) == 1


# --------------------------------------------------------------------------- live runs from StepRecords
def step_records(n, reward, kl, gate_every=10, eval_curve=None):
    from training.metrics import StepRecord

    recs = []
    for t in range(n):
        gold = eval_curve(t) if eval_curve is not None and t % gate_every == gate_every - 1 else float("nan")
        recs.append(StepRecord(
            step=t + 1, policy_version=t + 1, reward_mean=reward(t), gold_eval=gold, kl=kl(t), entropy=2.0,
            grad_norm=1.0, response_len_mean=40.0, truncation_rate=0.02, unparseable_rate=0.01,
            phase_seconds={"rollout": 1.0, "score": 0.25, "sync": 0.1, "optim": 0.5},
            tokens_generated=512, tokens_trained=256,
        ))
    return recs


def supervise(records, tenant="acme", gate_k=None):
    from eval.detectors import make_detector
    from eval.health import Catalog
    from eval.supervisor import RunSupervisor
    from infra.ledger import Ledger, PriceTable
    from infra.metrics import PlatformMetrics

    catalog = Catalog.from_file(algorithm="ppo")
    ledger = Ledger(PriceTable(gpu_hour={"cpu": "0.05"}))
    metrics = PlatformMetrics(tenants=[tenant])
    gate = make_detector("evalstop", k=gate_k) if gate_k else None
    sup = RunSupervisor("run-x", tenant, catalog.start(tenant=tenant), gate, ledger=ledger, metrics=metrics)
    sup.begin()
    for rec in records:
        sup.observe(rec)
        if sup.machine.state is RunState.PAUSED_BY_GATE:
            break
    sup.finish(completed=True)
    return sup, ledger, metrics


def test_live_dead_run_degrades_then_fails_as_non_convergence():
    import numpy as np

    rng = np.random.default_rng(0)
    recs = step_records(200, reward=lambda t: 0.3 + 0.01 * rng.normal(), kl=lambda t: 0.0,
                        eval_curve=lambda t: 0.4)
    sup, ledger, metrics = supervise(recs, gate_k=2)
    names = [e.alert for e in sup.events]
    assert "dead_run" in names
    assert any(label.startswith("DEGRADED(dead_run") for label in sup.machine.labels())
    assert sup.machine.status.label == "FAILED(algorithmic_non_convergence)"
    assert "not learning" in sup.machine.status.reason
    total = ledger.cluster_total()
    assert total.steps == sup.steps and total.gpu_us == sup.steps * 1_850_000
    assert b'rlapi_alerts_total{alert="dead_run",severity="paging"} 1.0' in metrics.exposition()


def test_live_hacking_pauses_at_next_checkpoint_and_healthy_run_succeeds():
    hack = step_records(150, reward=lambda t: 0.2 + 0.004 * t, kl=lambda t: 0.0005 * t,
                        eval_curve=lambda t: 0.3 + (0.002 * t if t < 50 else 0.1 - 0.004 * (t - 50)))
    sup, _, _ = supervise(hack)
    assert sup.machine.state is RunState.FAILED
    labels = sup.machine.labels()
    paused = [x for x in labels if x.startswith("PAUSED_BY_GATE(")]
    assert paused and "reward_hacking" in paused[0]
    hack_event = next(e for e in sup.events if e.alert == "reward_hacking")
    pause_status = next(s for s in sup.machine.history if s.state is RunState.PAUSED_BY_GATE)
    assert pause_status.step >= hack_event.step and pause_status.step % 10 == 0  # the next gate
    healthy = step_records(150, reward=lambda t: 0.2 + 0.004 * t, kl=lambda t: 0.0005 * t,
                           eval_curve=lambda t: 0.3 + 0.002 * t)
    sup, _, _ = supervise(healthy, gate_k=2)
    assert sup.events == [] and sup.machine.labels() == ["QUEUED", "PROVISIONING", "RUNNING", "SUCCEEDED"]
    # with EvalStop on the gate history, the hacked run is stopped by the gate before the hacking window
    # closes: two eval declines after the peak at step 50 (gates at 60 and 70)
    sup, _, _ = supervise(hack, gate_k=2)
    assert sup.machine.status.label == "SUCCEEDED" and sup.machine.history[-2].step == 70
    assert "stopped early at step 70 by the eval gate" in sup.machine.status.reason
