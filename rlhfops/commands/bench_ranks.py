"""`rlhfops bench ranks`: samples/s of two ranks (1 torch thread each) against one process with 1 and with 2
threads at equal global batch, per config; colocated against `placement: reward_apart` under intra-step streaming;
optionally time to the held-out target at world 1 and 2 (training/benches/ranks.py, docs/ranks.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from common.errors import BadInput

THROUGHPUT_CONFIGS = [Path("configs/ppo-arith.yaml"), Path("configs/grpo-arith.yaml")]
PLACEMENT_CONFIGS = [Path("configs/ppo-bench.yaml"), Path("configs/grpo-bench.yaml")]


def _ratio(r: dict) -> str:
    return f"{r['median']:.2f}x [{r['min']:.2f}-{r['max']:.2f}]"


def _spread(r: dict, digits: int = 2) -> str:
    return f"{r['median']:.{digits}f} [{r['min']:.{digits}f}-{r['max']:.{digits}f}]"


def register_bench(bench_app: typer.Typer) -> None:
    @bench_app.command("ranks")
    def bench_ranks_cmd(
        quick: bool = typer.Option(False, "--quick", help="1 repeat of 1 timed step, responses capped at 32 tokens "
                                   "(a check that it runs, not a figure)"),
        config: list[Path] = typer.Option(THROUGHPUT_CONFIGS, "--config",
                                          help="a throughput config (repeatable; default ppo-arith and grpo-arith)"),
        placement_config: list[Path] = typer.Option(
            PLACEMENT_CONFIGS, "--placement-config",
            help="a config for colocated vs reward_apart (repeatable; default ppo-bench and grpo-bench)"),
        steps: int = typer.Option(None, "--steps", help="timed steps per run after 1 warm-up step (default 4; "
                                  "--quick 1)"),
        placement_steps: int = typer.Option(None, "--placement-steps", help="timed steps of a placement run (default "
                                            "20: its steps are short; --quick 2)"),
        repeats: int = typer.Option(None, "--repeats", help="rounds over the runs (default 3; --quick 1)"),
        to_target: Path = typer.Option(None, "--to-target", help="also time world 1 and world 2 to this config's "
                                       "held-out target (long; e.g. configs/ppo-arith.yaml)"),
        target_steps: int = typer.Option(60, "--target-steps", help="steps of each --to-target run"),
        out: Path = typer.Option(None, "--out", help="write the JSON here (docs/bench/ranks.json for the full run)"),
    ) -> None:
        """Throughput of 2 ranks against 1 process (1 and 2 threads), PPO and GRPO, round-robin over repeats; the
        scorer apart against colocated under intra-step streaming; the load average before and after each run."""
        from rich.table import Table

        from common.validate import check_out_file
        from rlhfops.commands.bench import write_json
        from rlhfops.console import make_console, progress
        from training.distributed.plan import check_world
        from training.job.config import load_config

        steps = steps if steps is not None else (1 if quick else 4)
        repeats = repeats if repeats is not None else (1 if quick else 3)
        placement_steps = placement_steps if placement_steps is not None else (2 if quick else 20)
        for name, n in (("--steps", steps), ("--placement-steps", placement_steps)):
            if not 1 <= n <= 100:
                raise BadInput(f"{name}: need 1 to 100 timed steps")
        if not 1 <= repeats <= 20:
            raise BadInput("--repeats: need 1 to 20")
        if not 1 <= target_steps <= 10_000:
            raise BadInput("--target-steps: need 1 to 10000")
        check_out_file(out, "out")
        configs = {p.stem: load_config(p) for p in config}
        placed = {p.stem: load_config(p).model_copy(update={"placement": "reward_apart", "engine": "transformers"})
                  for p in placement_config}
        for cfg in configs.values():
            check_world(cfg.model_copy(update={"sampling": "keyed", "engine": "transformers"}), 2)
        for cfg in placed.values():
            check_world(cfg, 1)
        target = load_config(to_target) if to_target is not None else None
        if target is not None and target_steps < target.eval_every:
            raise BadInput(f"--target-steps: {target_steps} steps hold no held-out gate of {to_target} (eval_every "
                           f"{target.eval_every}); give at least {target.eval_every}")
        from training.benches.ranks import PLACEMENT, THROUGHPUT, bench_ranks

        total = repeats * (len(THROUGHPUT) * len(configs) + len(PLACEMENT) * len(placed))
        console = make_console()
        with progress(console, "runs (warm-up + timed steps each)", total=total) as shown:
            done = [0]

            def step(label):
                done[0] += 1
                shown.update(done[0])

            def target_step(label, at):  # the long part: world 1's steps, then world 2's
                if label == "world1-1thread" and at == 1:
                    shown.stage("time to target: world 1's steps, then world 2's", 2 * target_steps)
                shown.advance()

            result = bench_ranks(configs, placed, steps, repeats, quick, target, target_steps, progress=step,
                                 placement_steps=placement_steps, target_progress=target_step)
        write_json(result, out)
        table = Table(title=f"rlhfops bench ranks: samples/s, median \\[min-max] over {repeats} repeat(s) of {steps} "
                            "timed step(s); overlap none, keyed draws")
        for col in ("config", "world 1, 1 thread", "world 1, 2 threads", "world 2, 1 thread each",
                    "2 independent processes (ceiling)", "2 ranks / 1 thread", "2 ranks / 2 threads",
                    "2 ranks / ceiling", "collective wait share", "goal 1.8x"):
            table.add_column(col, justify="right")
        for name, t in result["throughput"].items():
            s, r = t["samples_per_s"], t["ratios"]
            idle = t["world2_idle_share"]
            g = t["goal"]
            table.add_row(f"{name} ({t['algorithm']}, B {t['batch_size']})", _spread(s["world1-1thread"]),
                          _spread(s["world1-2threads"]), _spread(s["world2-1thread"]),
                          _spread(s["two-independent-1thread"]),
                          _ratio(r["world2_over_world1_1thread"]), _ratio(r["world2_over_world1_2threads"]),
                          _ratio(r["world2_over_ceiling"]),
                          f"{idle['median']:.0%}" if idle else "n/a",
                          "met" if g["met_1thread"] and g["ahead_of_2threads"] else
                          f"short by {g['short_of_1.8x_by']:.2f}x" if not g["met_1thread"] else "behind 2 threads")
        console.print(table)
        place = Table(title=f"placement under intra-step streaming (one policy process): step s, median \\[min-max] "
                            f"over {repeats} repeat(s) of {placement_steps} timed steps")
        for col in ("config", "sequential", "intra colocated", "intra reward_apart", "intra speedup colocated",
                    "intra speedup reward_apart", "apart / colocated"):
            place.add_column(col, justify="right")
        for name, p in result["placement"].items():
            s = p["step_s"]
            place.add_row(f"{name} ({p['algorithm']})", _spread(s["none/colocated"]), _spread(s["intra/colocated"]),
                          _spread(s["intra/reward_apart"]), _ratio(p["intra_speedup_colocated"]),
                          _ratio(p["intra_speedup_reward_apart"]), _ratio(p["apart_over_colocated_step_speedup"]))
        console.print(place)
        tt = result["time_to_target"]
        if tt is not None:
            c = tt["curves"]
            at = {k: "not reached" if v["time_to_target_s"] is None else f"{v['time_to_target_s']:.0f} s"
                  for k, v in c.items()}
            speed = "n/a" if tt["speedup"] is None else f"{tt['speedup']:.2f}x"
            console.print(f"time to held-out target {tt['target']:.3f}: world 1 {at['world1-1thread']}, world 2 "
                          f"{at['world2-1thread']} (speedup {speed}); final gold "
                          f"{c['world1-1thread']['final_gold']:.3f} / {c['world2-1thread']['final_gold']:.3f}")
        console.print(f"load average before {result['load']['before']}, after {result['load']['after']} "
                      f"({result['machine']['cpus']} CPUs); {result['wall_s']:.0f} s")
        if out is not None:
            console.print(f"wrote {out}")
