"""A job's inputs: what it trains on and what scores it.

- `job_inputs.py`: one interface for the prompts, columns and references whichever task a job trains; the request's
  check of them (`check_inputs`); the job's data lineage.
- `datafiles.py`: a tenant's data files read into Arrow tables and checked (file, line and column of what is wrong).
- `synthetic_task.py`: the synthetic "balanced text" task, its gold scorer and preference pairs.
- `tokenizer.py`: the tokenizer a config names (bytes, a checkpoint's, the task's BPE).
- `rewards/`: built-in reward functions, one module per data source.
- `scorers.py`: the reward that trains the job and the held-out gate that judges it, for function rewards.
- `tenant_code.py`: the pool that runs a tenant's own reward and gate functions outside the trainer;
  `tenant_launch.py` starts each worker, `tenant_worker.py` is what runs inside it, `sandbox.py` the bubblewrap
  sandbox around it (own PID and network namespaces, an unprivileged user, a read-only view).

Must not import: rollout, the models or the trainer (import-linter holds it), nor torch or transformers on the path
that checks a request: a bad data file is refused before the model stack loads.
"""
