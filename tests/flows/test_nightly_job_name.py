"""The nightly's job runs under the tenant and name it is given (`rlhfops nightly --job-config FILE --tenant T --name
N`, the flow's `job_tenant`/`job_name`), not the nightly's own; without them, acme and nightly-<algorithm> as before;
and on the GPUs it is given (`--job-gpus`, its ranks launched by `--runner`). Checked on the plan `check_nightly`
makes before any server starts."""

from __future__ import annotations

import pytest

from common.errors import BadInput


def plan(tmp_path, **kw):
    from flows.nightly_check import check_nightly

    return check_nightly(quick=True, experiments=[], canaries=[], sweep=False, out_dir=str(tmp_path / "out"),
                         cache_dir=str(tmp_path / "cache"), job_config="configs/ppo-arith.yaml", **kw)


def test_the_job_takes_the_tenant_and_name_given(tmp_path):
    job = plan(tmp_path, job_tenant="umbrella", job_name="arith-first").job
    assert (job.tenant, job.name) == ("umbrella", "arith-first")
    default = plan(tmp_path).job
    assert (default.tenant, default.name) == ("acme", "nightly-ppo")


def test_the_job_trains_on_the_gpus_given_launched_by_the_nightlys_runner(tmp_path):
    job = plan(tmp_path, job_gpus=2, runner="ray").job
    assert (job.gpus, job.runner) == (2, "ray")
    default = plan(tmp_path).job
    assert (default.gpus, default.runner) == (1, "thread")
    assert plan(tmp_path, job_gpus=8).job.cluster_gpus == 8  # a pool that holds the job
    # ppo-arith's 128 samples do not divide over 3 ranks: refused before anything runs, naming the field
    with pytest.raises(BadInput, match=r"^ppo\.batch_size: .*3 ranks"):
        plan(tmp_path, job_gpus=3)


def test_a_bad_name_is_bad_input_naming_the_field(tmp_path):
    with pytest.raises(BadInput, match=r"job\.name"):
        plan(tmp_path, job_name="Not A Name")


def test_the_cli_passes_them_through(monkeypatch, capsys, tmp_path):
    """`rlhfops nightly --tenant --name` reach the check (stopped there by a tripwire: no server is started)."""
    from cli_helpers import run_cli_output

    import flows.nightly_check as nc

    seen = {}

    class Checked(Exception):
        pass

    def check(**kw):
        seen.update(kw)
        raise Checked

    monkeypatch.setattr(nc, "check_nightly", check)
    with pytest.raises(Checked):
        run_cli_output(["nightly", "--quick", "--job-config", "configs/ppo-arith.yaml", "--tenant", "umbrella",
                        "--name", "arith-first", "--job-gpus", "2", "--out", tmp_path / "o"], capsys, monkeypatch)
    assert (seen["job_tenant"], seen["job_name"], seen["job_gpus"]) == ("umbrella", "arith-first", 2)
    # without --cache-dir: the warm-start cache a config without cache_dir uses (RLHFOPS_CACHE_DIR), not runs/.cache
    assert seen["cache_dir"] == str((tmp_path / "warm").resolve())


@pytest.fixture(autouse=True)
def _cache_env(monkeypatch, tmp_path):
    monkeypatch.setenv("RLHFOPS_CACHE_DIR", str(tmp_path / "warm"))
