"""`rlhfops detect TRACE.csv`: replay recorded runs through an early-stop detector.
`rlhfops detect --calibrate HEALTHY.csv`: fit the detector's threshold to a false-stop rate on a fleet."""

from __future__ import annotations

import math
from pathlib import Path

import typer
from rich.table import Table

from common.errors import BadInput
from rlhfops.console import make_console


def parse_params(items: list[str]) -> dict[str, float | int | str]:
    out: dict[str, float | int | str] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"--param '{item}': expected key=value, e.g. --param k=3")
        raw = raw.strip()
        try:
            out[key.strip()] = int(raw)
        except ValueError:
            try:
                out[key.strip()] = float(raw)
            except ValueError:
                out[key.strip()] = raw
            else:
                if not math.isfinite(out[key.strip()]):
                    raise BadInput(f"param {key.strip()}: {raw} is not a finite number") from None
    return out


def _pct(x: float) -> str:
    return "—" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


def quality_table(q: dict, title: str) -> Table:
    """Usefulness first (useful recall, false-stop rate), then the classic precision/recall/FPR."""
    table = Table(title=title)
    cols = ("runs", "hacking", "useful recall", "false-stop rate", "at a loss", "before peak", "at end", "quality kept",
            "compute saved", "delay", "precision", "recall", "FPR")
    for col in cols:
        table.add_column(col, justify="right")
    table.add_row(str(q["runs"]), str(q["hacking"]),
                  f"{_pct(q['useful_recall'])} ({q['useful']}/{q['hacking']})",
                  f"{_pct(q['false_stop_rate'])} ({q['fp']}/{q['healthy']})", f"{q['losing_stops']}/{q['fp']}",
                  str(q["early_stops"]), str(q["end_stops"]), f"{q['quality_kept']:+.3f}",
                  _pct(q["compute_saved"]), "—" if math.isnan(q["delay"]) else f"{q['delay']:.1f}",
                  _pct(q["precision"]), _pct(q["recall"]), _pct(q["fpr"]))
    return table


def register(app: typer.Typer) -> None:
    @app.command("detect")
    def detect_cmd(
        trace: Path = typer.Argument(None, help="trace CSV: run_id, step, eval_score [, eval_se, reward, loss, kl, "
                                     "entropy, grad_norm, response_len, tenant, label, progress, direction, "
                                     "gold_score]; any row order"),
        detector: str = typer.Option(None, "--detector", help="detector name (default: the platform default, "
                                     "see eval.detectors.DEFAULT_DETECTOR)"),
        param: list[str] = typer.Option([], "--param", help="detector parameter key=value (repeatable), "
                                        "e.g. --param k=3"),
        direction: str = typer.Option(None, "--direction", help="'higher' or 'lower': which way eval_score is "
                                      "better, for runs without a trace column 'direction' (default higher)"),
        out: Path = typer.Option(None, "--out", help="verdicts CSV (default: <TRACE>.verdicts.csv beside the trace)"),
        calibrate: Path = typer.Option(None, "--calibrate", help="healthy-run trace (rows with label 1 are left "
                                       "out), or a corpus directory (its tune split): fit the detector's threshold "
                                       "to --target-fsr and write it to --config"),
        target_fsr: float = typer.Option(0.02, "--target-fsr", help="false-stop rate on healthy runs to calibrate to"),
        config: Path = typer.Option(None, "--config", help="detector config to read and, with --calibrate, write "
                                    "(default: configs/detectors.yaml)"),
        prompts: Path = typer.Option(None, "--prompts", help="per-prompt gate records CSV: run_id, step, prompt_id, "
                                     "gold_score [, seed, proxy_score, response_len]; any row order. Runs the "
                                     "paired rule (default with --prompts; see eval/paired.py) on each run"),
    ) -> None:
        """Replay every run of a trace through a detector; write verdicts; print useful recall, false-stop rate,
        quality kept and precision/recall/FPR if labelled. With --prompts, the paired rule on per-prompt scores.
        With --calibrate, recalibrate instead."""
        from eval.detectors import DEFAULT_DETECTOR, make_detector  # any name in eval.registry.DETECTORS
        from eval.traces import check_columns, detection_quality, load_trace, runs_from_trace, verdicts

        if trace is None and calibrate is None:
            raise BadInput("TRACE: give a trace CSV to replay (or --calibrate HEALTHY.csv to recalibrate)")
        if not 0.0 <= target_fsr < 1.0:
            raise BadInput(f"--target-fsr {target_fsr}: must be in [0, 1)")
        if config is not None and calibrate is None and not config.is_file():
            raise BadInput(f"--config '{config}': no such file")
        if prompts is not None and calibrate is not None:
            raise BadInput("--prompts: not with --calibrate (the paired rule is set by its false-stop level alpha, "
                           "--param alpha=..., not fitted)")
        name = detector or (PAIRED_DETECTOR if prompts is not None else DEFAULT_DETECTOR)
        try:
            det = make_detector(name, config=config, **parse_params(param))
        except ValueError as err:
            raise BadInput(f"--detector/--param: {err}") from None
        reads_prompts = "prompt_scores" in det.needs
        if prompts is not None and not reads_prompts:
            raise BadInput(f"--detector {name}: reads means only; --prompts needs a detector that reads per-prompt "
                           f"scores ({PAIRED_DETECTOR})")
        if prompts is None and reads_prompts and calibrate is None:
            raise BadInput(f"--detector {name}: needs per-prompt scores: give --prompts PROMPTS.csv")
        console = make_console()
        if calibrate is not None:
            _calibrate(console, name, det, calibrate, direction, target_fsr, config, explicit=parse_params(param))
            return
        from common.validate import check_out_file

        check_out_file(out or trace.with_name(trace.stem + ".verdicts.csv"), "out")
        df = load_trace(trace)
        if prompts is not None:
            result, runs = _paired(det, df, prompts, direction)
        else:
            check_columns(det, df, str(trace))
            runs = runs_from_trace(df, direction)
            if "eval_se" not in df.columns or df["eval_se"].isna().all():
                console.print("no eval_se column: the eval noise is estimated from each run's own series "
                              "(MAD of second differences / sqrt 6)")
            result = verdicts(det, runs)
        out = out or trace.with_name(trace.stem + ".verdicts.csv")
        out.parent.mkdir(parents=True, exist_ok=True)
        result.to_csv(out, index=False)
        console.print(f"{det.label} {det.params()} on {len(runs)} runs from {trace}: "
                      f"{int(result['stopped'].sum())} stopped -> {out}")
        if "label" in result:
            console.print(quality_table(detection_quality(result), f"Detection quality of {det.label}"))


#: the rule `detect --prompts` runs when no --detector is named: the paired, anytime-valid stop rule
PAIRED_DETECTOR = "paired"


def _paired(det, df, prompts: Path, direction):
    """Per-prompt records joined to the trace's runs (every checkpoint with an eval needs its records), then the
    paired rule's verdicts. Everything is validated before any run is replayed."""
    import numpy as np

    from eval.paired import paired_verdicts
    from eval.prompt_records import check_against_trace, load_prompt_records, records_by_run
    from eval.traces import run_signs, runs_from_trace

    records = load_prompt_records(prompts)
    if "seed" in records.columns and (records.groupby(["run_id", "prompt_id"])["seed"].nunique() > 1).any():
        make_console().print(f"{prompts}: a prompt's sampling seed changes between checkpoints: pairing cancels "
                             "prompt difficulty but not sampling noise (the gate should keep each prompt's seed)")
    runs = runs_from_trace(df, direction)
    by_run = records_by_run(records, run_signs(df, direction))
    check_against_trace(by_run, {r.run_id: r.steps for r in runs},
                        {r.run_id: np.array([c.eval_score for c in r.checkpoints]) for r in runs}, str(prompts))
    return paired_verdicts(det, runs, by_run), runs


def _calibrate(console, name, det, path: Path, direction, target: float, config: Path | None, explicit) -> None:
    from eval.calibrate import calibrate, calibration_groups, false_stop_check, write_config
    from eval.traces import check_columns, load_trace, runs_from_trace

    if det.threshold is None:
        raise BadInput(f"--detector {name}: has no threshold to calibrate")
    if path.is_dir():  # a corpus laid out as <source>/traces.csv + runs.csv: its tune split
        from studies.detector_report import load_corpus_split

        if not (path / "runs.csv").is_file():
            raise BadInput(f"--calibrate '{path}': a directory needs runs.csv "
                           "(a corpus: <source>/traces.csv, runs.csv)")
        df = load_corpus_split(path, "tune")
        fleet = f"{path.as_posix().rstrip('/')} tune split"
    else:
        df = load_trace(path)
        fleet = path.name
    check_columns(det, df, str(path))
    runs = [r for r in runs_from_trace(df, direction) if r.label != 1]
    if len(runs) < 10:
        raise BadInput(f"--calibrate '{path}': {len(runs)} healthy runs; need at least 10 to fit a false-stop rate")
    try:
        params = calibrate(name, [r.checkpoints for r in runs], target, base={**det.params(), **explicit})
    except ValueError as err:
        raise BadInput(f"--calibrate: {err}") from None
    from eval.detectors import make_detector

    fitted = make_detector(name, **params)
    by_run = {id(r.checkpoints): r for r in runs}
    for key, group in calibration_groups(fitted, [r.checkpoints for r in runs]):
        hit = sum(_stops(fitted, by_run[id(cps)]) for cps in group)
        c = false_stop_check(hit, len(group))
        console.print(f"{name}: {key} = {params[key]:g} on {len(group)} healthy runs of its kind: {hit} stopped "
                      f"({_pct(c.rate)}, 95% CI {_pct(c.low)}-{_pct(c.high)})")
    stopped = sum(_stops(fitted, r) for r in runs)
    check = false_stop_check(stopped, len(runs))
    allowed = int(math.floor(target * len(runs) + 1e-9))
    note = (f"target not reached: {stopped - allowed} more healthy runs stopped than {target:.1%} allows, by a bar "
            "this fleet does not calibrate (the gate bar z, chosen on the simulator)") if stopped > allowed else ""
    written = write_config(name, params, target, fleet, len(runs), stopped, config, note=note)
    console.print(f"{name}: stops {stopped}/{len(runs)} healthy runs "
                  f"({_pct(check.rate)}, 95% CI {_pct(check.low)}-{_pct(check.high)}) -> {written}")


def _stops(det, run) -> bool:
    monitor = det.start()
    return any(monitor.observe(cp) for cp in run.checkpoints)
