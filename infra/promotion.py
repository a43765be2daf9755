"""The registry side of promotion by evidence (the decision itself is `eval/promotion.py`).

- `checkpoint_evidence(checkpoint, step)`: a trainer checkpoint's per-prompt gate scores (the run directory's
  `gate_records.csv` rows at that step, written by the trainer's gate with the run's fixed sampling seed) and the ids
  of what they were scored on: the held-out prompt texts of the gate and the gate's sampling seed, decode settings
  and gold-scorer config, all read from the checkpoint's `config.yaml`, with those ids' parts (`identity`: gate kind,
  function and code hash, held-out digest, eval prompts, sampling seed, ...) for a refusal to name what changed.
- `promote(client, model, version, evidence)`: the one place the `best` alias moves. It records the version's
  evidence as tags, runs the paired test against the holder's evidence and records the decision (difference, lower
  bound, prompts paired, level, the holder's version, the one-line reason) as tags of the new version.
- `copy_version(client, source, target_model)`: register a version's checkpoint under another model (a sweep's
  trial into a job's model, by `rlhfops promote`), its evidence with it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eval.promotion import ALPHA, MARGIN, Evidence, Promotion, decide, digest

#: run states whose checkpoints may hold the registry's `best` alias (`RunStatus.label`): a run that ended well, and a
#: live run the eval gate paused with its best checkpoint kept (PAUSED_BY_GATE)
BEST_ELIGIBLE_STATES = ("SUCCEEDED", "PAUSED_BY_GATE")


def eligible(run_state: str) -> bool:
    """Whether a version from a run that ended in `run_state` may hold `best`."""
    return str(run_state).split("(")[0] in BEST_ELIGIBLE_STATES


def gate_identity(config: Any) -> tuple[str, str]:
    """(prompt set id, gate id) of a `training.job.config.TrainConfig`'s eval gate: the held-out prompt texts it scores
    (batch 0: the first `eval_prompts`), and its sampling seed, decode settings and gold scorer (the task config)."""
    prompt_set, gate, _ = identity(config)
    return prompt_set, gate


def identity(config: Any) -> tuple[str, str, dict[str, str]]:
    """`gate_identity` and its parts (`eval.promotion.IDENTITY_PARTS`: what each id digests, one value per part),
    which a version carries as `identity.<part>` tags so a refusal can name the part that changed."""
    from training.gate import batch_seed
    from training.inputs.job_inputs import job_lineage

    gate = {"seed": batch_seed(config.seed, 0), "max_new_tokens": config.ppo.max_new_tokens,
            "temperature": config.ppo.temperature}
    parts = {"gate.kind": config.gate.kind, "sampling_seed": str(gate["seed"]),
             "decode": f"max_new_tokens={config.ppo.max_new_tokens}, temperature={config.ppo.temperature:g}",
             "eval_prompts": str(config.eval_prompts)}
    if config.task.kind == "synthetic":
        from training.inputs.synthetic_task import make_prompts

        prompts = make_prompts(config.task, config.seed).heldout[: config.eval_prompts]
        gate["task"] = config.task.model_dump(mode="json", exclude={"kind"})
        parts.update({"heldout.digest": digest(prompts), "task": digest(gate["task"])})
    else:  # a data set: its held-out file (by its own hash) and how many of its prompts the gate scores
        tags = job_lineage(config)["tags"]
        prompts = [tags["heldout.digest"], config.eval_prompts, config.task.prompt_key, config.task.chat_template]
        parts.update({"heldout.digest": str(tags["heldout.digest"]), "prompt_key": str(config.task.prompt_key),
                      "chat_template": str(config.task.chat_template)})
    if config.gate.kind != "gold":  # what scored them: a function (its code) or a model (its path)
        tags = job_lineage(config)["tags"]
        ref, code = tags.get("gate.ref") or tags.get("gate.path"), tags.get("gate.code_hash")
        gate.update({"gate.kind": config.gate.kind, "gate": [ref, code]})
        parts.update({k: str(v) for k, v in (("gate.ref", ref), ("gate.code_hash", code)) if v is not None})
    return digest(prompts), digest(gate), parts


def checkpoint_evidence(checkpoint: str | Path, step: int | None = None,
                        scores: Mapping[Any, float] | None = None) -> Evidence | None:
    """The evidence of a trainer checkpoint (`checkpoints/step-NNNNNN` with its `config.yaml`): `scores` if given,
    else its run directory's gate records at `step` (default: the checkpoint's own step). None when the checkpoint
    has no config or no records (a registry download, a hand-made directory)."""
    import yaml

    from training.gate import GATE_RECORDS, read_records
    from training.job.config import TrainConfig
    from training.job.lifecycle import step_of

    ckpt = Path(checkpoint)
    if not (ckpt / "config.yaml").is_file():
        return None
    try:
        config = TrainConfig.model_validate(yaml.safe_load((ckpt / "config.yaml").read_text()))
    except Exception:  # noqa: BLE001 - a config this version cannot read has no comparable evidence
        return None
    if scores is None:
        step = step_of(ckpt) if step is None else int(step)
        path = ckpt.parent.parent / GATE_RECORDS
        if step < 0 or not path.is_file():
            return None
        scores = {}
        for row in read_records(path):
            if int(row["step"]) == step:
                scores[str(row["prompt_id"])] = float(row["gold_score"])
    scores = {str(k): float(v) for k, v in scores.items() if math.isfinite(float(v))}
    if not scores:
        return None
    prompt_set, gate, parts = identity(config)
    return Evidence(prompt_set, gate, scores, parts)


def holder(client, model: str):
    """The version holding `model@best`, or None."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(model, "best")
    except MlflowException:
        return None


def promote(client, model: str, version, evidence: Evidence | None = None, *, run_state: str | None = None,
            alpha: float = ALPHA, margin: float = MARGIN) -> Promotion:
    """Move `model@best` to `version` (a `ModelVersion`) if it beats the holder by the paired test (eval.promotion);
    `evidence` (default: what the version's tags hold) is recorded on the version first. `run_state` (the run's
    final state): only a run that ended well may take `best`. The decision is recorded as tags on the version."""
    if evidence is not None:
        for k, v in evidence.tags().items():
            client.set_model_version_tag(model, version.version, k, v)
    else:
        evidence = Evidence.from_tags(version.tags or {})
    state = run_state if run_state is not None else (version.tags or {}).get("run_state", "")
    current = holder(client, model)
    if not eligible(state):
        decision = Promotion(False, f"refused: its run ended {state or 'without a final state'}; only runs that "
                                    f"ended {' or '.join(BEST_ELIGIBLE_STATES)} may hold best", alpha=alpha,
                             margin=margin)
    elif current is not None and str(current.version) == str(version.version):
        decision = Promotion(True, "already holds best", alpha=alpha, margin=margin)
    else:
        decision = decide(evidence, Evidence.from_tags(current.tags or {}) if current is not None else None,
                          has_holder=current is not None,
                          holder_name=f"version {current.version}" if current is not None else "the holder",
                          alpha=alpha, margin=margin)
    for k, v in decision.tags(current.version if current is not None else None).items():
        client.set_model_version_tag(model, version.version, k, v[:5000])
    if decision.promote:
        client.set_registered_model_alias(model, "best", version.version)
    return decision


def resolve_version(client, ref: str):
    """(model, ModelVersion) of `models:/NAME/VERSION`, `models:/NAME@ALIAS` or `NAME/VERSION`; ValueError naming
    the reference when it does not resolve."""
    from mlflow.exceptions import MlflowException

    text = ref[len("models:/"):] if ref.startswith("models:/") else ref
    try:
        if "@" in text:
            name, alias = text.split("@", 1)
            return name, client.get_model_version_by_alias(name, alias)
        name, _, number = text.rpartition("/")
        if not name or not number.isdigit():
            raise ValueError(f"'{ref}' is not models:/NAME/VERSION or models:/NAME@ALIAS")
        return name, client.get_model_version(name, number)
    except MlflowException as err:
        raise ValueError(f"'{ref}' does not resolve in the registry ({str(err).splitlines()[0]})") from None


def copy_version(client, source_model: str, source, target_model: str, tenant: str = ""):
    """`source` (a ModelVersion of `source_model`) registered under `target_model` (the same artifacts and run), its
    evidence and run state with it; a version already copied from it is returned, not made again."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(target_model, tags={"tenant": tenant} if tenant else None)
    except MlflowException:
        pass  # exists
    origin = f"{source_model}/{source.version}"
    for mv in client.search_model_versions(f"name = '{target_model}'"):
        if (mv.tags or {}).get("promoted_from") == origin:
            return mv
    keep = {k: v for k, v in (source.tags or {}).items() if not k.startswith("promotion.")}
    return client.create_model_version(target_model, source.source, run_id=source.run_id,
                                       tags={**keep, "promoted_from": origin},
                                       description=f"promoted from {origin}: {source.description or ''}"[:5000])
