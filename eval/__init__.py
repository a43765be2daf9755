"""World feedback and run health: detectors (one interface for every time-series detector, listed by name
with the run-health alerts in `eval.registry`), calibration, the run-health catalog, run states and failure
attribution.

Plain Python (numpy): no Prefect or MLflow here.
"""
