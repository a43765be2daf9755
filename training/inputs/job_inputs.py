"""The job's inputs, one interface whichever task it trains: its train and held-out prompts, the columns that go with
each prompt (to the reward and gate functions, as keyword lists), the text the model reads for a prompt, and the
reference completions of its warm start.

- `SyntheticInputs`: the synthetic "balanced text" task of training/inputs/synthetic_task.py (the default; every config
before
  tenant data runs on it unchanged): generated prompts, no columns, the task's corpus as the warm start.
- `DatasetInputs`: a tenant's own files (`task.kind: dataset`, read by training/inputs/datafiles.py): the `prompt_key`
  column is the prompt, `sft_key` (optional) the reference completion, every other column goes to the functions.

`job_inputs(cfg, tok)` builds the one a config names. A dataset's files are read once per process and kept (keyed by
path, size and modification time, and the reading settings), so the request's check before the job (which refuses
bad data before a slot is taken) and the trainer share one read.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.job.config import DatasetTaskConfig, TrainConfig

#: what a prompt becomes before the model reads it when there is no chat template: the synthetic task's prompts end
#: in a mark and the answer follows a space; a dataset's prompt is followed by a newline (GSM8K's question/answer)
SYNTHETIC_SEPARATOR = " "
DATASET_SEPARATOR = "\n"


@dataclass(frozen=True)
class DatasetLineage:
    """One file of the job as MLflow's dataset input wants it (name, digest, source, rows, context)."""

    name: str
    digest: str
    source: str
    rows: int
    context: str  # "training" or "eval"


class JobInputs:
    """The interface (see the module docstring). `split` is "train" or "heldout"; rows are indices into it."""

    kind: str = ""

    def __len__(self) -> int:  # train prompts
        return self.n_train

    n_train: int
    n_heldout: int

    def prompt(self, split: str, row: int) -> Any:
        """The prompt as the data has it (a string, or chat messages): what the functions receive."""
        raise NotImplementedError

    def render(self, prompt: Any) -> str:
        """The text the model reads for `prompt` (the chat template applied, or the prompt and a separator)."""
        raise NotImplementedError

    def columns(self, split: str, rows: list[int]) -> dict[str, list]:
        """Every other column of those rows, as keyword lists aligned with `rows` ({} for the synthetic task)."""
        return {}

    def reference(self, row: int) -> str | None:
        """The reference completion of train row `row` (the warm start), or None."""
        return None

    @property
    def has_references(self) -> bool:
        return False

    def lineage(self) -> list[DatasetLineage]:
        return []

    def heldout_prompts(self, rows: list[int] | range) -> list[Any]:
        return [self.prompt("heldout", i) for i in rows]


class SyntheticInputs(JobInputs):
    kind = "synthetic"

    def __init__(self, cfg: TrainConfig):
        from training.inputs.synthetic_task import make_prompts

        prompts = make_prompts(cfg.task, cfg.seed)
        self._split = {"train": prompts.train, "heldout": prompts.heldout}
        self.n_train, self.n_heldout = len(prompts.train), len(prompts.heldout)

    def prompt(self, split: str, row: int) -> str:
        return self._split[split][row]

    def render(self, prompt: Any) -> str:
        return str(prompt) + SYNTHETIC_SEPARATOR


class DatasetInputs(JobInputs):
    kind = "dataset"

    def __init__(self, task: DatasetTaskConfig, tok: Any, warn=print):
        self.task = task
        self.tok = tok
        self.template = task.chat_template == "auto" and bool(getattr(tok.hf, "chat_template", None))
        self.train, self.heldout = read_task_files(task, tok, warn)
        self.n_train, self.n_heldout = len(self.train), len(self.heldout)

    def _file(self, split: str):
        return self.train if split == "train" else self.heldout

    def prompt(self, split: str, row: int) -> Any:
        return self._file(split).prompt(row)

    def render(self, prompt: Any) -> str:
        return render_prompt(prompt, self.tok, self.template)

    def columns(self, split: str, rows: list[int]) -> dict[str, list]:
        return self._file(split).columns(list(rows))

    def reference(self, row: int) -> str | None:
        return self.train.sft(row)

    @property
    def has_references(self) -> bool:
        return self.task.sft_key is not None

    def lineage(self) -> list[DatasetLineage]:
        return [DatasetLineage(name=Path(f.path).name, digest=f.digest, source=str(f.path), rows=len(f), context=ctx)
                for f, ctx in ((self.train, "training"), (self.heldout, "eval"))]


def render_prompt(prompt: Any, tok: Any, template: bool) -> str:
    """A dataset prompt as the model reads it: with the tokenizer's chat template (a user turn and the generation
    prompt) when `template`, else the text (a chat-format prompt's contents, one per line) and a newline."""
    if isinstance(prompt, list):
        messages = [{"role": str(m.get("role", "user")), "content": str(m.get("content", ""))} for m in prompt]
    else:
        messages = [{"role": "user", "content": str(prompt)}]
    if template:
        return tok.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return "\n".join(m["content"] for m in messages) + DATASET_SEPARATOR


#: a checkpoint tokenizer's counter reads this many prompts at a time (Python strings for just these)
COUNT_BATCH = 8192
#: one prompt in this many is also rendered and counted the slow way (one template call each, the tokenizer's own
#: `__call__`): a check of the fast path's assumptions on the tenant's own data
CHECK_EVERY = 128
#: tokens a tokenizer may add to a piece of text between special tokens beyond one per byte of its normalized UTF-8
#: (a prefix space or marker its pre-tokenizer adds)
PIECE_SLACK = 2
#: normalizers that leave an ASCII text ASCII and no longer (the bound skips normalizing ASCII prompts for them)
_ASCII_SAFE = {"Sequence", "NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Strip", "StripAccents", "BertNormalizer"}
#: prompts whose rendering shows a chat template's fixed prefix and suffix (whitespace at both ends: a template that
#: trims the content gives itself away)
_PROBES = (" \n probe one\t", "Probe\n\ntwo  ")


class _Unchecked(Exception):
    """A sampled prompt disagreed with the fast path (see `token_counter`): count every prompt the slow way."""


def token_counter(tok: Any, template: bool, limit: int | None = None):
    """The prompt column's token counts as the model will see them (datafiles' `count_tokens`).

    The byte tokenizer without a template: UTF-8 bytes, vectorised. Any other tokenizer reads the prompts COUNT_BATCH
    at a time. The slow way renders each prompt (`render_prompt`) and calls the tokenizer on the batch. A fast
    (Rust-backed) tokenizer goes faster, which a 1,000,000-row file needs (the slow way took 80 s there on 2 cores):
    - text prompts under a chat template are its fixed prefix + prompt + suffix (found once from `_PROBES`), not one
      template call each;
    - with `limit` (task.max_prompt_tokens), only the prompts that may be over it are tokenized; the others get an
      upper bound of at most `limit`: a piece of text between special tokens takes at most one token per byte of its
      normalized UTF-8 plus PIECE_SLACK (a token covers at least one byte: byte-level BPE, SentencePiece's byte
      fallback, WordPiece), and a special token of the template's prefix or suffix one token for its bytes; so a count
      is exact wherever it is over;
    - the tokenizing is the Rust tokenizer's `encode_batch`, without the Python lists of ids `__call__` builds.
    One prompt in CHECK_EVERY is also counted the slow way; if its rendering, bound or count disagrees (a template that
    depends on the prompt, a tokenizer that breaks the bound's assumption, a subclass that encodes otherwise), the
    whole column is counted the slow way."""
    import numpy as np

    from training.inputs.datafiles import byte_token_counts

    if getattr(tok, "byte_level", False) and not template:
        return lambda column: byte_token_counts(column) + len(DATASET_SEPARATOR.encode())

    def hf_counts(texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros(0, dtype=np.int64)
        ids = tok.hf(texts, add_special_tokens=False)["input_ids"]
        return np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(texts))

    def slow(values: list) -> np.ndarray:
        return hf_counts([render_prompt(v, tok, template) for v in values])

    backend = getattr(tok.hf, "backend_tokenizer", None) if getattr(tok.hf, "is_fast", False) else None
    if backend is None or backend.truncation is not None or backend.padding is not None:
        return _batched(slow)
    affixes = _template_affixes(tok) if template else ("", DATASET_SEPARATOR)
    encode_special = bool(getattr(tok.hf, "split_special_tokens", False))
    norm = backend.normalizer
    kinds = set(re.findall(r'"type":\s*"(\w+)"', norm.__getstate__().decode())) if norm is not None else set()
    ascii_safe = kinds <= _ASCII_SAFE
    # what a fast-rendered text's bound takes off for its affixes' special tokens, and the slack of its pieces
    found, saved = _added_tokens_in(backend, "".join(affixes), encode_special) if affixes is not None else (0, 0)
    slack = {True: PIECE_SLACK * (found + 1) - saved, False: PIECE_SLACK}

    def nbytes(text: str) -> int:
        if text.isascii() and (norm is None or ascii_safe):
            return len(text)
        return len((norm.normalize_str(text) if norm is not None else text).encode())

    def fast(values: list) -> np.ndarray:
        rendered = [affixes is not None and isinstance(v, str) for v in values]
        texts = [affixes[0] + v + affixes[1] if r else render_prompt(v, tok, template)
                 for v, r in zip(values, rendered, strict=True)]
        checked = np.zeros(len(texts), dtype=bool)
        checked[::CHECK_EVERY] = True
        if limit is None:
            counts = np.zeros(len(texts), dtype=np.int64)
            exact = np.ones(len(texts), dtype=bool)
        else:
            counts = np.fromiter((nbytes(t) + slack[r] for t, r in zip(texts, rendered, strict=True)), dtype=np.int64,
                                 count=len(texts))
            exact = counts > limit
        rows = np.flatnonzero(exact | checked)
        if backend.encode_special_tokens != encode_special:
            backend.encode_special_tokens = encode_special  # as the tokenizer's own `__call__` sets it
        got = np.fromiter((len(e) for e in backend.encode_batch([texts[i] for i in rows], add_special_tokens=False)),
                          dtype=np.int64, count=len(rows))
        sample = np.flatnonzero(checked)
        sample_got = got[checked[rows]]
        if ([texts[i] for i in sample] != [render_prompt(values[i], tok, template) for i in sample]
                or not np.array_equal(sample_got, hf_counts([texts[i] for i in sample]))
                or (limit is not None and (sample_got > counts[sample]).any())):
            raise _Unchecked
        counts[rows] = got
        return counts

    fast_count, slow_count = _batched(fast), _batched(slow)

    def count(column) -> np.ndarray:
        try:
            return fast_count(column)
        except _Unchecked:
            return slow_count(column)

    return count


def _batched(per_batch):
    """`per_batch(prompts) -> counts` over a whole column, COUNT_BATCH prompts at a time."""
    import numpy as np

    def count(column) -> np.ndarray:
        out = np.empty(len(column), dtype=np.int64)
        k = 0
        for chunk in column.iterchunks():
            for lo in range(0, len(chunk), COUNT_BATCH):
                got = per_batch(chunk.slice(lo, COUNT_BATCH).to_pylist())
                out[k : k + len(got)] = got
                k += len(got)
        return out

    return count


def _added_tokens_in(backend: Any, text: str, encode_special: bool) -> tuple[int, int]:
    """(how many, bytes beyond one each) of the tokenizer's added tokens that `text` holds, matched longest first from
    the left as the tokenizer extracts them (special ones not when it encodes them as text; none that must stand as a
    word of their own, which may not match)."""
    added = [t for t in backend.get_added_tokens_decoder().values()
             if t.content and not t.single_word and not (encode_special and t.special)]
    contents = sorted({t.content for t in added}, key=len, reverse=True)
    found = saved = at = 0
    while at < len(text):
        match = next((c for c in contents if text.startswith(c, at)), None)
        if match is None:
            at += 1
            continue
        found += 1
        saved += len(match.encode()) - 1
        at += len(match)
    return found, saved


def _template_affixes(tok: Any) -> tuple[str, str] | None:
    """(prefix, suffix) such that the chat template renders a text prompt p as prefix + p + suffix, found from two
    probes; None when the probes show no such pair (the prompt trimmed, repeated or changed)."""
    found = set()
    for probe in _PROBES:
        text = render_prompt(probe, tok, True)
        if text.count(probe) != 1:
            return None
        at = text.index(probe)
        found.add((text[:at], text[at + len(probe) :]))
    return found.pop() if len(found) == 1 else None


_READ_LOCK = threading.Lock()


def read_task_files(task: DatasetTaskConfig, tok: Any, warn=print):
    """The (train, held-out) `training.inputs.datafiles.DataFile`s of a dataset task, read once per process for the same
    files and settings (see the module docstring); BadInput naming the file, line and column on bad data."""
    template = task.chat_template == "auto" and bool(getattr(tok.hf, "chat_template", None))
    files = []
    for field, path in (("task.train", task.train), ("task.heldout", task.heldout)):
        p = Path(path)
        stat = p.stat() if p.is_file() else None
        key = (str(p), stat.st_size if stat else -1, stat.st_mtime_ns if stat else -1, task.prompt_key, task.sft_key,
               task.max_prompt_tokens, template, tok.hf.name_or_path, len(tok.hf), field)
        with _READ_LOCK:
            files.append(_read(key, p, field, task, tok, template, warn))
    train, heldout = files
    from training.inputs.datafiles import overlap_count

    shared = overlap_count(train, heldout)
    if shared:
        warn(f"task.heldout: {shared} of its {len(heldout)} prompts also occur in task.train ('{train.path}'): the "
             "eval gate scores them on prompts training has seen (remove them from one file)")
    return train, heldout


#: files read in this process, newest last: key (path, size, mtime, reading settings) -> DataFile
_READ: dict[tuple, Any] = {}
_KEEP = 4


def _read(key, path, field, task, tok, template, warn):
    from training.inputs.datafiles import load_datafile

    if key in _READ:
        return _READ[key]
    sft_key = task.sft_key if field == "task.train" else None
    data = load_datafile(path, field, task.prompt_key, sft_key, task.max_prompt_tokens,
                         count_tokens=token_counter(tok, template, task.max_prompt_tokens), warn=warn)
    _READ[key] = data
    while len(_READ) > _KEEP:
        _READ.pop(next(iter(_READ)))
    return data


def job_inputs(cfg: TrainConfig, tok: Any, warn=print) -> JobInputs:
    """The inputs a job's config names: the synthetic task, or the tenant's data set."""
    if cfg.task.kind == "dataset":
        return DatasetInputs(cfg.task, tok, warn)
    return SyntheticInputs(cfg)


def warn_stderr(message: str) -> None:
    import sys

    print(f"warning: {message}", file=sys.stderr, flush=True)


def check_inputs(cfg: TrainConfig, warn=warn_stderr) -> None:
    """What the job's inputs name, read and validated before any work (the request's check: exit 2 from `train`, a
    deployment's run FAILED before it takes a slot): the reward and gate functions' files or modules exist, a data
    set's files read cleanly (training/inputs/datafiles.py: the file, line and column of what is wrong), and the gate
    has
    `eval_prompts` held-out prompts. The files read here stay read for the trainer (`read_task_files`)."""
    from common.errors import BadInput

    refs = tenant_refs(cfg)
    if refs:
        from training.inputs import sandbox

        sandbox.require()  # no working sandbox: refused here, before any slot (one line: the tool, how to install it)
    if cfg.task.kind != "dataset":
        _check_signatures(refs, {"train": [], "heldout": []})
        return
    from training.inputs.tokenizer import counting_tokenizer

    inputs = job_inputs(cfg, counting_tokenizer(cfg), warn)
    if cfg.eval_prompts > inputs.n_heldout:
        raise BadInput(f"eval_prompts: {cfg.eval_prompts} is more than the {inputs.n_heldout} prompts of task.heldout "
                       f"('{cfg.task.heldout}'): lower eval_prompts or add held-out prompts")
    _check_signatures(refs, {split: list(inputs.columns(split, [0])) if n else []
                             for split, n in (("train", inputs.n_train), ("heldout", inputs.n_heldout))})


def function_refs(cfg: TrainConfig) -> list[tuple[str, str, str]]:
    """(role, field, ref) of every function the job names: the reward's (one, or each of a list) and the gate's."""
    out = []
    if cfg.reward.kind == "function":
        refs = cfg.reward.refs
        out += [("reward", "reward.ref" if len(refs) == 1 else f"reward.ref[{i}]", r) for i, r in enumerate(refs)]
    if cfg.gate.kind == "function":
        out.append(("gate", "gate.ref", cfg.gate.ref))
    return out


def tenant_refs(cfg: TrainConfig) -> list[tuple[str, Any]]:
    """(role, FunctionRef) of the tenant's own functions (not built-ins), each checked to be defined (BadInput)."""
    from training.inputs import rewards

    out = []
    for role, field, text in function_refs(cfg):
        if rewards.builtin(text) is None:
            from training.inputs.scorers import check_defined
            from training.inputs.tenant_code import parse_ref

            ref = parse_ref(text, Path(cfg.config_dir) if cfg.config_dir else Path.cwd(), field)
            check_defined(ref)
            out.append((role, ref))
    return out


def _check_signatures(refs: list[tuple[str, Any]], columns: dict[str, list[str]]) -> None:
    from training.inputs.scorers import check_signature

    for role, ref in refs:
        check_signature(ref, columns["train" if role == "reward" else "heldout"])


#: the MLflow tag every job run carries with its training algorithm (`job_lineage`): ppo, grpo or rloo
ALGORITHM_TAG = "algorithm"
#: the tag a job with tenant code carries: the sandbox its functions ran in (`bwrap`, or `none` when the operator
#: switched it off with RLHFOPS_TENANT_SANDBOX=none)
SANDBOX_TAG = "tenant_code.sandbox"


def algorithm_params(cfg: TrainConfig) -> dict[str, Any]:
    """The training algorithm and the fields that say how it runs, as a job run's MLflow params (dotted as the config
    writes them, so `params.algorithm` and `params.ppo.group_size` read the same whichever entry point ran the job):
    `algorithm`, `ppo.group_size` (completions per prompt), `ppo.scale_rewards` (grpo's; ppo and rloo keep the
    default `group`, which they do not use) and `ppo.kl_in` (where the KL to the reference goes, when `ppo.kl_coef`
    pays one)."""
    return {"algorithm": cfg.algorithm, "ppo.group_size": cfg.ppo.group_size,
            "ppo.scale_rewards": cfg.ppo.scale_rewards, "ppo.kl_in": cfg.ppo.kl_in}


def job_lineage(cfg: TrainConfig) -> dict[str, Any]:
    """What an analyst filters runs by and what re-scoring a checkpoint needs: the data files (name, digest = the
    file's own sha256, source, rows, context `training` / `eval`) and tags: the training algorithm (`ALGORITHM_TAG`),
    the task kind, the reward's and the gate's kind and code hash (the function's own code and the definitions it uses
    in its file: `training.inputs.code_identity`), the held-out digest."""
    from training.inputs.scorers import function_identity

    tags: dict[str, str] = {ALGORITHM_TAG: cfg.algorithm, "task.kind": cfg.task.kind, "reward.kind": cfg.reward.kind,
                            "gate.kind": cfg.gate.kind}
    base = Path(cfg.config_dir) if cfg.config_dir else Path.cwd()
    hashes: dict[str, list[str]] = {"reward": [], "gate": []}
    tenant = False
    for role, field, text in function_refs(cfg):
        ref, code_hash = function_identity(text, base, field)
        hashes[role].append(code_hash)
        tenant = tenant or ref is not None
    for role in ("reward", "gate"):
        scorer = getattr(cfg, role)
        if scorer.kind == "function":
            from training.inputs.scorers import combined_hash

            refs = scorer.refs if role == "reward" else [scorer.ref]
            weights = scorer.weight_list if role == "reward" else [1.0]
            tags[f"{role}.ref"] = ",".join(refs)
            tags[f"{role}.code_hash"] = combined_hash(hashes[role], weights)
            if len(refs) > 1:
                tags[f"{role}.weights"] = ",".join(f"{w:g}" for w in weights)
        elif scorer.kind == "model":
            tags[f"{role}.path"] = scorer.path
    if tenant:  # where the tenant's code ran: bwrap, or none (the operator's RLHFOPS_TENANT_SANDBOX=none)
        from training.inputs import sandbox

        tags[SANDBOX_TAG] = sandbox.describe()
    if cfg.gate.kind == "gold":
        from training.inputs.scorers import gold_code_hash

        tags["gate.code_hash"] = gold_code_hash()
    datasets: list[DatasetLineage] = []
    if cfg.task.kind == "dataset":
        from training.inputs.tokenizer import tokenizer_for

        datasets = job_inputs(cfg, tokenizer_for(cfg), warn=lambda _m: None).lineage()
        tags["heldout.digest"] = next(d.digest for d in datasets if d.context == "eval")
    return {"datasets": datasets, "tags": tags}
