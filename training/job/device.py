"""Where a job's tensors live and in what precision: the config's `device` and `dtype` made concrete.

- `device: auto | cpu | cuda | cuda:N` (auto: CUDA when present). A job holding GPU slot i with `auto` uses CUDA
  device i modulo the visible ones (`resolve_device(spec, slot=i)`); without a slot index, device 0 (the process's
  CUDA_VISIBLE_DEVICES picks which card that is).
- `dtype: float32 | bfloat16`. With bfloat16 the trainable actor and critic keep float32 weights and AdamW state
  (master weights: an update smaller than bfloat16's resolution would be rounded away) and run their forward
  passes under `torch.autocast(..., bfloat16)`; the frozen reference and reward model are stored in bfloat16. Every
  log-softmax, log-prob, value, reward, advantage and loss is computed in float32 (the engine and scorers cast
  logits and heads with `.float()`, the update does the same), so the PPO ratio exp(lp - old_lp) is not a ratio of
  two rounded numbers.

The value checks (`training.job.config.check_device_text`, `DTYPES`) need no torch, so a bad config is refused before
torch is imported; `resolve_device` imports it and refuses a CUDA device that is not there (BadInput naming the
field), where it can without torch (`cuda_absent_reason`).
"""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import BadInput
from training.job.config import check_device_text

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16")


def cuda_absent_reason() -> str | None:
    """Why CUDA cannot be present, found without importing torch (which takes seconds): a CPU-only torch build, or
    on Linux no NVIDIA, WSL or ROCm device node. None: it may be present (torch decides)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        build = version("torch")
    except PackageNotFoundError:
        return "torch is not installed"
    if "+cpu" in build:
        return f"torch {build} is a CPU-only build"
    if sys.platform == "linux" and not any(Path(p).exists() for p in ("/dev/nvidiactl", "/dev/dxg", "/dev/kfd")):
        return "no GPU driver device (/dev/nvidiactl) on this machine"
    return None


def check_named_cuda(spec: str, field: str = "device") -> None:
    """A device asked for by name (`cuda`, `cuda:N`) is checked before any slot is taken or model built (BadInput
    naming `field` where it is absent); `auto` and `cpu` import nothing here."""
    if spec.startswith("cuda"):
        resolve_device(spec, field=field)


def resolve_device(spec: str = "auto", slot: int | None = None, field: str = "device") -> torch.device:
    """The torch device for `spec`. `auto`: CUDA device (slot mod visible devices) when CUDA is present, else the
    CPU; `cuda`/`cuda:N` where CUDA is absent, or N beyond the visible devices: BadInput naming `field` (where
    `cuda_absent_reason` says so, before torch is imported)."""
    check = check_device_text(spec, field) if spec else "auto"
    absent = cuda_absent_reason() if check.startswith("cuda") else None
    if absent:
        raise BadInput(f"{field}: '{spec}' asked for, but this machine has no CUDA device ({absent}); use "
                       "device: cpu or auto")
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if check == "cpu":
        return torch.device("cpu")
    if check == "auto":
        return torch.device("cuda", (slot or 0) % visible) if visible else torch.device("cpu")
    if not visible:
        raise BadInput(f"{field}: '{spec}' asked for, but this machine has no CUDA device torch can use "
                       f"(torch {torch.__version__}); use device: cpu or auto")
    index = int(check.split(":")[1]) if ":" in check else (slot or 0) % visible
    if index >= visible:
        raise BadInput(f"{field}: '{spec}' asked for, but only {visible} CUDA device(s) are visible "
                       f"(cuda:0..cuda:{visible - 1})")
    return torch.device("cuda", index)


def torch_dtype(name: str) -> torch.dtype:
    import torch

    if name not in DTYPES:
        raise BadInput(f"dtype: {name!r} is not one of {', '.join(DTYPES)}")
    return torch.bfloat16 if name == "bfloat16" else torch.float32


def autocast(device: torch.device, dtype: str) -> AbstractContextManager:
    """The forward passes' precision: `torch.autocast` to bfloat16 on `device`, or nothing for float32. Autocast is
    per thread: the scorer thread of intra-step streaming runs the frozen bfloat16 models as they are and the critic
    in float32."""
    import torch

    if dtype == "float32":
        return nullcontext()
    return torch.autocast(device.type, dtype=torch_dtype(dtype))


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's weights (CPU for a model without any)."""
    import torch

    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def gpu_memory_bytes(cfg: Any) -> float:
    """Planned GPU memory of one training process at the config's dtype: `training.job.config.train_memory_bytes`, the
    one estimate (its caches and activations at the dtype's width, float32 weights and optimiser state)."""
    from training.job.config import train_memory_bytes

    return train_memory_bytes(cfg)


def check_gpu_memory(cfg: Any, device: torch.device) -> None:
    """On a CUDA device, BadInput before any model is built when `gpu_memory_bytes(cfg)` exceeds the device's free
    memory (`torch.cuda.mem_get_info`); nothing on the CPU (`check_train_memory` covers RAM)."""
    import torch

    if device.type != "cuda":
        return
    free, total = torch.cuda.mem_get_info(device)
    need = gpu_memory_bytes(cfg)
    if need > free:
        gib = 1024 ** 3
        raise BadInput(f"device: training needs about {need / gib:.1f} GiB of GPU memory but {device} has "
                       f"{free / gib:.1f} GiB free of {total / gib:.1f} GiB; lower hidden_size, num_layers, "
                       "batch_size or max_new_tokens, or use dtype: bfloat16")


class DeviceOutOfMemory(RuntimeError):
    """A training step ran out of device memory (`torch.OutOfMemoryError`). The job ends FAILED with this message
    as its reason; the run directory keeps its last checkpoint (a resume continues from it with a smaller setting)."""


def out_of_memory(err: BaseException, device: Any, step: int, last_checkpoint: Any) -> DeviceOutOfMemory:
    """The `DeviceOutOfMemory` for an out-of-memory error in step `step` (1-based), its allocator's cached blocks
    returned to the device first (the failed step's activations are garbage by now)."""
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.empty_cache()
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    kept = f"the last checkpoint ({last_checkpoint.name}) is kept" if last_checkpoint else "no checkpoint was saved yet"
    return DeviceOutOfMemory(f"out of memory on {device} in step {step} ({first}); {kept}; lower ppo.batch_size, "
                             "ppo.max_new_tokens or the model size, or use dtype: bfloat16")
