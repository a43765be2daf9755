"""Prometheus metrics: run_id only on per-run series, bounded tenant labels, HTTP and text exposition."""

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from eval.health import AlertEvent
from infra.metrics import OTHER_TENANT, PER_RUN_PREFIX, PlatformMetrics
from training.metrics import StepRecord


def record(step):
    return StepRecord(step=step, policy_version=step, reward_mean=0.1 * step, kl=0.01 * step, entropy=2.0,
                      gold_eval=0.4 if step % 2 == 0 else float("nan"),
                      phase_seconds={"rollout": 1.0, "score": 0.2, "sync": 0.1, "optim": 0.5, "eval": 0.0},
                      tokens_generated=100, tokens_trained=50)


def families(metrics):
    return list(text_string_to_metric_families(metrics.exposition().decode()))


def fed(n_runs=30, n_tenants=12, max_tenants=5):
    m = PlatformMetrics(tenants=["acme", "globex"], max_tenants=max_tenants)
    for r in range(n_runs):
        run_id, tenant = f"run-{r}", f"t{r % n_tenants}"
        m.set_state(run_id, tenant, "RUNNING")
        for step in range(1, 4):
            m.observe_step(run_id, tenant, record(step), n_gpus=2)
        m.observe_alert(AlertEvent("dead_run", "paging", "degrade", 3, 3, "", "", ""))
        m.observe_cost(tenant, 1.5)
    return m


def test_run_id_only_on_per_run_series_and_tenants_bounded():
    m = fed()
    per_run_names, tenants = set(), set()
    for fam in families(m):
        for s in fam.samples:
            if "run_id" in s.labels:
                assert fam.name.startswith(PER_RUN_PREFIX), fam.name
                per_run_names.add(fam.name)
            else:
                assert not fam.name.startswith(PER_RUN_PREFIX) or not s.labels, (fam.name, s.labels)
            if "tenant" in s.labels:
                tenants.add(s.labels["tenant"])
    assert {"rlapi_run_step", "rlapi_run_kl", "rlapi_run_step_phase_seconds"} <= per_run_names
    # room for 5 tenants beyond the configured ones (which did not run here); the rest fold into "other"
    assert tenants == {"t0", "t1", "t2", "t3", "t4", OTHER_TENANT}
    fleet = {f.name: f for f in families(m)}
    phase = [s for s in fleet["rlapi_step_phase_seconds"].samples if s.name.endswith("_count")]
    assert {s.labels["phase"] for s in phase} == {"rollout", "score", "sync", "optim", "eval"}
    assert all(s.value == 90 for s in phase)  # 30 runs x 3 steps
    assert fleet["rlapi_steps"].samples[0].value == 90
    running = [s for s in fleet["rlapi_runs"].samples if s.labels["state"] == "RUNNING"]
    assert running[0].value == 30


def test_tenant_aggregates_and_end_run_drops_per_run_series():
    m = fed(n_runs=4, n_tenants=2)
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families(m) for s in f.samples}
    # t0 ran runs 0 and 2: 2 runs x 3 steps x 1.0 s rollout x 2 GPUs
    assert values[("rlapi_tenant_gpu_seconds_total", (("phase", "rollout"), ("tenant", "t0")))] == 12.0
    assert values[("rlapi_tenant_tokens_total", (("kind", "generated"), ("tenant", "t0")))] == 600
    m.set_state("run-0", "t0", "SUCCEEDED")
    m.end_run("run-0")
    after = m.exposition().decode()
    assert 'run_id="run-0"' not in after and 'run_id="run-1"' in after
    assert 'rlapi_tenant_gpu_seconds_total{phase="rollout",tenant="t0"} 12.0' in after


def test_http_and_textfile_exposition(tmp_path):
    m = fed(n_runs=2)
    path = m.write(tmp_path / "metrics.prom")
    text = path.read_text()
    assert "rlapi_step_phase_seconds_bucket" in text and 'rlapi_run_step{run_id="run-0"' in text
    server = m.serve(0)
    try:
        port = server.server_address[1]
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        server.shutdown()
    assert 'rlapi_run_step{run_id="run-1",tenant="t1"} 3.0' in body
