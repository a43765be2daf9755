"""Profile OPPO steps under py-spy: where intra-step streaming gains and where its two threads wait.

Run a few steps of one overlap mode on the bench workload (configs/ppo-bench.yaml) after a warm-up, under py-spy,
twice: once sampling every thread whatever it does (`--idle`), once only the thread that holds the GIL (`--gil`):

    py-spy record --idle --threads --format raw -r 200 -o full-all.txt -- python -m training.benches.profile_step full 8
    py-spy record --gil  --threads --format raw -r 200 -o full-gil.txt -- python -m training.benches.profile_step full 8
    python -m training.benches.profile_step --summarise full-all.txt full-gil.txt

The summary splits each thread's samples into what it was doing (decode, scoring, PPO update, waiting on the
scorer queue or join, setup) and, per activity, the share of the wall time in which that thread held the GIL. The
two runs are separate processes on the same seed and workload, so their totals agree only to the sampling noise;
shares are taken within each run.
"""

from __future__ import annotations

import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

#: activity -> pattern on one py-spy frame (`Class.function (file.py:line)`); a stack is searched from the leaf up
#: and takes the first activity whose pattern matches one of its frames
ACTIVITIES = (
    ("waiting (scorer queue, join)",
     re.compile(r"^(Queue\.get|Thread\.join|Condition\.wait|Thread\._wait_for_tstate_lock) \((queue|threading)\.py")),
    ("scoring (ref, critic, reward prefill)", re.compile(r"^IncrementalScorer\.(begin|extend|_forward|_emit) ")),
    ("decoding (actor)", re.compile(r"^(TransformersEngine|VLLMEngine)\.(begin|decode) ")),
    ("PPO update", re.compile(r"^(Trainer|PPOUpdate)\._ppo_update ")),  # py-spy names the class by self or qualname
    ("rollout bookkeeping", re.compile(r"^rollout \(")),
)


def run(mode: str, steps: int, warmup: int = 3, config: str = "configs/ppo-bench.yaml") -> None:
    """`warmup` steps, then `steps` more of `mode` (the profiler samples them all; the warm-up shows as its own
    share of setup and early steps)."""
    from training.job.config import load_config
    from training.trainer import Trainer

    cfg = load_config(config)
    raw = cfg.model_dump(mode="json")
    raw["eval_every"] = 10**9
    trainer = Trainer(type(cfg).model_validate(raw), mode, out_dir=None, resume=False)
    for _ in range(warmup + steps):
        trainer.train_step()


#: main-thread samples outside `Trainer.train_step` (imports, building the models, stacks py-spy could not read)
OUTSIDE = "outside the steps"


def _activity(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, pattern in ACTIVITIES:
            if pattern.search(frame):
                return name
    return "other (setup, gates, Python)"


def _read(path: Path) -> dict[tuple[str, str], int]:
    """py-spy raw output (`thread (TID): NAME;frame;...;leaf COUNT`) -> samples per (thread, activity)."""
    out: Counter = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        head, *frames = stack.split(";")
        thread = "scorer thread" if head.endswith("oppo-scorer") else "main thread"
        in_step = thread == "scorer thread" or any(f.startswith("Trainer.train_step ") for f in frames)
        out[thread, _activity(frames) if in_step else OUTSIDE] += int(count)
    return dict(out)


def summarise(all_samples: Path, gil_samples: Path) -> str:
    """A markdown table over the samples taken inside training steps: per thread and activity, its share of that
    thread's samples (`--idle` run: every thread, running or waiting) and its share of the GIL-holding samples
    (`--gil` run: only the thread that holds the GIL is sampled)."""
    for path in (all_samples, gil_samples):
        if not path.is_file():
            raise SystemExit(f"error: {path}: no such file (record it with py-spy as the module docstring shows)")
    every, gil = _read(all_samples), _read(gil_samples)
    every = {k: n for k, n in every.items() if k[1] != OUTSIDE}
    gil = {k: n for k, n in gil.items() if k[1] != OUTSIDE}
    per_thread: dict[str, int] = defaultdict(int)
    for (thread, _), n in every.items():
        per_thread[thread] += n
    gil_total = sum(gil.values()) or 1
    rows = ["| thread | activity | share of the thread's samples | share of GIL-holding samples |",
            "| --- | --- | ---: | ---: |"]
    for key in sorted(set(every) | set(gil), key=lambda k: (k[0], -every.get(k, 0))):
        thread, activity = key
        share = every.get(key, 0) / (per_thread[thread] or 1)
        rows.append(f"| {thread} | {activity} | {100 * share:.1f}% | {100 * gil.get(key, 0) / gil_total:.1f}% |")
    main_total = per_thread.get("main thread", 0) or 1
    rows.append("")
    rows.append(f"GIL-holding samples / main-thread samples, inside the steps: {sum(gil.values()) / main_total:.2f} "
                "(near 1.0: one thread at a time ran Python, whatever the core count)")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--summarise"] and len(argv) == 3:
        print(summarise(Path(argv[1]), Path(argv[2])))
        return 0
    if len(argv) in (1, 2) and argv[0] in ("none", "intra", "inter", "full"):
        run(argv[0], int(argv[1]) if len(argv) == 2 else 8)
        return 0
    print("usage: python -m training.benches.profile_step MODE [STEPS] | --summarise ALL.txt GIL.txt", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
