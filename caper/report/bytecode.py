"""Whether a .pyc the run wrote is what compiling its source gives.

Python runs a `__pycache__/<name>.<tag>.pyc` in place of its source when the
header's mtime and size match the source's (or without looking at the source
at all, for an unchecked hash-based pyc): bytecode is code, and the source
beside it says nothing of what runs. A .pyc is harmless only when its code
is the source's, compiled here the way the import system (or pytest's
assertion rewriting, for pytest's tag) compiles it, by this Python: the
marshalled code after the 16-byte header must be the same. Any other tag (a
Python caper is not), a pytest caper cannot import at that version, or a
source caper cannot read is not verifiable: the policy takes the .pyc for a
change of its source.
"""
from __future__ import annotations

import importlib.util
import marshal
import os
import sys

from caper.report.content import RunTree, read_blob

MAX_SOURCE_BYTES = 4 << 20
MAX_PYC_BYTES = 16 << 20
_HEADER = 16


def source_of(path: str) -> str | None:
    """The source a __pycache__ .pyc caches (`pkg/__pycache__/m.cpython-311.pyc`:
    `pkg/m.py`), or None for a path that is no such cache file."""
    parent, name = os.path.split(path)
    if os.path.basename(parent) != "__pycache__" or not name.endswith(".pyc"):
        return None
    stem = name.split(".", 1)[0]
    return os.path.join(os.path.dirname(parent), stem + ".py") if stem else None


def compiled(path: str, tree: RunTree) -> bool:
    """The run's version of the .pyc at path holds what compiling the run's
    version of its source gives (by this Python, for the tag in its name)."""
    source = source_of(path)
    if source is None:
        return False
    name = os.path.basename(path)
    tag = name[len(name.split(".", 1)[0]) + 1:-len(".pyc")]
    pyc, src = _run_version(path, tree, MAX_PYC_BYTES), _run_version(source, tree,
                                                                     MAX_SOURCE_BYTES)
    if pyc is None or src is None or len(pyc) < _HEADER or \
            pyc[:4] != importlib.util.MAGIC_NUMBER:
        return False
    try:
        code = _compile(src, source, tag)
    except Exception:       # the compiler or pytest's rewrite refused the run's source:
        return False        # nothing to compare, so not verified
    if code is None:
        return False
    if marshal.dumps(code) == pyc[_HEADER:]:
        return True
    # The same code under another file name (`python -m compileall .` names
    # `./m.py`): only tracebacks differ. Code objects compare by what runs.
    try:
        return marshal.loads(pyc[_HEADER:]) == code
    except (EOFError, ValueError, TypeError):
        return False


def _run_version(path: str, tree: RunTree, limit: int) -> bytes | None:
    """The file's bytes as the run left it (its layer, else the host's)."""
    where = tree.locate(path)
    for root, rel in ([where] if where else []) + [("/", path.lstrip("/"))]:
        if os.path.lexists(os.path.join(root, rel)):
            blob = read_blob(root, rel, limit)
            return blob.data if blob is not None and blob.complete else None
    return None


def _compile(source: bytes, path: str, tag: str):
    """The code object the import system, or pytest, makes of source for a
    .pyc of this tag; None for a tag this Python does not make."""
    base = sys.implementation.cache_tag
    if tag == base:
        return compile(source, path, "exec", dont_inherit=True, optimize=0)
    for level in (1, 2):
        if tag == f"{base}.opt-{level}":
            return compile(source, path, "exec", dont_inherit=True, optimize=level)
    if tag.startswith(base + "-pytest-"):
        try:
            import ast
            from _pytest.assertion import rewrite
        except ImportError:
            return None
        if tag != rewrite.PYTEST_TAG:
            return None
        tree = ast.parse(source, filename=path)
        rewrite.rewrite_asserts(tree, source, path, None)
        return compile(tree, path, "exec", dont_inherit=True)
    return None
