"""The job config's `device` and `dtype` (training/job/device.py): values refused before torch is imported, a CUDA
device that is not there refused in one line before any model is built, the slot -> device rule, the GPU memory check,
bfloat16 training on the CPU in every overlap mode, and a CUDA out-of-memory ending the job FAILED with its
checkpoint kept and its slot released (the error injected on the CPU)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import yaml
from tiny_job import tiny_config

from common.errors import BadInput
from training.job import device as D

REPO = Path(__file__).resolve().parents[2]
FIELDS = ("reward_mean", "kl", "entropy", "grad_norm", "clip_frac", "approx_kl", "adv_std", "loss_policy",
          "loss_value", "response_len_mean")


def _cli(*args: str, importtime: bool = False) -> tuple[int, list[str], float, str]:
    """`rlhfops ARGS` in a fresh interpreter: exit code, non-empty stderr lines (import-time lines apart), seconds, the
    raw stderr."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "rlhfops.cli", *args]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    seconds = time.perf_counter() - t
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("import time:")]
    return proc.returncode, lines, seconds, proc.stderr


def _imported(stderr: str) -> set[str]:
    """Top-level packages `-X importtime` says were imported."""
    return {ln.rsplit("|", 1)[-1].strip().split(".")[0] for ln in stderr.splitlines() if ln.startswith("import time:")}


# ---------------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("flag,value", [("--device", "tpu"), ("--device", "cuda:x"), ("--dtype", "float16")])
def test_an_unknown_value_exits_2_naming_the_field_before_torch_is_imported(tmp_path, flag, value):
    code, lines, _s, raw = _cli("train", "configs/ppo-tiny.yaml", flag, value, "--out", str(tmp_path / "run"),
                                importtime=True)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {flag.removeprefix('--')}: ") and value in lines[0], lines
    imported = _imported(raw)
    assert "pydantic" in imported  # the check does see imports
    assert "torch" not in imported


def test_an_unknown_device_in_the_config_file_names_the_field(tmp_path):
    raw = yaml.safe_load((REPO / "configs" / "ppo-tiny.yaml").read_text())
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**raw, "device": "gpu0"}))
    code, lines, _s, _raw = _cli("train", str(path), "--out", str(tmp_path / "run"))
    assert code == 2 and len(lines) == 1 and "device" in lines[0] and "gpu0" in lines[0], lines


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA")
@pytest.mark.parametrize("how", ["flag", "config"])
def test_cuda_where_there_is_none_exits_2_in_one_line_before_torch_is_imported(tmp_path, how):
    """The issue's bar is under 5 s (2.4 s measured here unloaded); a timed assertion fails under a loaded CI, so the
    test checks what makes it fast: the refusal comes before torch (4-16 s to import here) is imported."""
    args = ["configs/ppo-tiny.yaml", "--device", "cuda"]
    if how == "config":
        raw = yaml.safe_load((REPO / "configs" / "ppo-tiny.yaml").read_text())
        (tmp_path / "cuda.yaml").write_text(yaml.safe_dump({**raw, "device": "cuda", "dtype": "bfloat16"}))
        args = [str(tmp_path / "cuda.yaml")]
    code, lines, _seconds, raw = _cli("train", *args, "--out", str(tmp_path / "run"), importtime=True)
    assert code == 2 and len(lines) == 1, lines  # one line: no traceback
    assert lines[0].startswith("error: device: 'cuda' asked for") and "no CUDA device" in lines[0], lines
    assert "torch" not in _imported(raw)
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA")
def test_bench_oppo_device_flag_overrides_the_config():
    code, lines, _s, _raw = _cli("bench", "oppo", "--config", "configs/ppo-tiny.yaml", "--device", "cuda:0")
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: --device: 'cuda:0' asked for"), lines


def test_the_job_request_carries_device_and_dtype_into_the_config():
    from training.job.request import parse_request

    request = parse_request({"config": str(REPO / "configs" / "ppo-tiny.yaml"), "device": "cpu",
                             "dtype": "bfloat16"})
    cfg = request.checked().config
    assert (cfg.device, cfg.dtype) == ("cpu", "bfloat16")
    default = parse_request({"config": str(REPO / "configs" / "ppo-tiny.yaml")}).checked().config
    assert (default.device, default.dtype) == ("auto", "float32")
    with pytest.raises(BadInput, match=r"^device: 'tpu' is not a device"):
        parse_request({"device": "tpu"})


# ------------------------------------------------------------------------------------------- slot -> device rule
def _fake_cuda(monkeypatch, visible: int) -> None:
    monkeypatch.setattr(D, "cuda_absent_reason", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: visible > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)


def test_auto_takes_the_slot_modulo_the_visible_devices(monkeypatch):
    _fake_cuda(monkeypatch, 4)
    assert [str(D.resolve_device("auto", slot)) for slot in (None, 0, 1, 5, 11)] == [
        "cuda:0", "cuda:0", "cuda:1", "cuda:1", "cuda:3"]
    assert str(D.resolve_device("cuda", 6)) == "cuda:2"  # cuda without an index: the slot picks it too
    assert str(D.resolve_device("cuda:3", 6)) == "cuda:3"  # a named index is kept
    assert str(D.resolve_device("cpu", 2)) == "cpu"
    with pytest.raises(BadInput, match=r"^device: 'cuda:4' asked for, but only 4 CUDA device"):
        D.resolve_device("cuda:4")


def test_auto_is_the_cpu_without_cuda(monkeypatch):
    _fake_cuda(monkeypatch, 0)
    assert str(D.resolve_device("auto", 3)) == "cpu"
    with pytest.raises(BadInput, match=r"^device: 'cuda' asked for, but this machine has no CUDA device"):
        D.resolve_device("cuda")


def test_the_gpu_memory_check_refuses_a_job_larger_than_the_free_memory(monkeypatch):
    from training.job.config import TrainConfig, train_memory_bytes

    cfg = TrainConfig.model_validate({"device": "cuda", "dtype": "float32"})
    need = train_memory_bytes(cfg)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(need * 0.9), int(need * 4)))
    with pytest.raises(BadInput, match=r"^device: training needs about .* GiB of GPU memory but cuda:0 has"):
        D.check_gpu_memory(cfg, torch.device("cuda", 0))
    D.check_gpu_memory(cfg, torch.device("cpu"))  # the CPU is check_train_memory's
    # bfloat16 halves the caches and activations but not the float32 weights and Adam moments of the trainable
    # models: the estimate falls, but by less than half
    bf16 = cfg.model_copy(update={"dtype": "bfloat16"})
    assert need / 2 < D.gpu_memory_bytes(bf16) < need == D.gpu_memory_bytes(cfg)
    D.check_gpu_memory(bf16, torch.device("cuda", 0))  # 0.9 x the float32 figure is enough for it here


# ---------------------------------------------------------------------------------------------- bfloat16 on CPU
def _yaml_copy(tmp_path, cache, **over) -> Path:
    """A copy of configs/ppo-tiny.yaml with `over` set, at test size (the tiny job's sections)."""
    raw = yaml.safe_load((REPO / "configs" / "ppo-tiny.yaml").read_text())
    small = tiny_config(cache, seed=3, n_heldout_prompts=8).model_dump(mode="json")
    for section in ("policy", "reward", "task", "ppo", "oppo"):
        raw[section] = {**raw.get(section, {}), **{k: small[section][k] for k in small[section]}}
    raw.update({"cache_dir": str(cache), "steps": 4, "checkpoint_every": 2, "eval_every": 2, "eval_prompts": 8,
                **over})
    path = tmp_path / "ppo-tiny-bf16.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("overlap", ["none", "intra", "inter", "full"])
def test_bfloat16_on_the_cpu_trains_4_steps_with_finite_figures(cache, tmp_path, overlap):
    from training.job.config import load_config
    from training.trainer import Trainer

    cfg = load_config(_yaml_copy(tmp_path, cache, device="cpu", dtype="bfloat16"))
    assert (cfg.device, cfg.dtype) == ("cpu", "bfloat16")
    trainer = Trainer(cfg, overlap, tmp_path / "run")
    records = list(trainer.run())
    assert [r.step for r in records] == [1, 2, 3, 4]
    for r in records:
        for f in FIELDS:
            assert math.isfinite(getattr(r, f)), (r.step, f)
    assert all(math.isfinite(r.gold_eval) for r in records[1::2])
    # what lives where: trainable weights and AdamW state float32, frozen models bfloat16
    assert {p.dtype for p in trainer.actor.parameters()} == {torch.float32}
    assert {p.dtype for p in trainer.critic.parameters()} == {torch.float32}
    assert {p.dtype for p in trainer.ref.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in trainer.reward_model.parameters()} == {torch.bfloat16}
    moments = [s["exp_avg_sq"] for s in trainer.actor_opt.state.values()]
    assert moments and {m.dtype for m in moments} == {torch.float32}
    # and the checkpoint resumes on the CPU
    resumed = Trainer(cfg, overlap, tmp_path / "run")
    assert resumed.step == 4


def test_bfloat16_forward_is_a_bfloat16_computation(cache, tmp_path):
    """The actor's logits under the trainer's autocast equal a plain forward of the actor with bfloat16 weights
    (within bfloat16's rounding), and differ from the float32 forward: the setting reaches the arithmetic."""
    from training.job.config import load_config
    from training.trainer import Trainer

    trainer = Trainer(load_config(_yaml_copy(tmp_path, cache, device="cpu", dtype="bfloat16")), "none")
    ids = torch.tensor([trainer.tok.encode("Write a balanced sentence.")])
    with torch.no_grad():
        fp32 = trainer.actor(input_ids=ids).logits.float()
        with trainer.autocast():
            auto = trainer.actor(input_ids=ids).logits.float()
        bf16 = trainer.ref(input_ids=ids).logits.float()  # the same weights, stored in bfloat16
    assert auto.dtype == torch.float32
    assert not torch.equal(auto, fp32)
    assert torch.allclose(auto, fp32, atol=0.1)
    assert (auto - bf16).abs().max() < (fp32 - bf16).abs().max() + 0.05


# ------------------------------------------------------------------------------------------------ out of memory
def test_a_cuda_out_of_memory_ends_the_job_failed_with_its_checkpoint_kept_and_its_slot_released(cache, tmp_path,
                                                                                             monkeypatch):
    from training.job.config import load_config
    from training.job.lifecycle import JobHooks, JobSpec, run_job
    from training.trainer import Trainer

    real_step = Trainer.train_step

    def step_then_oom(self):
        if self.step == 2:  # the third step runs out of memory (as a CUDA allocation would)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_step(self)

    monkeypatch.setattr(Trainer, "train_step", step_then_oom)
    slot = threading.Semaphore(1)

    class OneSlot(JobHooks):
        @contextmanager
        def hold_slots(self, spec):
            assert slot.acquire(timeout=1)
            try:
                yield 0.0
            finally:
                slot.release()

    cfg = load_config(_yaml_copy(tmp_path, cache, device="cpu"))
    out = tmp_path / "job"
    outcome = run_job(JobSpec(tenant="t", name="oom", config=cfg, out_dir=out, overlap="none"), hooks=OneSlot())
    assert outcome.status.state.value == "FAILED"
    assert outcome.decision == "failed" and isinstance(outcome.error, D.DeviceOutOfMemory)
    assert "out of memory on cpu in step 3" in outcome.status.reason
    assert "the last checkpoint (step-000002) is kept" in outcome.status.reason
    assert [p.name for p in sorted((out / "checkpoints").glob("step-*"))] == ["step-000002"]
    assert [r["step"] for r in outcome.records] == [1, 2]
    assert slot.acquire(timeout=0)  # released


# ------------------------------------------------------------------------------------------ across devices
def test_a_checkpoint_from_another_device_scores_and_resumes_here(cache, tmp_path):
    """A checkpoint whose config says `device: cuda` and whose sampling generator is a CUDA one (as a GPU job writes
    it) is scored on this CPU machine (the same figures as scoring it on the CPU by name) and resumes here."""
    from training.job.config import load_config
    from training.trainer import Trainer, gold_eval, latest_checkpoint

    cfg = load_config(_yaml_copy(tmp_path, cache, device="cpu"))
    list(Trainer(cfg, "none", tmp_path / "run").run(2))
    ckpt = latest_checkpoint(tmp_path / "run")
    on_cpu = gold_eval(ckpt, device="cpu")
    raw = yaml.safe_load((ckpt / "config.yaml").read_text())
    (ckpt / "config.yaml").write_text(yaml.safe_dump({**raw, "device": "cuda"}))
    state = torch.load(ckpt / "state.pt", weights_only=False)
    state["rng"]["sample_device"] = "cuda"
    torch.save(state, ckpt / "state.pt")
    moved = gold_eval(ckpt)
    assert [r.gold_score for r in moved.records] == [r.gold_score for r in on_cpu.records]
    resumed = Trainer(cfg, "none", tmp_path / "run")
    assert resumed.step == 2 and str(resumed.device) == "cpu"
    (rec,) = list(resumed.run(3))
    assert rec.step == 3 and math.isfinite(rec.reward_mean)
