"""A tenant's data files (`task.train`, `task.heldout` of a `kind: dataset` task), read into Arrow tables and checked.

What: `load_datafile` reads one file (.jsonl, .json, .parquet or .csv, by its extension) into a pyarrow Table, checks
it (the prompt column, the optional reference-completion column, every other column's name), counts each prompt's
tokens and drops the few over `task.max_prompt_tokens`, and hashes the file's bytes (the MLflow dataset digest).
`overlap_count` says how many held-out prompts also occur in train.

Why: a tenant's data is user input. Every problem is found here, before a slot or a GPU is taken, and raised as
`BadInput`: one line naming the field, the file, the line (jsonl, csv) or row index (json, parquet), the column and the
fix. And it must scale: a 1M-row file loads in seconds and a few hundred MiB (scripts/bench-datafiles), so the rows stay
in Arrow (columnar, parsed by pyarrow's multi-threaded readers, checked and counted with pyarrow.compute) and only the
rows a step uses become Python objects (`DataFile.columns(rows)`, `DataFile.prompt(i)`).

The good path reads the file twice, both streamed: once here in 1 MiB blocks (sha256, and for the text formats a
UTF-8 check: pyarrow keeps invalid bytes in a jsonl string column and makes a csv column binary, naming no line), then
by pyarrow. pyarrow's row numbers are relative to its parse block and skip blank lines, so the line of a problem is
found by a Python scan of the file, run only on the error path (and when naming the longest of dropped prompts).

Formats:
- .jsonl: one JSON object per line; blank lines are skipped. Each column keeps one kind of value (text, number, list..).
- .json: a top-level list of objects, `[{...}, ...]`. A wrapping object (`{"data": [...]}`) is refused, naming its
  keys: which key holds the rows would be a guess. Read with the json module, whose Python objects take ~0.5 KB a row:
  past a few hundred thousand rows use .jsonl or .parquet.
- .csv: a header line, then one record per row (quoted values may span lines); pyarrow infers each column's type, so
  a reference-completion column of whole numbers (`42`) is turned back into text.
- .parquet: as written.

A prompt is text or chat messages (a list of {"role", "content"} objects). Every column but the prompt reaches the
reward function as a keyword list (`fn(prompts, completions, **columns)`), so its name must be a Python identifier
and not one of the function's own parameters (`RESERVED_COLUMNS`).
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import json
import keyword
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.errors import BadInput

EXTENSIONS = (".jsonl", ".json", ".parquet", ".csv")
#: formats checked for UTF-8 before pyarrow reads them
TEXT_FORMATS = (".jsonl", ".json", ".csv")
#: the reward function's own parameters: TRL calls `fn(prompts=, completions=, completion_ids=, trainer_state=,
#: **columns)`, so a column by one of these names cannot be passed
RESERVED_COLUMNS = ("prompts", "completions", "completion_ids", "trainer_state", "log_metric", "log_extra")
BLOCK_BYTES = 1 << 20
_WS = re.compile(r"[ \t\r\n]*")


@dataclass
class DataFile:
    """One data file read and checked: `table` holds the rows kept (over-long prompts dropped)."""

    path: Path
    field: str  # "task.train" or "task.heldout" (for messages)
    table: pa.Table
    digest: str  # sha256 hex of the file's bytes, the MLflow dataset digest
    rows_read: int  # rows in the file
    dropped_long: int  # prompts dropped for exceeding max_prompt_tokens
    prompt_key: str = "prompt"
    sft_key: str | None = None

    def __len__(self) -> int:
        return self.table.num_rows

    def prompt(self, i: int) -> str | list[dict]:
        """Row i's prompt: its text, or its chat messages (keys whose value is null left out)."""
        value = self.table.column(self.prompt_key)[i].as_py()
        if isinstance(value, list):
            return [{k: v for k, v in m.items() if v is not None} for m in value]
        return value

    def sft(self, i: int) -> str | None:
        """Row i's reference completion (None without `sft_key`, or where the cell is null)."""
        return None if self.sft_key is None else self.table.column(self.sft_key)[i].as_py()

    def columns(self, rows: list[int]) -> dict[str, list]:
        """Every column except the prompt (the reference completion included), as Python lists for just `rows`."""
        picked = self.table.drop_columns([self.prompt_key]).take(pa.array(rows, type=pa.int64()))
        return picked.to_pydict()

    @property
    def column_names(self) -> list[str]:
        """Every column of the file, the prompt's included."""
        return self.table.column_names

    def content_digest(self) -> str:
        """sha256 hex of the rows kept, as values: the prompt and the reference completion (`sft_key`) of each row
        in order, each as JSON. The same rows give the same digest whatever the file's format, folder or name (`digest`,
        the file's bytes, differs between a JSON-lines and a Parquet copy): the warm-start cache's key."""
        cached = self.__dict__.get("_content_digest")
        if cached is not None:
            return cached
        digest = hashlib.sha256()
        names = [self.prompt_key] + ([self.sft_key] if self.sft_key else [])
        digest.update(json.dumps(names).encode())
        for batch in self.table.select(names).to_batches(max_chunksize=4096):
            for row in zip(*(batch.column(n).to_pylist() for n in names), strict=True):
                digest.update(json.dumps(row, sort_keys=True, ensure_ascii=False).encode())
                digest.update(b"\n")
        self.__dict__["_content_digest"] = out = digest.hexdigest()
        return out


# --- reading ------------------------------------------------------------------------------------------------------


def _q(path: Path) -> str:
    return f"'{path.name}'"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def read_table(path: Path, field: str) -> pa.Table:
    """The file's rows as an Arrow table, read by its extension; BadInput (one line) on a missing, empty, non-UTF-8 or
    unparsable file."""
    return _read(Path(path), field)[0]


def _read(path: Path, field: str) -> tuple[pa.Table, str, int]:
    """(table, sha256 hex of the bytes, lines in the file)."""
    if not path.is_file():
        what = "is a folder, not a file" if path.exists() else "does not exist"
        raise BadInput(f"{field}: '{path}' {what} (paths are relative to the config file's folder)")
    suffix = path.suffix.lower()
    if suffix not in EXTENSIONS:
        raise BadInput(f"{field}: {_q(path)} has an unknown extension '{path.suffix}': give a .jsonl, .json, .parquet "
                       "or .csv file")
    if path.stat().st_size == 0:
        raise BadInput(f"{field}: {_q(path)} is empty (0 bytes): give it rows, or point {field} at the data file")
    digest, lines = _scan_bytes(path, field, text=suffix in TEXT_FORMATS)
    table = _READERS[suffix](path, field)
    if table.num_rows == 0:
        header = " (only a header)" if suffix == ".csv" else ""
        raise BadInput(f"{field}: {_q(path)} has no rows{header}: give it rows, or point {field} at the data file")
    return table, digest, lines


def _scan_bytes(path: Path, field: str, text: bool) -> tuple[str, int]:
    """(sha256 hex, lines) of the file, streamed in 1 MiB blocks; `text`: BadInput at the first byte that is not
    UTF-8, naming its line (the newlines before it, plus one)."""
    digest = hashlib.sha256()
    decoder = codecs.getincrementaldecoder("utf-8")() if text else None
    pos = newlines = pending = 0
    last = b""
    with path.open("rb") as f:
        while block := f.read(BLOCK_BYTES):
            digest.update(block)
            if decoder is not None:
                pending = len(decoder.getstate()[0])  # bytes of a character cut by the previous block's end
                try:
                    decoder.decode(block)
                except UnicodeDecodeError as err:
                    offset = pos - pending + err.start
                    line = newlines + block[: max(0, offset - pos)].count(b"\n") + 1
                    raise _not_utf8(path, field, line, offset, err) from None
                pending = len(decoder.getstate()[0])
            newlines += block.count(b"\n")
            pos += len(block)
            last = block[-1:]
    if decoder is not None:
        try:
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as err:  # the file ends inside a character
            raise _not_utf8(path, field, newlines + 1, pos - pending + err.start, err) from None
    return digest.hexdigest(), newlines + (last != b"\n")


def _not_utf8(path: Path, field: str, line: int, offset: int, err: UnicodeDecodeError) -> BadInput:
    return BadInput(f"{field}: {_q(path)} line {line} is not UTF-8 text (byte {offset}: {err.reason}): save the file "
                    "as UTF-8")


def _read_jsonl(path: Path, field: str) -> pa.Table:
    import pyarrow.json as pajson

    try:
        return pajson.read_json(path)
    except pa.ArrowInvalid as err:
        problem = _jsonl_problem(path)
        if problem is None:  # pyarrow's row number counts from its block: leave it out
            reason = _one_line(re.sub(r" in row -?\d+", "", str(err)))
            problem = (f"could not be read as JSON lines ({reason}): give one JSON object per line, with one kind "
                       "of value in each column")
        raise BadInput(f"{field}: {_q(path)} {problem}") from None


class _Problem(Exception):
    """Where a file's scan stopped, and why (becomes a BadInput's message)."""


def _jsonl_objects(path: Path) -> Iterator[tuple[int, object]]:
    """(line, object) for every JSON value of a .jsonl file, as pyarrow splits them (several on one line are several
    rows, blank lines none); _Problem at the first line that is not JSON."""
    decoder = json.JSONDecoder()
    with path.open(encoding="utf-8-sig", newline="\n") as f:
        for lineno, line in enumerate(f, 1):
            pos = _WS.match(line).end()
            while pos < len(line):
                try:
                    obj, end = decoder.raw_decode(line, pos)
                except json.JSONDecodeError as err:
                    raise _Problem(f"line {lineno} is not valid JSON ({err.msg}, column {err.colno}): fix that line "
                                   "(JSON lines: one object per line)") from None
                yield lineno, obj
                pos = _WS.match(line, end).end()


def _kind(value: object) -> str | None:
    """The kind of a JSON value as a column sees it (None for null, which goes with any kind)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, dict):
        return "an object"
    inner = next((k for k in map(_kind, value) if k is not None), None)
    return f"a list of {inner.removeprefix('a ').removeprefix('an ')}" if inner else "a list"


def _kind_change(kinds: dict, row: object, where: str) -> str | None:
    """The message when a value of `row` (one object) is of another kind than its column's earlier values."""
    if not isinstance(row, dict):
        return f"{where} holds {_kind(row) or 'null'}, not a JSON object: give one object per row"
    for key, value in row.items():
        kind = _kind(value)
        if kind is None:
            continue
        seen = kinds.setdefault(key, (kind, where))
        if "a list" in (seen[0], kind) and seen[0].startswith("a list") and kind.startswith("a list"):
            if seen[0] == "a list":  # an empty list goes with any list: keep the first one whose items say more
                kinds[key] = (kind, where)
        elif seen[0] != kind:
            return (f"{where}: column '{key}' holds {kind}, but {seen[1]} holds {seen[0]}: give every row the same "
                    "kind of value in a column")
    return None


def _jsonl_problem(path: Path) -> str | None:
    """The first line pyarrow cannot read (invalid JSON, not an object, a column's kind changing), else None."""
    kinds: dict = {}
    try:
        for lineno, obj in _jsonl_objects(path):
            if problem := _kind_change(kinds, obj, f"line {lineno}"):
                return problem
    except _Problem as p:
        return str(p)
    return None


def _read_json(path: Path, field: str) -> pa.Table:
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as err:
        raise BadInput(f"{field}: {_q(path)} line {err.lineno} column {err.colno} is not valid JSON ({err.msg}): fix "
                       "it there") from None
    if isinstance(data, dict):
        keys = ", ".join(list(data)[:8]) or "none"
        raise BadInput(f"{field}: {_q(path)} holds a JSON object (keys: {keys}), not a list of rows: write the list "
                       "itself ([{...}, ...]), or one object per line as .jsonl")
    if not isinstance(data, list):
        raise BadInput(f"{field}: {_q(path)} holds {_kind(data) or 'null'}, not a list of rows: write a list of "
                       "objects ([{...}, ...])")
    if not data:
        return pa.table({})
    try:
        return pa.Table.from_struct_array(pa.array(data))
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        kinds: dict = {}
        for i, row in enumerate(data):
            if problem := _kind_change(kinds, row, f"row index {i}"):
                raise BadInput(f"{field}: {_q(path)} {problem}") from None
        raise BadInput(f"{field}: {_q(path)} could not be read as rows ({_one_line(err)}): give a list of objects "
                       "with one kind of value in each column") from None


def _csv_records(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(first line, fields) of every record of a .csv file, the header's included, blank lines skipped."""
    with path.open(encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        end = 0
        try:
            for record in reader:
                start, end = end + 1, reader.line_num
                if record:
                    yield start, record
        except csv.Error as err:
            raise _Problem(f"line {reader.line_num} is not valid CSV ({err}): fix that line") from None


def _read_csv(path: Path, field: str) -> pa.Table:
    import pyarrow.csv as pacsv

    try:
        return pacsv.read_csv(path, parse_options=pacsv.ParseOptions(newlines_in_values=True))
    except pa.ArrowInvalid as err:
        problem = None
        try:
            header = None
            for line, record in _csv_records(path):
                if header is None:
                    header = record
                elif len(record) != len(header):
                    problem = (f"line {line} has {len(record)} fields but the header has {len(header)}: quote the "
                               "values that hold commas, or fix that line")
                    break
        except _Problem as p:
            problem = str(p)
        problem = problem or f"could not be read as CSV ({_one_line(err)}): fix the file"
        raise BadInput(f"{field}: {_q(path)} {problem}") from None


def _read_parquet(path: Path, field: str) -> pa.Table:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        raise BadInput(f"{field}: {_q(path)} is not a readable Parquet file ({_one_line(err)}): write it with pyarrow "
                       "or pandas' to_parquet, or give .jsonl") from None


_READERS: dict[str, Callable[[Path, str], pa.Table]] = {".jsonl": _read_jsonl, ".json": _read_json,
                                                         ".csv": _read_csv, ".parquet": _read_parquet}


def _where(path: Path, row: int, lines: int, rows: int) -> str:
    """Row `row` (0-based, of the file) as the user finds it: its 1-based line (jsonl, csv), else its row index.
    A Python scan of the file unless a .jsonl file has exactly one row per line."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".jsonl":
            if lines == rows:
                return f"line {row + 1}"
            for k, (line, _) in enumerate(_jsonl_objects(path)):
                if k == row:
                    return f"line {line}"
        if suffix == ".csv":
            for k, (line, _) in enumerate(_csv_records(path)):
                if k == row + 1:  # the header is record 0
                    return f"line {line}"
    except _Problem:
        pass
    return f"row index {row}"


# --- checking -----------------------------------------------------------------------------------------------------


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_chat(t: pa.DataType) -> bool:
    """A list of structs with text `role` and `content` fields (others allowed)."""
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_struct(t.value_type):
        return False
    fields = {f.name: f.type for f in t.value_type}
    return all(k in fields and _is_text(fields[k]) for k in ("role", "content"))


def _check_names(path: Path, field: str, names: list[str], prompt_key: str, sft_key: str | None) -> None:
    for key, setting in ((prompt_key, "task.prompt_key"), (sft_key, "task.sft_key")):
        if key is not None and key not in names:
            raise BadInput(f"{field}: {_q(path)} has no column '{key}' ({setting}); its columns: {', '.join(names)}")
    for name in names:
        if name == prompt_key:
            continue
        if not name.isidentifier() or keyword.iskeyword(name):
            why = "is a Python keyword" if keyword.iskeyword(name) else "is not a Python identifier"
            raise BadInput(f"{field}: {_q(path)} column '{name}' {why}, so it cannot reach the reward function as a "
                           "keyword argument: rename it (letters, digits and _, not starting with a digit)")
        if name in RESERVED_COLUMNS:
            raise BadInput(f"{field}: {_q(path)} column '{name}' clashes with the reward function's own parameter "
                           f"'{name}' (fn(prompts, completions, **columns)): rename the column")


def _per_row_sum(lists: pa.Array, per_value: np.ndarray) -> np.ndarray:
    """For a list array, the sum of `per_value` (one number per element of its child array) over each row's elements
    (0 for a null row), from the offsets: vectorised, and right for a sliced array."""
    offsets = lists.offsets.to_numpy()
    cum = np.concatenate(([0], np.cumsum(per_value, dtype=np.int64)))
    out = cum[offsets[1:]] - cum[offsets[:-1]]
    if lists.null_count:
        out[lists.is_null().to_numpy(zero_copy_only=False)] = 0
    return out


def _first_empty(prompts: pa.ChunkedArray) -> tuple[int, str] | None:
    """(row, what is wrong) of the first prompt that is null, empty or blank (chat: no messages, or a message without
    a role or content), else None."""
    if pa.types.is_null(prompts.type):
        return 0, "is empty"
    if _is_text(prompts.type):
        empty = pc.fill_null(pc.or_(pc.equal(pc.binary_length(prompts), 0), pc.utf8_is_space(prompts)), True)
        row = pc.index(empty, True).as_py()
        return (row, "is empty") if row >= 0 else None
    start = 0
    for chunk in prompts.iterchunks():
        messages = chunk.values
        incomplete = pc.or_(pc.is_null(pc.struct_field(messages, "role")),
                            pc.is_null(pc.struct_field(messages, "content"))).to_numpy(zero_copy_only=False)
        bad = _per_row_sum(chunk, incomplete) > 0
        empty = pc.fill_null(pc.equal(pc.list_value_length(chunk), 0), True).to_numpy(zero_copy_only=False)
        if (empty | bad).any():
            row = int(np.flatnonzero(empty | bad)[0])
            return start + row, "has no messages" if empty[row] else "has a message without a role or content"
        start += len(chunk)
    return None


def _checked_sft(table: pa.Table, path: Path, field: str, sft_key: str) -> pa.Table:
    """The table with the reference-completion column as text (whole numbers, as csv infers `42`, turned to text)."""
    column = table.column(sft_key)
    if _is_text(column.type) or pa.types.is_null(column.type):
        return table
    if pa.types.is_integer(column.type):
        return table.set_column(table.column_names.index(sft_key), sft_key, pc.cast(column, pa.string()))
    raise BadInput(f"{field}: {_q(path)} column '{sft_key}' (task.sft_key) holds {column.type}, not text: point "
                   "task.sft_key at the reference completions")


def byte_token_counts(prompts: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """UTF-8 bytes per prompt (the byte tokenizer's count), vectorised; for chat prompts the sum of the messages'
    contents' bytes; 0 for a null."""
    chunks = prompts.chunks if isinstance(prompts, pa.ChunkedArray) else [prompts]
    out = []
    for chunk in chunks:
        if _is_chat(chunk.type):
            content = pc.struct_field(chunk.values, "content")
            lengths = pc.fill_null(pc.binary_length(content), 0).to_numpy(zero_copy_only=False)
            out.append(_per_row_sum(chunk, lengths))
        else:
            out.append(pc.fill_null(pc.binary_length(chunk), 0).to_numpy(zero_copy_only=False).astype(np.int64))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def load_datafile(path: Path, field: str, prompt_key: str, sft_key: str | None, max_prompt_tokens: int,
                  count_tokens: Callable[[pa.ChunkedArray], np.ndarray] | None = None,
                  warn: Callable[[str], None] = print, max_long_frac: float = 0.01) -> DataFile:
    """Read and check one data file (see the module docstring); BadInput, one line, on bad data, before any work.

    Prompts over `max_prompt_tokens` (counted by `count_tokens`, default `byte_token_counts`) are dropped with one
    `warn` line, unless they are more than `max_long_frac` of the file: then BadInput."""
    path = Path(path)
    table, digest, lines = _read(path, field)
    n = table.num_rows
    _check_names(path, field, table.column_names, prompt_key, sft_key)
    prompts = table.column(prompt_key)
    if not (_is_text(prompts.type) or _is_chat(prompts.type) or pa.types.is_null(prompts.type)):
        raise BadInput(f"{field}: {_q(path)} column '{prompt_key}' (task.prompt_key) holds {prompts.type}, not text or "
                       "chat messages (a list of {role, content} objects): point task.prompt_key at the prompts")
    if empty := _first_empty(prompts):
        row, what = empty
        raise BadInput(f"{field}: {_q(path)} {_where(path, row, lines, n)}: column '{prompt_key}' {what}: give every "
                       "row a prompt, or remove that row")
    if sft_key is not None:
        table = _checked_sft(table, path, field, sft_key)
    counts = np.asarray((count_tokens or byte_token_counts)(prompts))
    if counts.shape != (n,):
        raise ValueError(f"count_tokens gave {counts.shape} counts for {n} prompts")
    long = counts > max_prompt_tokens
    n_long = int(long.sum())
    if n_long:
        worst = int(np.argmax(counts))
        longest = f"the longest is {int(counts[worst])} tokens at {_where(path, worst, lines, n)}"
        if n_long > max_long_frac * n:
            raise BadInput(f"{field}: {_q(path)} has {n_long} of {n} prompts ({n_long / n:.1%}) over "
                           f"task.max_prompt_tokens={max_prompt_tokens} tokens, more than the {max_long_frac:.0%} "
                           f"dropped with a warning: raise task.max_prompt_tokens or shorten the prompts; {longest}")
        warn(f"{field}: {_q(path)}: dropped {n_long} of {n} prompts over task.max_prompt_tokens={max_prompt_tokens} "
             f"tokens ({longest})")
        table = table.filter(pa.array(~long))
    return DataFile(path=path, field=field, table=table, digest=digest, rows_read=n, dropped_long=n_long,
                    prompt_key=prompt_key, sft_key=sft_key)


# --- overlap ------------------------------------------------------------------------------------------------------


def _netstring(values: pa.Array) -> list[pa.Array]:
    """The pieces of `len:value` for each value (bytes), so that joined keys cannot collide."""
    values = pc.cast(values, pa.large_string())
    lengths = pc.cast(pc.cast(pc.binary_length(values), pa.int64()), pa.large_string())
    return [lengths, pa.scalar(":", pa.large_string()), values]


def _prompt_keys(prompts: pa.ChunkedArray) -> pa.ChunkedArray:
    """One text per prompt, equal exactly when the prompts are: each message as `len:role len:content` joined; a text
    prompt as its lone user message (so "hi" and [{"role": "user", "content": "hi"}] are the same prompt)."""
    out = []
    sep = pa.scalar("", pa.large_string())
    for chunk in prompts.iterchunks():
        if _is_chat(chunk.type):
            role, content = (pc.struct_field(chunk.values, k) for k in ("role", "content"))
            messages = pc.binary_join_element_wise(*_netstring(role), *_netstring(content), sep)
            lists = pa.LargeListArray.from_arrays(pc.cast(chunk.offsets, pa.int64()), messages)
            out.append(pc.binary_join(lists, sep))
        else:
            out.append(pc.binary_join_element_wise(pa.scalar("4:user", pa.large_string()), *_netstring(chunk), sep))
    return pa.chunked_array(out, type=pa.large_string())


def overlap_count(train: DataFile, heldout: DataFile) -> int:
    """Held-out rows whose prompt also occurs in train (a hash join: pyarrow.compute.is_in on the prompts' keys)."""
    train_keys = _prompt_keys(train.table.column(train.prompt_key)).combine_chunks()
    held_keys = _prompt_keys(heldout.table.column(heldout.prompt_key))
    return int(pc.sum(pc.is_in(held_keys, value_set=train_keys)).as_py() or 0)
