"""The sweep report: a markdown table of every trial and three plots (quality vs GPU-hours with the Pareto front,
parallel coordinates of the varied params vs the objective, held-out curves of pruned vs completed trials).
Reads the runner's summary only (sweeps/runner.py); matplotlib, no Prefect or MLflow."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def pareto_front(points: list[tuple[float, float]], maximize: bool = True) -> list[int]:
    """Indices of the points (cost, quality) no other point beats: cheaper-or-equal and at least as good, one of
    them strictly. Sorted by cost."""
    sign = 1.0 if maximize else -1.0
    front = []
    for i, (c, q) in enumerate(points):
        dominated = any((c2 <= c and sign * q2 >= sign * q) and (c2 < c or sign * q2 > sign * q)
                        for j, (c2, q2) in enumerate(points) if j != i)
        if not dominated:
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return "—"
        return f"{v:.4g}"
    return "—" if v is None else str(v)


def write_report(summary: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write `sweep.md` and the plots into `out_dir`; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trials = summary["trials"]
    maximize = summary["direction"] == "maximize"
    colors = {"completed": "tab:blue", "pruned": "tab:orange", "failed": "tab:red"}
    files: list[Path] = []

    scored = [t for t in trials if math.isfinite(t["objective"])]
    pts = [(t["gpu_seconds"] / 3600, t["objective"]) for t in scored]
    front = pareto_front(pts, maximize)
    fig, ax = plt.subplots(figsize=(6, 4))
    for t, (x, y) in zip(scored, pts, strict=True):
        ax.errorbar(x, y, yerr=t["objective_se"] if math.isfinite(t["objective_se"]) else None, fmt="o",
                    color=colors[t["state"]], alpha=0.8)
        ax.annotate(str(t["number"]), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if front:
        ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "k--", lw=1, label="Pareto front")
    for state, c in colors.items():
        ax.scatter([], [], color=c, label=state)
    ax.set_xlabel("GPU-hours")
    ax.set_ylabel("held-out score at the kept checkpoint")
    ax.set_title(f"{summary['name']}: quality vs cost")
    ax.legend(fontsize=7)
    fig.tight_layout()
    files.append(out / "pareto.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)

    params = sorted({k for t in trials for k in t["params"]})
    if params and scored:
        axes_names = params + ["objective"]
        fig, ax = plt.subplots(figsize=(1.8 * len(axes_names) + 2, 4))
        cols = []
        for name in axes_names:
            raw = [t["objective"] if name == "objective" else t["params"].get(name) for t in scored]
            numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw)
            if numeric:
                vals = [float(v) for v in raw]
                if name != "objective" and min(vals) > 0 and max(vals) / min(vals) > 20:
                    vals = [math.log10(v) for v in vals]
                    axes_names[axes_names.index(name)] = f"log10 {name}"
            else:
                levels = sorted({repr(v) for v in raw})
                vals = [float(levels.index(repr(v))) for v in raw]
            lo, hi = min(vals), max(vals)
            cols.append([(v - lo) / (hi - lo) if hi > lo else 0.5 for v in vals])
        cmap = plt.get_cmap("viridis")
        objs = cols[-1]
        for i, t in enumerate(scored):
            ax.plot(range(len(axes_names)), [c[i] for c in cols], color=cmap(objs[i]), alpha=0.8,
                    ls="--" if t["state"] == "pruned" else "-")
        ax.set_xticks(range(len(axes_names)))
        ax.set_xticklabels(axes_names, fontsize=8)
        ax.set_yticks([])
        ax.set_title("parallel coordinates (scaled per axis; dashed: pruned; colour: objective)")
        fig.tight_layout()
        files.append(out / "parallel_coordinates.png")
        fig.savefig(files[-1], dpi=110)
        plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for t in trials:
        if t["curve"]:
            xs, ys = zip(*t["curve"], strict=True)
            ax.plot(xs, ys, color=colors[t["state"]], alpha=0.7, marker="." if t["state"] == "pruned" else None)
    for state, c in colors.items():
        ax.plot([], [], color=c, label=state)
    ax.set_xlabel("step")
    ax.set_ylabel("held-out gate score")
    ax.set_title("learning curves: pruned vs completed")
    ax.legend(fontsize=7)
    fig.tight_layout()
    files.append(out / "curves.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)

    best = summary.get("best")
    lines = [f"# Sweep {summary['name']} ({summary['tenant']})", "",
             f"{summary['trials_done']} of {summary['target_trials']} trials done: "
             f"{summary['trials_pruned']} pruned ({summary['pruner']}), {summary['trials_failed']} failed; "
             f"{summary['gpu_seconds'] / 3600:.4f} GPU-hours.", ""]
    if summary.get("budget_stop"):
        lines += [f"**Budget stop:** {summary['budget_stop']}; no new trials were started.", ""]
    if best:
        lines += [f"Best: trial {best['number']}, held-out {best['objective']:.4f} ± {best['objective_se']:.4f} at "
                  f"step {best['best_step']} ({', '.join(f'{k}={_fmt(v)}' for k, v in best['params'].items())}).", ""]
    head = ["trial", "state", *params, "objective", "SE", "best step", "pruned at", "steps", "GPU-s"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in trials:
        row = [t["number"], t["state"], *[t["params"].get(p) for p in params], t["objective"], t["objective_se"],
               t["best_step"], t["pruned_at"], t["steps"], t["gpu_seconds"]]
        lines.append("| " + " | ".join(_fmt(v) for v in row) + " |")
    lines += ["", "Front (no trial is both cheaper and better): trials "
              + ", ".join(str(scored[i]["number"]) for i in front) if front else "", ""]
    lines += [f"![{p.stem}]({p.name})" for p in files]
    md = out / "sweep.md"
    md.write_text("\n".join(lines) + "\n")
    return [md, *files]
