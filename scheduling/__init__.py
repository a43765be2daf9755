"""Platform scheduling: job model, the JobView information boundary, base policies, the
early-stop wrapper, the discrete-event engine, workloads, metrics and experiments.

Plain Python (numpy, scipy): no Prefect or MLflow here.
"""
