# Two entry points (the set-up contract, docs/ARCHITECTURE.md): both create or reuse .venv/ and install into it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.install-stamp
PIP_FLAGS := --disable-pip-version-check -q
# torch busy-waits its OpenMP threads by default; on 2 shared cores that slows generation 10-20x
export OMP_WAIT_POLICY := PASSIVE
export MPLBACKEND := Agg

.PHONY: install demo test lint bench mutate clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# Reinstall only when the dependency declarations change.
$(STAMP): pyproject.toml constraints-cpu.txt | $(BIN)/python
	$(BIN)/pip install $(PIP_FLAGS) -c constraints-cpu.txt -e '.[dev,ray,stack]'
	touch $(STAMP)

install: $(STAMP)

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

# Mutation testing of the PPO math, the streaming scorer, the detectors and the ledger against their fast
# oracle tests ([tool.mutmut] in pyproject.toml). Resumable; `mutmut results` lists the survivors,
# `mutmut show NAME` prints one. CPU-heavy: run it by hand, not in CI.
mutate: install
	$(BIN)/mutmut run --max-children $${MUTATE_JOBS:-2}
	$(BIN)/mutmut results

bench: install
	$(BIN)/rlhfops bench sim --out bench-sim.json

clean:
	rm -rf $(VENV) results runs mutants
