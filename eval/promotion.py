"""Promotion by evidence: does a new checkpoint beat the registry's current `best` on the same prompts?

A model's `best` alias names the checkpoint users deploy and re-score. It moves to a new version only when the new
version's per-prompt held-out scores beat the holder's on the same prompts, scored by the same gate (the same
held-out prompt set, the same sampling seed, decode settings and gold scorer: `Evidence.prompt_set` and
`Evidence.gate` name them): the paired difference new - holder, prompt by prompt, cancels how hard each prompt is,
and the lower end of `eval.paired`'s confidence sequence on its mean must clear `margin`. A higher mean that is not
significant leaves the alias where it is; versions scored on different prompts or by a different gate are not
compared at all (the decision says why, in one line: with both versions' identity parts, `Evidence.parts`, it
names each part that changed, e.g. "gate code (fns.py:exact_match) changed: a1b2 -> c3d4", and those that did
not). Each promotion carries its evidence (the mean difference, the
bound, the prompts paired, the level) for the registry to record as version tags.

Error rate: when the new version is truly no better than the holder by `margin` (mean over the gate's prompts at
its sampling seed), it is promoted with probability at most `alpha` (the sequence holds at every number of prompts,
so a gate that scored extra prompts for either version is covered too).

Plain Python: the MLflow side (reading a version's evidence from its tags, writing the decision) is
`infra/promotion.py`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: the level and margin the registry promotes at unless told otherwise
ALPHA = 0.02
MARGIN = 0.0
#: the fewest prompts both versions must share for the test to count
MIN_PROMPTS = 8

#: version tag keys of a version's evidence and of a promotion's
EVIDENCE_TAGS = ("evidence.prompt_set", "evidence.gate", "evidence.n", "evidence.scores")
#: a version tag per part of its gate identity: `identity.<part>`
IDENTITY_TAG = "identity."
#: the parts of a gate identity (what `infra.promotion.gate_identity` digests), in the order a refusal names them,
#: with their words
IDENTITY_PARTS = {
    "gate.kind": "gate kind", "gate.ref": "gate function", "gate.code_hash": "gate code",
    "heldout.digest": "held-out digest", "eval_prompts": "eval prompts", "prompt_key": "prompt key",
    "chat_template": "chat template", "task": "synthetic task", "sampling_seed": "sampling seed",
    "decode": "decode settings",
}
#: parts whose values are hashes: a refusal shows their first characters
HASHED_PARTS = ("gate.code_hash", "heldout.digest", "task")


def digest(obj: Any) -> str:
    """A short stable id of a JSON-able description (a prompt set, a gate config)."""
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Evidence:
    """A checkpoint's per-prompt held-out scores (prompt id -> gold score) and what they were scored on:
    `prompt_set` (an id of the held-out prompt texts) and `gate` (an id of the sampling seed, decode settings and
    gold scorer); `parts`: what those ids digest, part by part (`IDENTITY_PARTS`; empty for a version registered
    before parts were recorded)."""

    prompt_set: str
    gate: str
    scores: Mapping[str, float]
    parts: Mapping[str, str] = field(default_factory=dict)

    def tags(self) -> dict[str, str]:
        return {"evidence.prompt_set": self.prompt_set, "evidence.gate": self.gate,
                **{f"{IDENTITY_TAG}{k}": str(v) for k, v in self.parts.items()},
                "evidence.n": str(len(self.scores)),
                "evidence.scores": json.dumps({str(k): float(v) for k, v in sorted(self.scores.items(),
                                                                                   key=lambda kv: str(kv[0]))},
                                              separators=(",", ":"))}

    @classmethod
    def from_tags(cls, tags: Mapping[str, str]) -> Evidence | None:
        """The evidence a version's tags hold (None when it has none or it does not parse)."""
        try:
            scores = json.loads(tags["evidence.scores"])
            if not isinstance(scores, dict) or not scores:
                return None
            return cls(str(tags["evidence.prompt_set"]), str(tags["evidence.gate"]),
                       {str(k): float(v) for k, v in scores.items()},
                       {k[len(IDENTITY_TAG):]: str(v) for k, v in tags.items() if k.startswith(IDENTITY_TAG)})
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Promotion:
    """The decision on one candidate: `promote`, and `reason` (one line). With a paired test: `diff` (mean of new -
    holder over `n` shared prompts), `lower` (the lower end of the level-`alpha` confidence sequence on it),
    `margin`. `changed`: the identity parts that differ, when a different gate or prompt set refused it."""

    promote: bool
    reason: str
    diff: float = math.nan
    lower: float = math.nan
    n: int = 0
    alpha: float = ALPHA
    margin: float = MARGIN
    tested: bool = False
    changed: tuple[str, ...] = ()

    def tags(self, holder_version: Any = None) -> dict[str, str]:
        """The version tags that record this decision."""
        out = {"promotion.decision": "promoted" if self.promote else "kept holder", "promotion.reason": self.reason}
        if self.tested:
            out.update({"promotion.diff": repr(self.diff), "promotion.lower_bound": repr(self.lower),
                        "promotion.n_prompts": str(self.n), "promotion.alpha": repr(self.alpha),
                        "promotion.margin": repr(self.margin)})
        if self.changed:
            out["promotion.changed"] = ", ".join(self.changed)
        if holder_version is not None:
            out["promotion.vs_version"] = str(holder_version)
        return out


def _show(part: str, value: str | None) -> str:
    if value is None:
        return "(none)"
    return value[:8] if part in HASHED_PARTS else value


def identity_changes(new: Mapping[str, str], old: Mapping[str, str]) -> tuple[list[str], str]:
    """The parts of two gate identities that differ (their words, `IDENTITY_PARTS`) and one clause saying how:
    "gate code (fns.py:exact_match) changed: a1b2c3d4 -> c3d4e5f6; held-out digest, sampling seed unchanged".
    Parts only one side has are compared too (a side without it reads "(none)")."""
    keys = [k for k in IDENTITY_PARTS if k in new or k in old] + sorted((set(new) | set(old)) - set(IDENTITY_PARTS))
    changed, said, same = [], [], []
    for k in keys:
        label = IDENTITY_PARTS.get(k, k)
        if new.get(k) == old.get(k):
            same.append(label)
            continue
        changed.append(label)
        ref = new.get("gate.ref") or old.get("gate.ref")
        named = f"{label} ({ref})" if k == "gate.code_hash" and ref else label
        said.append(f"{named} changed: {_show(k, old.get(k))} -> {_show(k, new.get(k))}")
    if same:
        said.append(f"{', '.join(same)} unchanged")
    return changed, "; ".join(said)


def _refusal(candidate: Evidence, holder: Evidence, holder_name: str, alpha: float, margin: float) -> Promotion:
    """A different prompt set or gate: which, and when both versions carry their identity's parts, which part."""
    prompts, gate = candidate.prompt_set != holder.prompt_set, candidate.gate != holder.gate
    what = " and ".join(w for w, differs in (("prompt sets", prompts), ("gate configs", gate)) if differs)
    ids = (f"this version {candidate.prompt_set if prompts else candidate.gate}, {holder_name} "
           f"{holder.prompt_set if prompts else holder.gate}")
    changed, detail = identity_changes(candidate.parts, holder.parts) if candidate.parts and holder.parts else ([], "")
    if changed:
        why = detail
    elif bool(candidate.parts) != bool(holder.parts):
        why = (f"{holder_name if candidate.parts else 'this version'} was registered without its identity's parts, "
               "so which part changed is not known")
    else:  # neither records its parts
        why = ("a paired test needs the same held-out prompts" if prompts
               else "sampling seed, decode settings or gold scorer differ")
    return Promotion(False, f"refused: different {what} ({ids}): {why}", alpha=alpha, margin=margin,
                     changed=tuple(changed))


def decide(candidate: Evidence | None, holder: Evidence | None, *, has_holder: bool, holder_name: str = "the holder",
           alpha: float = ALPHA, margin: float = MARGIN, min_prompts: int = MIN_PROMPTS) -> Promotion:
    """Whether `candidate` takes `best` from the current holder (`has_holder`: there is one; `holder`: its evidence,
    None when it has none). Refusals (different prompts, different gate, missing evidence) are decisions with a
    one-line reason, never exceptions."""
    from eval.paired import cs_radius, mixture_r, paired_diff

    if not has_holder:
        return Promotion(True, "no current best: the first eligible version takes it", alpha=alpha, margin=margin)
    if candidate is None:
        return Promotion(False, f"refused: this version has no per-prompt gate records, so it cannot be compared with "
                                f"{holder_name} on the same prompts", alpha=alpha, margin=margin)
    if holder is None:
        return Promotion(False, f"refused: {holder_name} has no per-prompt gate records, so no paired test is "
                                "possible (promote explicitly with `rlhfops promote` once both have them)",
                         alpha=alpha, margin=margin)
    if candidate.prompt_set != holder.prompt_set or candidate.gate != holder.gate:
        return _refusal(candidate, holder, holder_name, alpha, margin)
    common = sorted(set(candidate.scores) & set(holder.scores))
    if len(common) < min_prompts:
        return Promotion(False, f"refused: only {len(common)} prompts scored by both (need {min_prompts})",
                         alpha=alpha, margin=margin)
    d = paired_diff({p: holder.scores[p] for p in common}, {p: candidate.scores[p] for p in common})
    lower = d.mean - float(cs_radius(d.n, d.sd, alpha, mixture_r(d.n, alpha)))
    promote = lower > margin
    verdict = "promoted" if promote else f"kept {holder_name}"
    reason = (f"{verdict}: {d.mean:+.4f} over {holder_name} on {d.n} paired prompts, lower bound {lower:+.4f} "
              f"{'>' if promote else '<='} margin {margin:g} (alpha {alpha:g})")
    return Promotion(promote, reason, d.mean, lower, d.n, alpha, margin, tested=True)
