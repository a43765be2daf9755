"""What scores a job's responses: the reward that trains it (`reward:`) and the held-out eval gate's function (`gate:`;
the gate's scorer of every kind is `training.gate.HeldoutScorer`).

Kinds (training/job/config.py):
- reward `proxy` / `model`: a sequence-classification model, scored inside the rollout (the streamed "reward"
  scorer of training/rollout/streaming.py); `function`: a function called once per step on the step's finished samples.
- gate `gold`: the synthetic task's gold scorer (training/inputs/synthetic_task.py); `function`: a function on the
held-out
  responses; `model`: a sequence-classification checkpoint's score.

A function is a built-in (training/inputs/rewards: platform code, called in this process) or the tenant's own code
(FILE.py:NAME or package.module:NAME), which never runs here: `TenantFunctionPool` (training/inputs/tenant_code.py)
runs it in fresh child processes with a timeout, a memory limit, the config's folder as working directory and none of
the platform's settings. Whatever tenant code does wrong ends as `TenantCodeError` (a tenant code fault, never a
platform one), naming the function and what it did, with examples.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.attribution import SampleError, SampleErrorSummary, TenantCodeError
from training.job.config import FunctionSettings

#: examples of failed samples kept for the tenant (job.json, the MLflow artifact)
MAX_EXAMPLES = 5


@dataclass
class Scored:
    """Scores aligned with the completions (None: no score), the samples that raised, CPU seconds spent."""

    scores: list[float | None]
    failures: list[Any] = field(default_factory=list)  # training.inputs.tenant_code.SampleFailure
    cpu_s: float = 0.0
    wall_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)  # what the function logged (log_metric), its means


def function_identity(text: str, base_dir: Path, field: str) -> tuple[Any, str]:
    """A function ref's (parsed tenant ref, or None for a built-in) and its code hash: a built-in's module, or the
    tenant function's own code and what it calls in its file (training/inputs/code_identity.py), not its neighbours.
    The one place both the scorer and the job's lineage tags take it from."""
    from training.inputs import rewards

    if rewards.builtin(text) is not None:
        return None, rewards.code_hash(text)
    from training.inputs.code_identity import ref_identity
    from training.inputs.tenant_code import parse_ref

    ref = parse_ref(text, base_dir, field)
    return ref, ref_identity(ref, base_dir)


class FunctionScorer:
    """One function of the job in one role ("reward function" or "gate function")."""

    def __init__(self, settings: FunctionSettings, role: str, field: str, config_dir: str | None, pool_of):
        from training.inputs import rewards

        self.settings, self.role, self.field = settings, role, field
        self.builtin = rewards.builtin(settings.ref)
        self._pool_of = pool_of  # () -> TenantFunctionPool, created when first needed
        base = Path(config_dir) if config_dir else Path.cwd()
        self.ref, self.code_hash = function_identity(settings.ref, base, field)
        self.text = self.ref.text if self.ref is not None else settings.ref

    def check(self, columns: list[str] | tuple[str, ...] = ()) -> None:
        """Load the function in a worker (not here) before any training: an import error is the tenant's; a
        signature that cannot take TRL's keywords and `columns` is BadInput."""
        if self.ref is not None:
            self._pool_of().check(self.ref, timeout_s=self.settings.timeout_s, role=self.role, columns=columns)

    def __call__(self, prompts: list, completions: list[str], columns: dict[str, list],
                 completion_ids: list[list[int]] | None = None, step: int = 0, max_steps: int = 0) -> Scored:
        t = time.perf_counter()
        if self.builtin is not None:
            c = time.process_time()
            scores = list(self.builtin(prompts, completions, **columns))
            if len(scores) != len(completions):
                raise RuntimeError(f"built-in {self.text} returned {len(scores)} scores for {len(completions)}")
            return Scored([None if s is None else float(s) for s in scores], [], time.process_time() - c,
                          time.perf_counter() - t)
        pool = self._pool_of()
        cpu = pool.cpu_seconds
        res = pool.call(self.ref, prompts, completions, columns, timeout_s=self.settings.timeout_s, role=self.role,
                        completion_ids=completion_ids, step=step, max_steps=max_steps)
        return Scored(list(res.scores), list(res.errors), pool.cpu_seconds - cpu, time.perf_counter() - t,
                      dict(res.metrics))


class RewardFunctions:
    """The reward of a `kind: function` job: one function, or a list of them with weights (TRL's `reward_funcs` and
    `reward_weights`). The reward is TRL 1.16 GRPOTrainer's: per sample, the `nansum` of weight x score over the
    functions (a None or a raised sample is NaN, left out of the sum), NaN (here None: no reward) when no function
    scored it. Each function's share of raised samples is held to `max_error_frac` on its own. Step metrics:
    `reward_fn/<name>/mean` per function (the mean of what it scored, TRL's `rewards/<name>/mean`) and
    `reward_fn/<metric>` for what the functions logged with `log_metric`."""

    def __init__(self, settings: Any, config_dir: str | None, pool_of):
        refs = settings.refs if hasattr(settings, "refs") else [settings.ref]
        self.settings, self.weights = settings, (settings.weight_list if hasattr(settings, "weight_list")
                                                 else [1.0] * len(refs))
        fields = ["reward.ref"] if len(refs) == 1 else [f"reward.ref[{i}]" for i in range(len(refs))]
        self.functions = [FunctionScorer(settings.model_copy(update={"ref": r}), "reward function", f, config_dir,
                                         pool_of) for r, f in zip(refs, fields, strict=True)]
        self.role, self.field = "reward function", "reward.ref"
        self.text = ", ".join(f.text for f in self.functions)
        self.code_hash = combined_hash([f.code_hash for f in self.functions], self.weights)
        names = [f.text.rpartition(":")[2] for f in self.functions]
        self.names = [n if names.count(n) == 1 else f"{n}_{i}" for i, n in enumerate(names)]

    def check(self, columns: list[str] | tuple[str, ...] = ()) -> None:
        for f in self.functions:
            f.check(columns)

    def __call__(self, prompts: list, completions: list[str], columns: dict[str, list],
                 completion_ids: list[list[int]] | None = None, step: int = 0, max_steps: int = 0) -> Scored:
        """Score with every function (TenantCodeError when one raised on more than `max_error_frac` of the batch)
        and combine."""
        n = len(completions)
        total: list[float | None] = [None] * n
        out = Scored(total)
        for fn, weight, name in zip(self.functions, self.weights, self.names, strict=True):
            got = fn(prompts, completions, columns, completion_ids, step, max_steps)
            raised_too_often(fn, got.failures, n, step + 1, self.settings.max_error_frac)
            out.failures += got.failures
            out.cpu_s += got.cpu_s
            out.wall_s += got.wall_s
            scored = [s for s in got.scores if s is not None]
            out.metrics[f"reward_fn/{name}/mean"] = sum(scored) / len(scored) if scored else float("nan")
            out.metrics.update({f"reward_fn/{k}": v for k, v in got.metrics.items()})
            for i, s in enumerate(got.scores):
                if s is not None:
                    total[i] = (total[i] or 0.0) + weight * s
        return out


def combined_hash(hashes: list[str], weights: list[float]) -> str:
    """The code hash of a reward: its function's, or for a list one hash of every function's and weight."""
    import hashlib

    if len(hashes) == 1:
        return hashes[0]
    text = ",".join(f"{h}*{float(w)!r}" for h, w in zip(hashes, weights, strict=True))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _count(n: int) -> str:
    return f"{n:,}"


def examples_of(failures: list[Any]) -> list[dict[str, str]]:
    return [{"prompt": str(f.prompt)[:500], "completion": str(f.completion)[:500], "error": f.error,
             "traceback": getattr(f, "traceback_tail", "")} for f in failures[:MAX_EXAMPLES]]


def raised_too_often(scorer: FunctionScorer, failures: list[Any], n: int, step: int, limit: float) -> None:
    """TenantCodeError in the runbook's words when more than `limit` of a batch's `n` samples raised."""
    if not failures or len(failures) <= limit * n:
        return
    first = failures[0]
    examples = examples_of(failures)
    share = 100 * len(failures) / n
    err = TenantCodeError(
        f"your {scorer.role} {scorer.text} raised on {share:.1f}% of samples ({_count(len(failures))} "
        f"of {_count(n)}) at step {step}: {first.error}; {len(examples)} example{'s' * (len(examples) != 1)} attached "
        f"(more than {scorer.field.split('.')[0]}.max_error_frac {limit:g} of a batch may not raise; fix it and "
        "resubmit)",
        SampleErrorSummary(n, len(failures), tuple(SampleError(sample=f"{e['prompt']!r} -> {e['completion']!r}",
                                                                 error=e["error"]) for e in examples),
                           tuple(dict.fromkeys(f.error.split(":")[0] for f in failures))))
    err.examples = examples
    raise err


def _file_hash(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def gold_code_hash() -> str:
    """The synthetic task's gold scorer's code (training/inputs/synthetic_task.py), as a gate's code hash."""
    from training.inputs import synthetic_task as task

    return _file_hash(Path(task.__file__))


def describe_failure(err: BaseException) -> str:
    """The last lines of a traceback (examples for the tenant)."""
    return "".join(traceback.format_exception_only(type(err), err)).strip()


def check_defined(ref: Any) -> None:
    """BadInput (before any work) when a FILE.py ref's file cannot be parsed, or binds no `NAME` at its top level: read
    with `ast`, never imported in the trainer. A file that binds names in ways `ast` cannot see (`from x import *`,
    `globals()[...] = ...`) is given the benefit of the doubt: it is loaded in a worker when the job starts."""
    import ast

    from common.errors import BadInput

    if ref.file is None:
        return
    source = Path(ref.file).read_bytes()
    try:
        tree = ast.parse(source, filename=str(ref.file))
    except SyntaxError as err:
        raise BadInput(f"{ref.field}: {Path(ref.file).name} line {err.lineno}: {err.msg} (fix the file and resubmit)"
                       ) from None
    except ValueError as err:  # null bytes
        raise BadInput(f"{ref.field}: {Path(ref.file).name} is not Python source ({err})") from None
    names: set[str] = set()

    def bind(statements: list) -> bool:
        """Add the names `statements` bind at module level (into if/try/with/for bodies, never into functions or
        expressions); False on a star import (anything may be bound)."""
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if alias.name == "*":
                        return False
                    names.add((alias.asname or alias.name).split(".")[0])
            else:
                targets = {ast.Assign: lambda n: n.targets, ast.AnnAssign: lambda n: [n.target],
                           ast.AugAssign: lambda n: [n.target], ast.For: lambda n: [n.target],
                           ast.With: lambda n: [i.optional_vars for i in n.items if i.optional_vars]}
                for kind, of in targets.items():
                    if isinstance(node, kind):
                        names.update(t.id for target in of(node) for t in ast.walk(target) if isinstance(t, ast.Name))
                for block in ("body", "orelse", "finalbody"):
                    if not bind(getattr(node, block, None) or []):
                        return False
                for handler in getattr(node, "handlers", None) or []:
                    if not bind(handler.body):
                        return False
        return True

    if not bind(tree.body) or "globals" in source.decode("utf-8", "replace") or ref.name in names:
        return
    defined = sorted(n for n in names if not n.startswith("_"))
    raise BadInput(f"{ref.field}: {Path(ref.file).name} defines no {ref.name!r} at its top level (it defines: "
                   f"{', '.join(defined) or 'nothing'}); give FILE.py:NAME of one of its functions")


def check_signature(ref: Any, columns: list[str]) -> None:
    """BadInput (before any work) when a FILE.py ref's function, read with `ast`, cannot be called as TRL calls a
    reward function with the job's `columns` (training/inputs/tenant_worker.py `signature_problem`: it must take
    `**kwargs` or name every keyword, and need nothing else). A decorated function, or a name bound otherwise, is left
    to the worker's own check when the job starts."""
    import ast

    from common.errors import BadInput
    from training.inputs.tenant_worker import signature_problem

    if ref.file is None:
        return
    try:
        tree = ast.parse(Path(ref.file).read_bytes())
    except (SyntaxError, ValueError):
        return  # check_defined says so
    found = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == ref.name]
    if not found or found[-1].decorator_list:
        return
    a = found[-1].args
    positional = [*a.posonlyargs, *a.args]
    defaults = [False] * (len(positional) - len(a.defaults)) + [True] * len(a.defaults)
    params = [(p.arg, "POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD", d)
              for i, (p, d) in enumerate(zip(positional, defaults, strict=True))]
    if a.vararg:
        params.append((a.vararg.arg, "VAR_POSITIONAL", True))
    params += [(p.arg, "KEYWORD_ONLY", d is not None) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    if a.kwarg:
        params.append((a.kwarg.arg, "VAR_KEYWORD", True))
    problem = signature_problem(ref.name, params, columns)
    if problem:
        raise BadInput(f"{ref.field}: {Path(ref.file).name}: {problem}")
