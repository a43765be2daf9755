"""`training.benches.profile_step.summarise` against counts written by hand into two py-spy raw files."""

from training.benches.profile_step import summarise

M = "thread (11): MainThread;<module> (profile_step.py:1);Trainer.train_step (trainer.py:2)"
S = "thread (12): oppo-scorer;Thread._bootstrap (threading.py:1);_ScorerThread._run (rollout.py:2)"

ALL = f"""\
{M};rollout (rollout.py:3);TransformersEngine.decode (engine.py:4);forward (modeling_llama.py:5) 60
{M};rollout (rollout.py:3);_ScorerThread.finish (rollout.py:6);Thread.join (threading.py:7)\
;Thread._wait_for_tstate_lock (threading.py:8) 10
{M};Trainer._ppo_update (trainer.py:9);backward (_tensor.py:10) 30
{S};IncrementalScorer.extend (engine.py:3);IncrementalScorer._forward (engine.py:4) 25
{S};Queue.get (queue.py:3);Condition.wait (threading.py:4) 75
thread (11): MainThread;<module> (profile_step.py:1);Trainer.__init__ (trainer.py:20) 40
thread (11): MainThread 7
"""
GIL = f"""\
{M};rollout (rollout.py:3);TransformersEngine.decode (engine.py:4) 45
{M};Trainer._ppo_update (trainer.py:9) 30
{S};IncrementalScorer.extend (engine.py:3) 25
thread (21): MainThread;<module> (profile_step.py:1);Trainer.__init__ (trainer.py:20) 33
"""


def test_summary_shares_by_thread_and_activity(tmp_path):
    (tmp_path / "all.txt").write_text(ALL)
    (tmp_path / "gil.txt").write_text(GIL)
    table = summarise(tmp_path / "all.txt", tmp_path / "gil.txt")
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line for line in table.splitlines()
            if line.startswith("| main") or line.startswith("| scorer")}
    # main thread: 60 decode, 10 waiting on join, 30 update of 100; GIL run: 45 + 30 + 25 = 100 samples
    assert rows["main thread", "decoding (actor)"].endswith("| 60.0% | 45.0% |")
    assert rows["main thread", "waiting (scorer queue, join)"].endswith("| 10.0% | 0.0% |")
    assert rows["main thread", "PPO update"].endswith("| 30.0% | 30.0% |")
    # scorer thread: 25 scoring, 75 waiting on its queue of 100
    assert rows["scorer thread", "scoring (ref, critic, reward prefill)"].endswith("| 25.0% | 25.0% |")
    assert rows["scorer thread", "waiting (scorer queue, join)"].endswith("| 75.0% | 0.0% |")
    # setup outside the steps (40 + 7 samples, 33 in the GIL run) is left out of every share
    assert "Trainer.__init__" not in table and "outside" not in table
    # GIL-holding samples 100 over main-thread samples 100, both inside the steps
    assert "GIL-holding samples / main-thread samples, inside the steps: 1.00" in table
