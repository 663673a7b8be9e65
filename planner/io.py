"""Reading and writing problems and plans: JSON only, validated, written atomically.

Files are data, never code (no pickle). Every error names the file and the offending field
(``collectives[3].kind``), so a user can find it.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Collection, Iterator, TypeVar, Union

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
        text = _read_text(p)
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise SchemaError(f"{p}: cannot read {what}: {e}") from None
    if len(text) > MAX_FILE_BYTES:
        raise SchemaError(f"{p}: more than {MAX_FILE_BYTES} bytes once decompressed (limit of a {what} file)")
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


def _read_text(p: Path) -> str:
    """The file's text; a ``.gz`` file decompressed (the committed experiment problems are), read
    only up to one byte past the size limit so a compression bomb cannot fill memory."""
    if p.suffix != ".gz":
        return p.read_text(encoding="utf-8")
    with gzip.open(p, "rb") as fh:
        return fh.read(MAX_FILE_BYTES + 1).decode("utf-8")


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
    """``atomic_write_bytes`` of the text in UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write atomically: a temporary file in the same folder, fsync, then rename. A reader never
    sees a half-written file, and a failure leaves no temporary file behind."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        # mkstemp makes the file 0600; a result file gets the mode open() would give it
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
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


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask


def save(obj: Union[Problem, Plan], path: str | os.PathLike) -> Path:
    """Write a problem or plan as JSON, atomically; gzipped when the name ends in ``.gz`` (with
    no timestamp in the header, so the same content gives the same bytes)."""
    if str(path).endswith(".gz"):
        return atomic_write_bytes(path, gzip.compress(dumps(obj).encode("utf-8"), mtime=0))
    return atomic_write_text(path, dumps(obj))


def check_replaceable(path: str | os.PathLike, owned: Collection[str] | None = None) -> Path:
    """The folder ``replace_dir_atomically`` would replace (a symlink resolved: the folder it names
    is replaced and the link keeps pointing there), or OSError saying why it must not be.

    Replacing a folder deletes everything in it, where writing into it kept what was there:
    ``-o .`` or ``-o ~`` must not wipe a user's files. So ``path`` must be absent or a folder
    holding only names in ``owned`` (what the command itself writes; None: anything), and must
    not be the current folder or one above it (renaming it away would pull the working
    directory out from under the process)."""
    p = Path(path).absolute()
    if p.is_symlink():
        p = p.resolve()
    if not p.exists():
        return p
    if not p.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "exists and is not a folder", str(path))
    here = Path.cwd().resolve()
    if p.resolve() == here or p.resolve() in here.parents:
        raise IsADirectoryError(errno.EISDIR, "is the current folder or contains it; give a folder of its own",
                                str(path))
    if owned is not None:
        foreign = sorted(e.name for e in p.iterdir() if e.name not in owned)
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise FileExistsError(errno.EEXIST, f"holds files this command did not write ({shown}); it replaces "
                                  "the whole folder, so give a new or empty one", str(path))
    return p


@contextmanager
def replace_dir_atomically(path: str | os.PathLike, owned: Collection[str] | None = None) -> Iterator[Path]:
    """Yield a fresh, empty temporary folder beside ``path`` (``DIR.tmp-<pid>-<random>``); when
    the block completes, it becomes ``path``: the old folder is renamed aside, the new one renamed
    into place, the old one deleted. On any exception, KeyboardInterrupt included, the temporary
    folder is deleted and ``path`` is left exactly as it was.

    Why: a command that writes many files into one folder (``bucketplan compare -o DIR``) must
    never leave a mix of two runs -- a failed run's new traces beside the previous run's table.
    The folder is made in the same parent so that both renames stay on one filesystem (a rename
    is atomic there). ``check_replaceable(path, owned)`` is checked first, before the block runs:
    an existing ``path`` must hold only names in ``owned``. Only a process killed outright
    (SIGKILL, power loss) can leave the temporary folder behind; ``path`` is still whole then."""
    p = check_replaceable(path, owned)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = _fresh_dir(p, "tmp")
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    aside = None
    try:
        if p.exists():
            aside = _fresh_dir(p, "old")  # a free name; rename replaces an empty folder (POSIX)
            os.rename(p, aside)
        os.rename(tmp, p)
    except BaseException:
        if aside is not None and aside.exists():
            if p.exists():
                if not any(aside.iterdir()):  # the first rename failed: only the empty placeholder
                    aside.rmdir()
            else:  # interrupted between the renames: put the old folder back
                os.rename(aside, p)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _fresh_dir(p: Path, tag: str) -> Path:
    """A new, empty folder ``DIR.<tag>-<pid>-<random>`` beside ``p``. os.mkdir, not
    tempfile.mkdtemp: mkdtemp's mode 0700 would make the replaced folder private, where one
    made the usual way follows the umask."""
    import secrets

    while True:
        d = p.with_name(f"{p.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
