"""Write the mutation-testing score per module and every surviving mutant into docs/testing.md.

    .venv/bin/mutmut run --max-children 2 "scheduling.policies*"     # resumable; results accumulate in mutants/
    .venv/bin/python tests/mutation_report.py                        # or: make mutation-report
    make mutate-resume MUTANTS="scheduling.engine*"                  # only those not yet checked or timed out

Reads what `mutmut results --all true` reports for the modules of `[tool.mutmut] only_mutate` (pyproject.toml),
prints the table, and rewrites the part of docs/testing.md between the two `mutation-report` markers: per module
the mutants killed / survived / without a covering test / not yet run and the score (killed / checked); then every
survivor with its diff (`mutmut show`) and its explanation from tests/mutation_equivalents.toml, or UNEXPLAINED; the
functions no selected test reaches ("no tests"), once each, explained under `<function name>*`.
Exit code 1 when a checked module has an unexplained survivor (so the nightly can say so), else 0.

Not a test (pytest collects `test_*.py` only) and no project import: it reads mutmut's results.
"""

from __future__ import annotations

import argparse
import fnmatch
import re
import subprocess
import sys
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "testing.md"
EQUIVALENTS = ROOT / "tests" / "mutation_equivalents.toml"
#: one file per module may hold its explanations beside the main one (`mutation_equivalents_<module>.toml`), so two
#: people explaining two modules' survivors do not edit one file
EQUIVALENT_FILES = "mutation_equivalents*.toml"
START, END = "<!-- mutation-report:start -->", "<!-- mutation-report:end -->"
#: mutmut's statuses that mean a test noticed the mutant (a timeout is counted apart: on a loaded machine a slow but
#: correct run can time out too, so it is not counted as killed)
DETECTED = {"killed", "segfault", "caught by type check"}
LINE = re.compile(r"^\s+(?P<name>\S+__mutmut_\d+): (?P<status>.+?)\s*$")
MODULE = re.compile(r"^(?P<module>.+?)\.x(?:_|ǁ)")
FUNCTION = re.compile(r"__mutmut_\d+$")


def mutmut() -> Path:
    return Path(sys.executable).parent / "mutmut"


def modules_configured() -> list[str]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    return [p[:-3].replace("/", ".") for p in cfg["only_mutate"]]


def results() -> dict[str, str]:
    out = subprocess.run([str(mutmut()), "results", "--all", "true"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    return {m["name"]: m["status"] for m in map(LINE.match, out.splitlines()) if m}


def show(name: str) -> str:
    out = subprocess.run([str(mutmut()), "show", name], cwd=ROOT, capture_output=True, text=True).stdout
    diff = [line for line in out.splitlines() if line.startswith(("-", "+")) and not line.startswith(("---", "+++"))]
    return "\n".join(diff) or out.strip()


def pending(status: dict[str, str], globs: list[str]) -> list[str]:
    """The mutants matching any of `globs` whose last run gave no verdict: not run yet, or stopped by the time limit."""
    return sorted(n for n, st in status.items()
                  if st in {"not checked", "timeout"} and any(fnmatch.fnmatchcase(n, g) for g in globs))


def table(by_module: dict[str, Counter], order: list[str], later: Counter) -> list[str]:
    """`later[mod]`: survivors of `mod` explained as "killed by" a test written after the run copied the tests."""
    rows = ["| module | mutants | killed | timeout | survived | of which killed by a later test | no test | not run "
            "| score (killed / checked) | with the later kills |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for mod in order:
        c = by_module.get(mod, Counter())
        total = sum(c.values())
        killed = sum(c[s] for s in DETECTED)
        not_run = c["not checked"] + c["skipped"]
        checked = total - not_run
        score = f"{killed / checked:.1%}" if checked else "not run"
        with_later = f"{(killed + later[mod]) / checked:.1%}" if checked else "not run"
        rows.append(f"| `{mod}` | {total} | {killed} | {c['timeout']} | {c['survived']} | {later[mod]} | "
                    f"{c['no tests']} | {not_run} | {score} | {with_later} |")
    return rows


def load_explanations() -> dict[str, dict]:
    """Every `[mutant."NAME"]` entry of tests/mutation_equivalents*.toml; a name explained in two files is an error."""
    explained: dict[str, dict] = {}
    for path in sorted(EQUIVALENTS.parent.glob(EQUIVALENT_FILES)):
        for name, entry in tomllib.loads(path.read_text()).get("mutant", {}).items():
            if name in explained:
                raise SystemExit(f"{path.name}: mutant {name} is explained twice; keep one entry")
            explained[name] = entry
    return explained


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/testing.md as it is")
    ap.add_argument("--pending", nargs="+", metavar="GLOB",
                    help="print only the names of the mutants matching GLOB not yet checked or timed out (for "
                         "`make mutate-resume`: mutmut reruns every mutant it is given by name or glob)")
    args = ap.parse_args(argv)
    if args.pending:
        print(" ".join(pending(results(), args.pending)))
        return 0

    order = modules_configured()
    status = results()
    by_module: dict[str, Counter] = defaultdict(Counter)
    for name, st in status.items():
        m = MODULE.match(name)
        if m and m.group("module") in order:
            by_module[m.group("module")][st] += 1
    explained = load_explanations()

    ours = {n: st for n, st in status.items() if (m := MODULE.match(n)) and m.group("module") in order}
    survivors = sorted(n for n, st in ours.items() if st == "survived")
    later = Counter(MODULE.match(n).group("module") for n in survivors
                    if explained.get(n, {}).get("why", "").startswith("killed by"))
    lines = table(by_module, order, later)
    # mutants no selected test reaches, per function (one explanation per function: `<function>*` in the file)
    uncovered: dict[str, int] = Counter(FUNCTION.sub("", n) for n, st in ours.items() if st == "no tests")
    unexplained = [n for n in survivors if n not in explained]
    unexplained += [f for f in uncovered if f"{f}*" not in explained]
    lines += ["", f"Survivors: {len(survivors)}; functions no selected test reaches: {len(uncovered)} "
                  f"({sum(uncovered.values())} mutants); unexplained: {len(unexplained)}."]
    for func, n in sorted(uncovered.items()):
        why = explained.get(f"{func}*", {}).get("why", "UNEXPLAINED")
        lines += ["", f"**`{func}`** ({n} mutants, no selected test reaches it): {why}"]
    for name in survivors:
        why = explained.get(name, {}).get("why", "UNEXPLAINED")
        lines += ["", f"**`{name}`** (survived): {why}", "", "```diff", show(name), "```"]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        doc = DOC.read_text()
        if START not in doc or END not in doc:
            raise SystemExit(f"{DOC}: the markers {START} and {END} are missing")
        head, rest = doc.split(START, 1)
        _, tail = rest.split(END, 1)
        DOC.write_text(f"{head}{START}\n{text}\n{END}{tail}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
