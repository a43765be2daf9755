"""Plots of experiment results (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def plot_summary(summary: pd.DataFrame, out_dir: Path) -> list[Path]:
    """One figure per experiment: JCT (mean ± sd over seeds), wasted/saved compute and detection
    quality per scheduler; for multi-variant experiments, each metric against the variant."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for exp, df in summary.groupby("experiment", sort=False):
        variants = list(dict.fromkeys(df["variant"]))
        fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
        if len(variants) == 1:
            x = np.arange(len(df))
            axes[0].bar(x, df["jct_mean"], yerr=df["jct_std"], color="tab:blue", capsize=3)
            axes[0].set_ylabel("mean JCT (min)")
            axes[1].bar(x - 0.2, df["wasted_frac"] * 100, 0.4, label="wasted")
            axes[1].bar(x + 0.2, df["saved_frac"] * 100, 0.4, label="saved")
            axes[1].set_ylabel("% of GPU-minutes")
            axes[1].legend()
            for off, col in ((-0.27, "precision"), (0.0, "recall"), (0.27, "fpr")):
                axes[2].bar(x + off, df[col].fillna(0) * 100, 0.27, label=col)
            axes[2].set_ylabel("%")
            axes[2].legend()
            for ax in axes:
                ax.set_xticks(x, df["scheduler"], rotation=40, ha="right", fontsize=8)
        else:
            xs = np.arange(len(variants))
            for sched, g in df.groupby("scheduler", sort=False):
                g = g.set_index("variant").reindex(variants)
                axes[0].errorbar(xs, g["jct_mean"], yerr=g["jct_std"], marker="o", capsize=3, label=sched)
                axes[1].plot(xs, g["wasted_frac"] * 100, marker="o", label=sched)
                if g["stopped"].fillna(0).sum() > 0:
                    axes[2].plot(xs, g["precision"] * 100, marker="o", label=f"{sched} precision")
                    axes[2].plot(xs, g["recall"] * 100, marker="x", ls="--", label=f"{sched} recall")
            axes[0].set_ylabel("mean JCT (min)")
            axes[1].set_ylabel("wasted GPU-minutes (%)")
            axes[2].set_ylabel("%")
            for ax in axes:
                ax.set_xticks(xs, variants, rotation=20, ha="right", fontsize=8)
                ax.legend(fontsize=7)
        axes[0].set_title("Job completion time")
        axes[1].set_title("Compute")
        axes[2].set_title("Detection of reward hacking")
        fig.suptitle(f"{exp}: {len(df)} scheduler/variant rows, mean over {int(df['n_seeds'].iloc[0])} seeds")
        fig.tight_layout()
        path = out_dir / f"{exp}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
