"""A job's life: what it asks for and how it runs from its first slot to its last checkpoint.

- `config.py`: the training config (pydantic), every field checked with its name; `sizing.py`: the sizes and memory a
  config implies, without building anything.
- `request.py`: `JobRequest`, validated once at the edge, and `build`, the one place a job's spec and supervisor are
  made.
- `device.py`: where the tensors live and in what precision.
- `lifecycle.py`: take slots, supervise every step, stop or pause at a checkpoint, keep the best, end the run state.
- `rundir.py`: one writer per run directory. `detector_spec.py`: the eval gate's detector as a request names it.

Must not import: the benches.
"""
