"""OPPO controllers: Delta (Eq. 4 / Algorithm 1), chunk tuner, deferral histogram."""

from collections import Counter

from training.rollout.controllers import ChunkTuner, DeltaController, deferral_histogram


def test_delta_grows_while_reward_improves_and_decays_after_eq4():
    c = DeltaController(delta_init=4, delta_min=0, delta_max=6, window=2)
    deltas = [c.update(r) for r in [0, 0, 1, 1]]  # windows [0,0] -> [1,1]: improving
    assert deltas == [4, 4, 4, 5]
    deltas = [c.update(r) for r in [2, 2, 3, 3, 4, 4]]
    assert deltas[-1] == 6  # capped at delta_max
    deltas = [c.update(r) for r in [4, 4, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0]]
    assert deltas[-1] == 0  # flat or falling reward walks Delta down to delta_min
    assert all(0 <= d <= 6 for d in deltas)


def test_delta_alg1_rule_moves_the_other_way():
    c = DeltaController(delta_init=4, delta_min=0, delta_max=8, window=2, rule="alg1")
    for r in [0, 0, 1, 1]:
        c.update(r)
    assert c.delta == 3


def test_delta_fixed_when_not_adaptive_and_state_roundtrip():
    c = DeltaController(3, 0, 8, 2, adaptive=False)
    assert [c.update(r) for r in range(10)] == [3] * 10
    d = DeltaController(4, 0, 8, 2)
    for r in [0, 0, 1]:
        d.update(r)
    e = DeltaController(0, 0, 8, 2)
    e.load_state_dict(d.state_dict())
    assert e.update(1) == d.update(1) == 5


def test_chunk_tuner_tries_each_candidate_then_keeps_fastest():
    t = ChunkTuner(initial=16, candidates=[8, 16, 32], every=10)
    seen = []
    for step, sec in zip(range(3), [3.0, 1.0, 2.0], strict=True):
        c = t.chunk_for_step(step)
        seen.append(c)
        t.report(c, sec, tokens=100)
    assert seen == [8, 16, 32]
    assert t.chunk_for_step(3) == 16  # fastest per token
    assert t.chunk_for_step(10) == 8  # next tuning round starts


def test_deferral_histogram_shares():
    h = deferral_histogram(Counter({0: 6, 1: 3, 4: 1}))
    assert h["0"] == 0.6 and h["1"] == 0.3 and h["2"] == 0.0 and h["3+"] == 0.1
    assert abs(h["mean"] - (3 + 4) / 10) < 1e-9
