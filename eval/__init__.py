"""World feedback and run health: detectors (one interface for every time-series detector),
eval gates, the run-health catalog, run states and failure attribution.

Plain Python (numpy): no Prefect or MLflow here.
"""
