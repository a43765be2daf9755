"""`rlhfops bench sweep`'s runs: the same sweep and sampler seed four times in one process (`sweeps.bench.VARIANTS`),
each through `run_sweep` (MLflow tracking, a ledger at the default prices), then priced and compared by
`sweeps.bench`. Callable from a test or a flow; the CLI adds a progress display through `sweep`."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from common.errors import BadInput


def plain_sweep(spec, ledger, prune: bool) -> dict:
    """One of the bench's sweeps with no display: the runner's summary."""
    from tasks.sweep import run_sweep

    return run_sweep(spec, ledger, prune=prune, resume=False)


def run_bench(base, work: Path, sweep: Callable[..., dict] = plain_sweep) -> dict[str, dict]:
    """The four runs of the prepared spec `base` under `work` (emptied first), by variant: each run's record with
    its GPU-seconds at the unpruned run's prices and its savings against it. `sweep(spec, ledger, prune)` runs one
    sweep and returns the runner's summary. The warm starts (the SFT'd base policy, the proxy reward model) are
    built once, before every timing."""
    from infra.ledger import Ledger, load_prices
    from sweeps.bench import VARIANTS, compare, priced, run_record, variant_spec
    from sweeps.spec import trial_config
    from training.trainer import Trainer

    if base.storage:
        raise BadInput("spec: storage: the bench keeps its four studies in its work directory; remove storage from "
                       "the spec")
    shutil.rmtree(work, ignore_errors=True)
    Trainer(trial_config(base, {k: p.candidates()[0] for k, p in base.space.items()}), base.overlap, None)
    runs, dirs = {}, {}
    for label, pruner in VARIANTS.items():
        spec_run = variant_spec(base, label, work)
        load_before = os.getloadavg()[0]
        summary = sweep(spec_run, Ledger(load_prices()), pruner is not None)
        runs[label] = run_record(summary, spec_run, pruner is not None, [load_before, os.getloadavg()[0]])
        dirs[label] = spec_run.run_dir
    priced(runs, dirs, base.gpus_per_trial)
    compare(runs)
    return runs
