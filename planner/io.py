"""Reading and writing problems and plans: JSON only, validated, written atomically.

Files are data, never code (no pickle). Every error names the file and the offending field
(``collectives[3].kind``), so a user can find it.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import TypeVar, Union

from pydantic import BaseModel, ValidationError

from planner.problem import SCHEMA_VERSION, Plan, Problem

MAX_FILE_BYTES = 2 * 1024**3  # an 80-layer problem is a few MB; anything near this is not ours

M = TypeVar("M", bound=BaseModel)


class SchemaError(ValueError):
    """A problem or plan file that cannot be read; the message names the file and field."""


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _describe(err: ValidationError, limit: int = 5) -> str:
    lines = []
    for e in err.errors()[:limit]:
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "missing":
            msg = "missing field"
        elif e["type"] == "value_error" and "error" in e.get("ctx", {}):
            msg = str(e["ctx"]["error"])  # our validators' own words name the item; no "Value error, " prefix
            if not e["loc"]:  # a whole-model check: its message starts with the item's path
                lines.append(msg)
                continue
        lines.append(f"{_loc(e['loc'])}: {msg}")
    more = len(err.errors()) - limit
    if more > 0:
        lines.append(f"... and {more} more")
    return "; ".join(lines)


def _load(path: str | os.PathLike, model: type[M], what: str) -> M:
    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        raise SchemaError(f"{p}: cannot read {what}: {e.strerror}") from None
    # stat, not open: /dev/zero reads forever (MemoryError) and opening a FIFO blocks until a
    # writer comes; a directory or device is no problem or plan file either
    if not stat.S_ISREG(st.st_mode):
        raise SchemaError(f"{p}: not a regular file (a {what} file is a JSON file)")
    size = st.st_size
    if size > MAX_FILE_BYTES:
        raise SchemaError(f"{p}: {size} bytes is too large for a {what} file (limit {MAX_FILE_BYTES})")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SchemaError(f"{p}: cannot read {what}: {e}") from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as e:
        raise SchemaError(f"{p}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                          f"truncated or not a {what} file?") from None
    except _DuplicateKey as e:
        raise SchemaError(f"{p}: key {e.args[0]!r} appears twice in one object (which one counts is ambiguous)") from None
    except RecursionError:
        raise SchemaError(f"{p}: JSON nested too deeply for a {what} file") from None
    if not isinstance(data, dict):
        raise SchemaError(f"{p}: a {what} file holds a JSON object, found {type(data).__name__}")
    if "schema_version" not in data:
        raise SchemaError(f"{p}: schema_version: missing field")
    version = data["schema_version"]
    if type(version) is not int or version != SCHEMA_VERSION:  # true == 1 and 1.0 == 1 in Python
        raise SchemaError(f"{p}: schema_version: {version!r} is not supported "
                          f"(this bucketplan reads version {SCHEMA_VERSION})")
    key = "fingerprint" if model is Problem else "problem_fingerprint"
    if not data.get(key):
        raise SchemaError(f"{p}: {key}: must be the problem's content fingerprint, not empty "
                          "(an empty one would switch the integrity check off)")
    try:
        # strict: "12" or true is not a number here, as in JSON; arrays are tuples
        return model.model_validate_json(text, strict=True)
    except ValidationError as e:
        raise SchemaError(f"{p}: invalid {what}: {_describe(e)}") from None


class _DuplicateKey(ValueError):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def load_problem(path: str | os.PathLike) -> Problem:
    return _load(path, Problem, "problem")


def load_plan(path: str | os.PathLike) -> Plan:
    return _load(path, Plan, "plan")


def dumps(obj: Union[Problem, Plan]) -> str:
    return obj.model_dump_json(indent=None)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write atomically: a temporary file in the same folder, fsync, then rename. A reader never
    sees a half-written file, and a failure leaves no temporary file behind."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return p


def save(obj: Union[Problem, Plan], path: str | os.PathLike) -> Path:
    """Write a problem or plan as JSON, atomically."""
    return atomic_write_text(path, dumps(obj))
