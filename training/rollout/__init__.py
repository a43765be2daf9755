"""Rollout: how the actor's responses are generated and scored within one step.

- `engine.py`: the generation engine (transformers' decode with a KV cache) and the incremental scorers (reference,
  critic, reward model) that prefill a chunk at a time.
- `continuous.py`: the engine that keeps its decode batch full (a finished row's slot takes the next sequence): what
  decides the decode batch under inter-step overlap.
- `streaming.py`: one rollout, sequential or with intra-step streaming (scorers prefill while the actor decodes),
  and the `Sample` / `Sequence` records it yields.
- `controllers.py`: OPPO's online controllers: the overcommitment Delta and the chunk size.

Must not import: the trainer or the benches.
"""
