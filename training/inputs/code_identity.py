"""A function's identity: its own code and what it calls in its file, not its neighbours.

`function_identity(source, name)` hashes the module-level definition of `name` (a `def`, `async def`, class or
assignment) together with every module-level definition it references (functions, classes, constants, imports),
transitively within the file, each as its syntax tree (`ast.dump`: comments, blank lines and formatting do not
count; docstrings, decorators and default values do). Editing a reward function that lives in the same file as the
gate therefore leaves the gate's identity as it was, while editing the gate, a helper it calls or a constant it reads
changes it. Names the file does not define (builtins, attributes of imported modules) are outside the file and are
not followed: an imported module is identified by its import line only.

A file that does not parse, or that does not define `name` at module level, is identified by its bytes (the earlier
whole-file identity), so a hash always exists. Plain Python: no import of the tenant's code, which must never run in
the trainer's process.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

#: written into every function identity: a change of how identities are made changes them all, visibly
SCHEME = "fn-ast-v1"


def _defined_names(node: ast.stmt) -> list[str]:
    """The module-level names a statement binds."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, ast.Import | ast.ImportFrom):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    return []


def _referenced_names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def function_closure(source: str, name: str) -> list[ast.stmt] | None:
    """The module-level statements `name` consists of and depends on within `source`, in file order; None when the
    source does not parse or defines no `name` at module level."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    defs: dict[str, list[ast.stmt]] = {}
    for stmt in tree.body:
        for bound in _defined_names(stmt):
            defs.setdefault(bound, []).append(stmt)
    if name not in defs:
        return None
    seen: set[str] = set()
    todo = [name]
    picked: dict[int, ast.stmt] = {}
    while todo:
        current = todo.pop()
        if current in seen or current not in defs:
            continue
        seen.add(current)
        for stmt in defs[current]:
            if id(stmt) not in picked:
                picked[id(stmt)] = stmt
                todo.extend(_referenced_names(stmt) - seen)
    order = {id(s): i for i, s in enumerate(tree.body)}
    return sorted(picked.values(), key=lambda s: order[id(s)])


def function_identity(source: str | bytes, name: str) -> str:
    """sha256 hex (first 16 characters, as the earlier file hashes) of function `name`'s closure in `source` (see the
    module docstring); the hash of the source's bytes when it has none."""
    data = source if isinstance(source, bytes) else source.encode()
    text = data.decode("utf-8", errors="replace")
    closure = function_closure(text, name)
    if closure is None:
        return hashlib.sha256(data).hexdigest()[:16]
    digest = hashlib.sha256(f"{SCHEME}\0{name}\0".encode())
    for stmt in closure:
        digest.update(ast.dump(stmt, annotate_fields=True, include_attributes=False).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def file_function_identity(path: str | Path, name: str) -> str:
    """`function_identity` of function `name` in the file at `path`."""
    return function_identity(Path(path).read_bytes(), name)


def ref_identity(ref, base_dir: str | Path | None = None) -> str:
    """The identity of a `training.inputs.tenant_code.FunctionRef`: its function's closure in its FILE.py, or in its
    package.module's source file (looked up as the ref was, from `base_dir`, default the working directory, without
    importing it); the ref's own whole-file hash when the source cannot be read here."""
    path = ref.file
    if path is None and ref.module:
        from training.inputs.tenant_code import _find_module

        spec = _find_module(ref.module, Path(base_dir) if base_dir else Path.cwd())
        origin = spec.origin if spec is not None and spec.has_location and spec.origin else None
        path = Path(origin) if origin else None
    if path is None or not Path(path).is_file():
        return ref.code_hash
    return file_function_identity(path, ref.name)
