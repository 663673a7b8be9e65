"""Reading and writing problems and plans: JSON only, validated, written atomically.

Files are data, never code (no pickle). Every error names the file and the offending field
(``collectives[3].kind``), so a user can find it.
"""

from __future__ import annotations

import errno
import gzip
import io
import json
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Collection, Iterator, TypeVar, Union

from pydantic import BaseModel, ValidationError

from planner.core.problem import PLAN_SCHEMA_VERSIONS, PROBLEM_SCHEMA_VERSIONS, Plan, Problem

MAX_FILE_BYTES = 2 * 1024**3  # an 80-layer problem is a few MB; anything near this is not ours

M = TypeVar("M", bound=BaseModel)


class SchemaError(ValueError):
    """A problem or plan file that cannot be read; the message names the file and field."""


class BadFileError(ValueError):
    """A file the tools read or append to is not a regular file of bounded size (a FIFO, a
    device, a directory, a symlink to one, something huge) or cannot be opened; the one-line
    message names the file and says what it is."""


# bookkeeping files (index.jsonl, rows.jsonl, stages.json, a sweep spec) hold a line per graph
# or task; far beyond this is not ours, and reading it whole would only exhaust memory
BOOKKEEPING_MAX_BYTES = 64 * 1024**2

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _not_regular(path: Path, mode: int, what: str) -> BadFileError:
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    via = f", through a symlink to {os.path.realpath(path)}" if os.path.islink(path) else ""
    return BadFileError(f"{path}: not a regular file ({kind}{via}); cannot be the {what}")


def _open_regular(path: Path, flags: int, what: str) -> tuple[int, os.stat_result]:
    """``path`` opened with ``flags`` once it is known to be a regular file: stat first (it follows
    symlinks), so a FIFO is never opened (opening one blocks until a writer comes) and a device is
    never read (/dev/zero reads without end); O_NONBLOCK and a second check on the open file
    cover a file swapped for one of them in between. Missing: FileNotFoundError."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise BadFileError(f"{path}: cannot read the {what} ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, st.st_mode, what)
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise BadFileError(f"{path}: cannot open the {what} ({e.strerror})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _not_regular(path, st.st_mode, what)
    return fd, st


def read_regular_file(path: str | os.PathLike, max_bytes: int, what: str, *, missing_ok: bool = False) -> bytes | None:
    """The bytes of ``path``, checked first to be a regular file (a symlink resolved) of at most
    ``max_bytes``; anything else raises ``BadFileError`` with a one-line message naming the file
    and ``what`` it should be ("plan index"). ``missing_ok``: None when there is no such file
    (else ``BadFileError`` saying so). Every bookkeeping file the tools read goes through here."""
    p = Path(path)
    try:
        fd, st = _open_regular(p, os.O_RDONLY, what)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise BadFileError(f"{p}: cannot read the {what} (no such file)") from None
    try:
        if st.st_size > max_bytes:
            raise BadFileError(f"{p}: {st.st_size} bytes is too large for a {what} (limit {max_bytes})")
        chunks, left = [], max_bytes + 1  # one byte past the limit: a file that grew is caught too
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as e:
        raise BadFileError(f"{p}: cannot read the {what} ({e.strerror})") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise BadFileError(f"{p}: more than {max_bytes} bytes is too large for a {what}")
    return data


def read_regular_text(path: str | os.PathLike, max_bytes: int, what: str, *, missing_ok: bool = False) -> str | None:
    """``read_regular_file`` decoded as UTF-8 (``BadFileError`` naming the file when it is not)."""
    data = read_regular_file(path, max_bytes, what, missing_ok=missing_ok)
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadFileError(f"{path}: the {what} is not UTF-8 text (byte {data[e.start]:#04x} at offset "
                           f"{e.start})") from None


def append_line(path: str | os.PathLike, line: str, what: str) -> None:
    """Append one line (``line`` without its newline) to a regular file, creating it, in one
    write with O_APPEND, so lines from processes appending at once stay whole. A FIFO, device or
    directory there raises ``BadFileError``: opening a FIFO to write would block until a reader
    comes, and a line written to /dev/null would be lost without a word."""
    p = Path(path)
    try:
        fd, _ = _open_regular(p, os.O_WRONLY | os.O_APPEND, what)
    except FileNotFoundError:
        try:  # O_EXCL: no FIFO slipped in since the stat; losing a race to another creator is fine
            fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                fd, _ = _open_regular(p, os.O_WRONLY | os.O_APPEND, what)
            except FileNotFoundError:  # O_EXCL refuses a dangling symlink too
                raise BadFileError(f"{p}: the {what} is a symlink to nothing ({os.path.realpath(p)})") from None
        except OSError as e:
            raise BadFileError(f"{p}: cannot create the {what} ({e.strerror})") from None
    try:
        os.write(fd, (line + "\n").encode("utf-8"))
    except OSError as e:
        raise BadFileError(f"{p}: cannot append to the {what} ({e.strerror})") from None
    finally:
        os.close(fd)


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
        # /dev/zero reads forever (MemoryError) and opening a FIFO blocks until a writer comes;
        # a directory or device is no problem or plan file either
        raw = read_regular_file(p, MAX_FILE_BYTES, f"{what} file", missing_ok=True)
        if raw is None:
            raise SchemaError(f"{p}: cannot read {what}: no such file")
        text = _decode(p, raw)
    except BadFileError as e:
        raise SchemaError(str(e)) from None
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
    readable = PLAN_SCHEMA_VERSIONS if model is Plan else PROBLEM_SCHEMA_VERSIONS
    if type(version) is not int or version not in readable:  # true == 1 and 1.0 == 1 in Python
        raise SchemaError(f"{p}: schema_version: {version!r} is not supported "
                          f"(this bucketplan reads {what} version{'s' if len(readable) > 1 else ''} "
                          f"{' and '.join(map(str, readable))})")
    key = "fingerprint" if model is Problem else "problem_fingerprint"
    if not data.get(key):
        raise SchemaError(f"{p}: {key}: must be the problem's content fingerprint, not empty "
                          "(an empty one would switch the integrity check off)")
    try:
        # strict: "12" or true is not a number here, as in JSON; arrays are tuples
        return model.model_validate_json(text, strict=True)
    except ValidationError as e:
        raise SchemaError(f"{p}: invalid {what}: {_describe(e)}") from None


def _decode(p: Path, raw: bytes) -> str:
    """The file's text; a ``.gz`` file decompressed (the committed experiment problems are), read
    only up to one byte past the size limit so a compression bomb cannot fill memory."""
    if p.suffix != ".gz":
        return raw.decode("utf-8")
    with gzip.GzipFile(fileobj=io.BytesIO(raw), mode="rb") as fh:
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
