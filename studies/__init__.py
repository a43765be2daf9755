"""Detector studies: replays of the early-stop detectors over the recorded corpora and the simulator's
experiments, the reports they write (docs/detectors.md, docs/detector-selection.md, docs/detector-frontier.md),
the choice of the default detector's shape, its hindsight frontier and the paired rule's ceiling.

Reads `eval/` (the detectors, the corpus) and `scheduling/` (the experiments); plain Python (numpy, scipy,
pandas): no Prefect or MLflow here. Imported by the CLI and the nightly flow, never by `scheduling/` or `eval/`.
"""
