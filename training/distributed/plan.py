"""What a job on several ranks may be, and which rank holds which unit. Plain Python (no torch): a request's check
reads it before any model library is imported.

- `check_world(cfg, world_size)`: a config that cannot run on `world_size` ranks exits 2 in one line naming the field.
- `assign_units(seqs, world_size, expected_new)`: gives every unit of the step's buffer (a completion under ppo, a
  whole group of `group_size` completions under grpo/rloo: a group never spans two ranks) a rank. A unit that already
  has a rank (a carried one) keeps it; the fresh ones go, longest first, to the rank with the fewest expected tokens
  (prompt + tokens so far + what is still expected), ties to the lower rank and the lower uid: verl's
  `balance_batch` idea, greedy rather than Karmarkar-Karp. Every rank computes the same answer from the same buffer.
- `split_minibatch(idx, costs, world_size)`: which rank back-propagates which sample of a minibatch. Every rank holds
  the whole batch once the rollout's samples are gathered, so the update is balanced again, by tokens (prompt +
  response: what the forward and backward pass cost), whoever rolled the sample out: the same greedy, longest first.
"""

from __future__ import annotations

from common.errors import BadInput


def check_world(cfg, world_size: int) -> None:
    """BadInput (exit 2) when `cfg` cannot train on `world_size` ranks."""
    if world_size < 1:
        raise BadInput(f"gpus: {world_size} must be at least 1")
    if cfg.placement == "reward_apart":
        from training.job.config import uses_reference

        if cfg.engine != "transformers":
            raise BadInput(f"placement: 'reward_apart' streams the chunked loop's columns; engine: {cfg.engine!r} "
                           "keeps its scorers colocated: use engine: transformers or placement: colocated")
        if not uses_reference(cfg) and cfg.reward.kind == "function":
            raise BadInput("placement: 'reward_apart' moves the reward model and the reference model to a process "
                           "of their own, and this job has neither (a reward function, no KL paid): use colocated")
    if world_size == 1:
        return
    grouped = cfg.algorithm != "ppo"
    units = cfg.ppo.batch_size // cfg.ppo.group_size if grouped else cfg.ppo.batch_size
    if units % world_size:
        what = (f"{cfg.ppo.batch_size} samples are {units} groups of ppo.group_size {cfg.ppo.group_size}, and a group "
                f"stays whole on one rank" if grouped else f"{units} samples")
        field = "ppo.group_size" if grouped and cfg.ppo.batch_size % world_size == 0 else "ppo.batch_size"
        raise BadInput(f"{field}: {what}: they do not divide over {world_size} ranks (gpus {world_size}); make the "
                       f"step's {'groups' if grouped else 'samples'} a multiple of {world_size}")
    if cfg.engine != "transformers":
        raise BadInput(f"engine: {cfg.engine!r} runs on one rank; a job on {world_size} ranks uses engine: "
                       "transformers")
    if cfg.sampling == "stream":
        raise BadInput(f"sampling: 'stream' draws every token from one generator, which {world_size} ranks cannot "
                       "share: use keyed (or auto)")


def assign_units(seqs, world_size: int, expected_new: float) -> dict[int, int]:
    """{unit id: rank} for every unit of `seqs` (unit id: the group under grpo/rloo, where a group's members share it;
    the sequence's own group id under ppo, which is its uid's group of one... see `unit_of`). Sets nothing."""
    units: dict[int, list] = {}
    for s in seqs:
        units.setdefault(s.group, []).append(s)
    load = [0.0] * world_size
    out: dict[int, int] = {}
    fresh = []
    for g, members in units.items():
        cost = sum(len(s.prompt_ids) + max(len(s.response_ids), expected_new) for s in members)
        held = members[0].rank
        if 0 <= held < world_size:
            out[g] = held
            load[held] += cost
        else:
            fresh.append((cost, g))
    out.update(_longest_first(fresh, load))
    return out


def _longest_first(items: list[tuple[float, int]], load: list[float]) -> dict[int, int]:
    """{key: rank} for `items` ((cost, key) pairs): longest first (ties: the lower key) to the least loaded rank
    (ties: the lower rank), `load` (one entry per rank) updated in place. The greedy both plans use."""
    out: dict[int, int] = {}
    for cost, key in sorted(items, key=lambda x: (-x[0], x[1])):
        r = min(range(len(load)), key=lambda j: (load[j], j))
        out[key] = r
        load[r] += cost
    return out


def split_minibatch(idx: list[int], costs: list[float], world_size: int) -> list[list[int]]:
    """`idx` (a minibatch's sample indices) split over `world_size` ranks so their summed `costs` (one per entry of
    `idx`) are as even as the greedy makes them: longest first to the least loaded rank, ties to the lower rank and
    the earlier entry. Each part keeps `idx`'s order. The gradient summed over ranks is the same whatever the split
    (each token's loss is divided by the minibatch's global token count)."""
    owner = _longest_first([(c, k) for k, c in enumerate(costs)], [0.0] * world_size)
    return [[i for k, i in enumerate(idx) if owner[k] == r] for r in range(world_size)]
