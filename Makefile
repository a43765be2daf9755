# Two entry points (the set-up contract, docs/ARCHITECTURE.md): both create or reuse .venv/ and install into it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.install-stamp
PIP_FLAGS := --disable-pip-version-check -q
# torch busy-waits its OpenMP threads by default; on 2 shared cores that slows generation 10-20x
export OMP_WAIT_POLICY := PASSIVE
export MPLBACKEND := Agg

.PHONY: install demo test lint bench mutate mutate-resume mutation-report clean wheelhouse

$(BIN)/python:
	$(PY) -m venv $(VENV)

# Reinstall only when the dependency declarations change. --no-compile: pip byte-compiles every module of every
# package (ray, mlflow, torch, ...), half of the install's time on 2 cores (4 min 47 s against 2 min 27 s); Python
# compiles the modules a process imports on first use and caches them in __pycache__ as usual.
$(STAMP): pyproject.toml constraints-cpu.txt | $(BIN)/python
	$(BIN)/pip install $(PIP_FLAGS) --no-compile -c constraints-cpu.txt -e '.[dev,ray,stack]'
	touch $(STAMP)

# Tenant code runs in a bubblewrap sandbox (training/inputs/sandbox.py): installed here when missing, as root with
# apt-get (best effort); otherwise the one command to run is printed, and jobs with tenant code are refused (exit 2).
install: $(STAMP)
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		bubblewrap; } >/dev/null 2>&1; } \
		|| echo "bubblewrap is missing: tenant code needs it (as root: apt-get install -y bubblewrap)"

# The main job on embedded defaults: the quick nightly (simulation matrix, detector comparison, a real RLHF job
# registered and re-evaluated, canaries, a live platform round) on a temporary Prefect API (SQLite under
# .prefect/) and a SQLite MLflow store (./mlflow.db); it ends by printing where to look (report, MLflow UI and
# Prefect UI commands).
demo: install
	PREFECT_HOME=$${PREFECT_HOME:-$(CURDIR)/.prefect} PREFECT_SERVER_ANALYTICS_ENABLED=false \
		$(BIN)/rlhfops nightly --quick --out results/demo

test: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -n 2

# Mutation testing of the decision code (PPO math, streaming scorer, detectors, ledger, the simulator's engine and
# policies, the lifecycle, the OPPO controller, the sweep runner) against their fast oracle tests ([tool.mutmut] in
# pyproject.toml; docs/testing.md). CPU-heavy: by hand or the nightly, never in CI. One module at a time:
# `make mutate MUTANTS="scheduling.policies*"` (every mutant afresh; `make mutate-resume` goes on where a run stopped). `make mutation-report` writes the score per module and every survivor
# (with its explanation from tests/mutation_equivalents.toml) into docs/testing.md.
mutate: install
	$(BIN)/mutmut run --max-children $${MUTATE_JOBS:-2} $(MUTANTS)
	$(BIN)/mutmut results

# mutmut reruns every mutant named or matched by a glob; this runs only those of MUTANTS (globs, required) that have
# no verdict yet (not run, or timed out), so an interrupted run goes on where it stopped.
mutate-resume: install
	@test -n '$(MUTANTS)' || { echo 'usage: make mutate-resume MUTANTS="scheduling.engine*"'; exit 2; }
	names="$$($(BIN)/python tests/mutation_report.py --pending $(MUTANTS))"; \
	if [ -n "$$names" ]; then $(BIN)/mutmut run --max-children $${MUTATE_JOBS:-2} $$names; else echo "nothing pending"; fi

mutation-report: install
	$(BIN)/python tests/mutation_report.py

# The light dependencies the trainer's import path needs beyond torch and transformers (and what those bring: numpy,
# pyyaml, tokenizers), as wheels for an offline GPU box running CPython 3.12 on x86-64: scripts/gpu-check installs
# them into a temporary folder there. Never torch or transformers: the box's own are used. The list is what
# importing training.trainer and training.benches.gpu_check loads that torch and transformers do not (docs/oppo.md
# "GPU check"); versions are this venv's.
WHEELHOUSE_PKGS := pydantic pydantic-core annotated-types typing-inspection typing-extensions
WHEEL_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
	manylinux1_x86_64
wheelhouse: install
	rm -rf wheelhouse && mkdir -p wheelhouse
	$(BIN)/python -m pip download $(PIP_FLAGS) --no-deps --only-binary=:all: --python-version 3.12 \
		--implementation cp $(addprefix --platform ,$(WHEEL_PLATFORMS)) -d wheelhouse \
		$$($(BIN)/python -c "import importlib.metadata as m; print(' '.join(p + '==' + m.version(p) for p in '$(WHEELHOUSE_PKGS)'.split()))")
	@ls wheelhouse; du -sh wheelhouse

bench: install
	$(BIN)/rlhfops bench sim --out bench-sim.json

clean:
	rm -rf $(VENV) results runs mutants
