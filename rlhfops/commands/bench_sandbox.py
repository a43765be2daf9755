"""`rlhfops bench sandbox`: the tenant-code sandbox's start-up per worker and its cost per step on the arithmetic
job (training/benches/sandbox.py)."""

from __future__ import annotations

from pathlib import Path

import typer


def register_bench(bench_app: typer.Typer) -> None:
    @bench_app.command("sandbox")
    def bench_sandbox_cmd(
        config: Path = typer.Option(Path("configs/ppo-arith.yaml"), "--config", help="the job whose reward is timed"),
        runs: int = typer.Option(5, "--runs", help="fresh pools per mode for the start-up figure"),
        steps: int = typer.Option(3, "--steps", help="timed PPO steps per round (after one warm-up step); 0: none"),
        rounds: int = typer.Option(2, "--rounds", help="rounds per mode, alternating"),
        sets: list[str] = typer.Option([], "--set", help="config override KEY=VALUE (repeatable)"),
        out: Path = typer.Option(None, "--out", help="write the JSON here"),
    ) -> None:
        """Worker start-up with and without the sandbox, and the step time and reward phase of a few PPO steps of
        the arithmetic job with its reward run as sandboxed and unsandboxed tenant code."""
        from common.errors import BadInput
        from common.validate import check_out_file
        from rlhfops.commands.bench import write_json
        from rlhfops.console import make_console
        from training.benches.sandbox import bench_sandbox
        from training.inputs import sandbox

        if runs < 1 or steps < 0 or rounds < 1:
            raise BadInput("bench sandbox: need --runs >= 1, --steps >= 0, --rounds >= 1")
        check_out_file(out, "out")
        sandbox.require()  # the sandboxed half needs a working bwrap (exit 2 with the line that says how)
        overrides = {}
        for item in sets:
            key, eq, value = item.partition("=")
            if not eq:
                raise BadInput(f"--set {item!r}: write KEY=VALUE")
            import yaml

            overrides[key] = yaml.safe_load(value)
        console = make_console()
        result = bench_sandbox(config, runs, steps, rounds, overrides, say=console.print)
        for mode, s in result["startup"].items():
            console.print(f"start-up {mode:>5}: median {s['median']:.3f}s (IQR {s['q1']:.3f}-{s['q3']:.3f}, "
                          f"{s['n']} runs)")
        if "per_step" in result:
            ps = result["per_step"]
            for mode in ("bwrap", "none"):
                st, rf = ps[mode]["step_s"], ps[mode]["reward_fn_s"]
                console.print(f"step {mode:>5}: median {st['median']:.2f}s (IQR {st['q1']:.2f}-{st['q3']:.2f}), "
                              f"reward_fn {rf['median'] * 1000:.1f}ms (IQR {rf['q1'] * 1000:.1f}-"
                              f"{rf['q3'] * 1000:.1f}), {st['n']} steps")
            console.print(f"sandbox's extra reward time per step: {ps['reward_fn_extra_s'] * 1000:+.1f}ms = "
                          f"{100 * ps['share_of_step']:+.2f}% of the step (goal: at most 5%)")
        console.print(f"load average (1 min): {result['load_average_1min_before']:.2f} before, "
                      f"{result['load_average_1min_after']:.2f} after, on {result['cpus']} CPUs")
        write_json(result, out)
