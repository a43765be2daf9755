"""`training.benches.oppo.markdown_table` on a result written by hand (two variants, two seeds)."""

from training.benches.oppo import markdown_table


def _mode(t_gold, t_gold_se, reached=2):
    return {"n_seeds": 2, "time_to_gold_s": t_gold, "time_to_gold_s_se": t_gold_se, "time_to_gold_s_reached": reached,
            "time_to_reward_s": None, "time_to_reward_s_se": None, "time_to_reward_s_reached": 0,
            "final_gold_heldout": 0.25, "final_gold_heldout_se": 0.05, "tokens_generated": 1000.4,
            "tokens_generated_se": 10.0, "tokens_trained": 900.0, "tokens_trained_se": 9.0, "is_ess_mean": 0.9991,
            "is_ess_min": 0.951, "stale_frac": 0.25}


def test_rows_say_what_each_figure_is():
    ratio = {"median": 2.0, "min": 1.5, "max": 2.5, "runs": [1.5, 2.5]}
    result = {
        "reference": "none", "variants": [{"label": "none"}, {"label": "full"}],
        "modes": {"none": _mode(10.0, 1.0), "full": _mode(5.0, 0.5, reached=1)},
        "ratios": {k: {"full": ratio} for k in ("speedup", "speedup_gold", "step_time_speedup")},
        "final_gold_gap": {"full": {"mean": 0.01, "se": 0.02, "runs": [0.0, 0.02]}},
        "steps": 30, "seeds": [0, 1], "gate_every": 5, "bench_wall_s": 100.0,
        "load": {"min_1m": 1.0, "max_1m": 2.0, "mean_1m": 1.5, "cpus": 2, "nice": -20, "autogroup": False},
    }
    lines = markdown_table(result).splitlines()
    assert lines[2] == ("| none | 10.0 ± 1.0 | 1.00x | not reached | 1.00x | 1.00x | 0.250 ± 0.050 | - | 1000 ± 10 | "
                        "900 ± 9 | 0.999 / 0.95 | 0.250 |")
    assert lines[3].startswith("| full | 5.0 ± 0.5 (1/2 seeds) | 2.00x [1.50-2.50] | not reached | 2.00x [1.50-2.50] |")
    assert "| +0.010 ± 0.020 |" in lines[3]
    assert lines[-1] == ("30 steps, seeds [0, 1], gate every 5 steps; load average (1 min) 1.0-2.0 (mean 1.5) on 2 "
                         "CPUs, this process at nice -20, autogroup off; bench wall 100 s.")
