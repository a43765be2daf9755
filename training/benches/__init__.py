"""The benches and checks that measure the trainer: `oppo.py` (`rlhfops bench oppo`), `gain.py` (`bench gain`),
`baseline.py` (a bench's settings and its baseline, checked before torch loads), `profile_step.py` (py-spy
profiles), `gpu_check.py` (the one-command GPU check) and `canaries.py` (fault-injection runs).

They sit above the rest of `training/`: nothing in it imports them (import-linter holds it).
"""
