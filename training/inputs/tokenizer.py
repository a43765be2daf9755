"""The tokenizer a job's config names (`tokenizer_for`, `make_tokenizer`, the `Tokenizer` wrapper every model and
engine uses): a checkpoint's own, the task's BPE, or ByT5's bytes (no files needed).

The task's BPE tokenizer (`task.tokenizer: bpe`): a byte-level BPE of `task.vocab_size` ids trained locally with
the `tokenizers` library on text of the task's kind, so nothing is downloaded and the output layer of a model is a
real share of a decode step (the byte tokenizer's 259 ids are not: at hidden 896 its output layer is 0.2M
multiply-adds per token against a 32k vocabulary's 29M).

The text: `CORPUS_CHARS` characters of "prompt answer" lines drawn like the task's corpus
(training/inputs/synthetic_task.py: the
task's prompts, answers of random words whose length follows the task's length distribution and whose vowel share
follows `vowel_beta`), from a fixed seed: the tokenizer belongs to the task, not to a run's seed. Random words of
2-7 letters make a rich enough text for 32k merges: there are 17,576 three-letter strings alone, and at 4M
characters a 32k vocabulary is reached with every merge seen at least `MIN_FREQUENCY` times
(tests/training/test_tokenizer.py checks the size). Byte-level, so any text round-trips.

Built once per task text and vocabulary, cached as `cache_dir/bpe-<key>.json` (the key hashes the fields that shape
the text, the vocabulary size, this module's and the task's code and the `tokenizers` version) and wrapped as a
`transformers` fast tokenizer, so `Tokenizer` and checkpoints (`save_pretrained`) work unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from training.inputs.synthetic_task import CONSONANTS, answer_length, make_prompts
from training.job.config import TaskConfig, TrainConfig
from training.job.sizing import BYTE_VOCAB

#: characters of text the BPE is trained on (about 6 s of text generation and 10-30 s of training on 2 cores)
CORPUS_CHARS = 4_000_000
CORPUS_SEED = 0
MIN_FREQUENCY = 2
PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
#: the task fields that shape the tokenizer's text
TEXT_FIELDS = ("n_train_prompts", "n_heldout_prompts", "long_prompt_frac", "prompt_words", "short_mean_len",
               "long_mean_len", "length_dist", "length_sigma", "vowel_beta")

_VOWEL_BYTES = np.frombuffer(b"aeiou", dtype=np.uint8)
_CONSONANT_BYTES = np.frombuffer(CONSONANTS.encode(), dtype=np.uint8)


def _answer(length: int, vowel_p: float, rng: np.random.Generator) -> str:
    """Random words of 2-7 letters, each letter a vowel with probability `vowel_p`, cut at `length` characters (the
    corpus answer of training/inputs/synthetic_task.py `corpus_response`, drawn in bulk)."""
    lens = rng.integers(2, 8, size=length // 2 + 2)
    n_words = int(np.searchsorted(np.cumsum(lens + 1), length)) + 1
    lens = lens[:n_words]
    total = int(lens.sum())
    letters = np.where(rng.random(total) < vowel_p, _VOWEL_BYTES[rng.integers(5, size=total)],
                       _CONSONANT_BYTES[rng.integers(len(_CONSONANT_BYTES), size=total)])
    out = np.full(total + n_words - 1, ord(" "), dtype=np.uint8)
    word_start = np.cumsum(lens + 1) - (lens + 1)  # in the text, one space between words
    letter_start = np.cumsum(lens) - lens  # in `letters`
    out[np.repeat(word_start - letter_start, lens) + np.arange(total)] = letters
    return out.tobytes().decode()[:length].strip() or "a"


def tokenizer_text(task: TaskConfig, chars: int | None = None) -> list[str]:
    """"prompt answer" lines of the task's kind, `chars` (default CORPUS_CHARS) characters in all (deterministic)."""
    chars = CORPUS_CHARS if chars is None else chars
    prompts = make_prompts(task, CORPUS_SEED).train
    rng = np.random.default_rng([CORPUS_SEED, 505])
    lines, total = [], 0
    while total < chars:
        prompt = prompts[int(rng.integers(len(prompts)))]
        line = f"{prompt} {_answer(answer_length(prompt, task, rng), float(rng.beta(*task.vowel_beta)), rng)}"
        lines.append(line)
        total += len(line) + 1
    return lines


def tokenizer_key(task: TaskConfig) -> str:
    import tokenizers

    from training.inputs import synthetic_task as task_module

    digest = hashlib.sha256()
    for source in (Path(__file__), Path(task_module.__file__)):
        digest.update(source.read_bytes())
    blob = json.dumps([task.model_dump(include=set(TEXT_FIELDS)), task.vocab_size, CORPUS_CHARS, CORPUS_SEED,
                       MIN_FREQUENCY, tokenizers.__version__, digest.hexdigest()], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def train_bpe(task: TaskConfig, chars: int | None = None):
    """A `tokenizers.Tokenizer`: byte-level BPE of `task.vocab_size` ids (pad, eos, unk first) on the task's text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=task.vocab_size, min_frequency=MIN_FREQUENCY,
                                  special_tokens=[PAD, EOS, UNK], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(tokenizer_text(task, chars), trainer)
    return tok


def bpe_tokenizer(task: TaskConfig, cache_dir: str | Path):
    """The task's BPE as a transformers fast tokenizer, trained once and cached under `cache_dir`."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    path = Path(cache_dir) / f"bpe-{tokenizer_key(task)}.json"
    if path.is_file():
        tok = Tokenizer.from_file(str(path))
    else:
        tok = train_bpe(task)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tok.save(str(tmp))
        os.replace(tmp, path)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK,
                                   clean_up_tokenization_spaces=False)


class Tokenizer:
    """Thin wrapper: ids in, ids out, with the pad/eos ids the engine needs."""

    def __init__(self, hf_tokenizer):
        self.hf = hf_tokenizer
        #: ByT5's bytes: one id per UTF-8 byte (a prompt's count needs no tokenizer call)
        self.byte_level = type(hf_tokenizer).__name__ == "ByT5Tokenizer"
        self.pad_id = hf_tokenizer.pad_token_id if hf_tokenizer.pad_token_id is not None else 0
        self.eos_id = hf_tokenizer.eos_token_id
        self.vocab_size = len(hf_tokenizer)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)


def make_tokenizer(path: str | None = None, task: TaskConfig | None = None,
                   cache_dir: str | Path | None = None) -> Tokenizer:
    """A checkpoint's own tokenizer (`path`); else the task's BPE (`task.tokenizer: bpe`, trained once and cached
    in `cache_dir`, training/inputs/tokenizer.py); else ByT5's bytes."""
    from transformers import AutoTokenizer, ByT5Tokenizer

    if path:
        tok = AutoTokenizer.from_pretrained(path)
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        return Tokenizer(tok)
    if task is not None and task.tokenizer == "bpe":
        if cache_dir is None:
            from training.job.config import default_cache_dir

            cache_dir = default_cache_dir()
        return Tokenizer(bpe_tokenizer(task, cache_dir))
    return Tokenizer(ByT5Tokenizer(extra_ids=0))


def tokenizer_for(cfg: TrainConfig) -> Tokenizer:
    """The tokenizer a job's config names (the policy checkpoint's, the task's BPE, or bytes)."""
    return make_tokenizer(cfg.policy.model_name_or_path, cfg.task, cfg.cache_dir)


class _ByteVocabulary:
    """What reading a data file asks of ByT5's tokenizer object (`Tokenizer.hf`): no chat template, its name and its
    size, which key the files read once per process (training/inputs/job_inputs.py `read_task_files`)."""

    chat_template = None
    name_or_path = ""

    def __len__(self) -> int:
        return BYTE_VOCAB


class ByteCounts:
    """The byte tokenizer as the check of a request counts with it: a prompt's tokens are its UTF-8 bytes, so the
    check needs no transformers (nor the torch it loads): a bad data file is refused in well under a second.
    tests/training/test_request_check_light.py holds it to `ByT5Tokenizer(extra_ids=0)`."""

    byte_level = True
    hf = _ByteVocabulary()


def counting_tokenizer(cfg: TrainConfig) -> Tokenizer | ByteCounts:
    """The tokenizer a request's check counts prompt tokens with: the job's own (`tokenizer_for`), or for the byte
    tokenizer (no checkpoint, no BPE) `ByteCounts`, which counts the same without loading transformers."""
    if not cfg.policy.model_name_or_path and cfg.task.tokenizer != "bpe":
        return ByteCounts()
    return tokenizer_for(cfg)
