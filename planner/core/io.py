"""Reading and writing problems and plans: JSON only, validated, written atomically.

Files are data, never code (no pickle). Every error names the file and the offending field
(``collectives[3].kind``), so a user can find it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Collection, Iterable, Iterator, TypeVar, Union

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
    _check_room_to_load(p, len(text), what)
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
    # one file given for the other (a problem as --hint): say so, not which of its fields is missing
    if model is Plan and "collectives" in data and "buckets" not in data:
        raise SchemaError(f"{p}: this is a problem file, not a plan")
    if model is Problem and "buckets" in data and "collectives" not in data:
        raise SchemaError(f"{p}: this is a plan file, not a problem")
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


# the memory a file's load takes, per byte of its JSON: parsing it, then validating it (pydantic-core
# aborts the whole process when an allocation fails there, so no except can catch it)
LOAD_BYTES_PER_JSON_BYTE = 30
# below this a load is not weighed against the memory left (a few MB of JSON: an 8-layer problem)
LOAD_CHECKED_FROM_BYTES = 64 * 2**20


def _check_room_to_load(p: Path, json_bytes: int, what: str) -> None:
    """Refuse, in one line, a file whose load would need more memory than this process may use:
    ``LOAD_BYTES_PER_JSON_BYTE`` times its JSON, against the address-space limit (``ulimit -v``)
    left and the memory the machine has available."""
    need = LOAD_BYTES_PER_JSON_BYTE * json_bytes
    if need < LOAD_CHECKED_FROM_BYTES:  # every plan and problem goes through here: skip the /proc reads
        return
    room = memory_room()
    if room is not None and need > room:
        raise SchemaError(f"{p}: loading this {what} file ({json_bytes / 1e6:.0f} MB of JSON) takes about "
                          f"{need / 1e9:.1f} GB of memory; this process may use {room / 1e9:.1f} GB more "
                          "(ulimit -v, or the machine's available memory)")


def memory_room() -> int | None:
    """Bytes this process may still allocate: the smaller of what ``ulimit -v`` leaves above its
    present size and the machine's MemAvailable (Linux); None where neither can be read."""
    import resource

    rooms = []
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        rooms.append(soft - _proc_kb("/proc/self/status", "VmSize:"))
    available = _proc_kb("/proc/meminfo", "MemAvailable:")
    if available:
        rooms.append(available)
    return min(rooms) if rooms else None


def _proc_kb(path: str, key: str) -> int:
    """A ``key: N kB`` line of a /proc file, in bytes (0 where there is none)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


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


# -- output folders: what a command may replace or write, and what it must never touch --------------

# inside a folder replaced as a whole: every file its command wrote, with size and hash, so that a
# later run replaces the folder only while it holds nothing else
MANIFEST = ".bucketplan-manifest.json"


class OutputFolderError(OSError):
    """An output folder that must not be replaced or written now (not a folder, a symlink loop,
    the current folder, files its command did not write, another run writing it); ``strerror``
    says why in one line, ``filename`` names the folder."""


def clobbered_input(places: Iterable[str | os.PathLike], inputs: Iterable[tuple[str, str | os.PathLike | None]]
                    ) -> tuple[str, str, str, bool] | None:
    """The first input that writing ``places`` would overwrite or delete, as (place, label, input,
    same): an input that is a place (``same``: the same file once symlinks are resolved, or a hard
    link of it) or lies anywhere inside one. ``places``: the files and folders a command writes, a folder
    standing for everything under it; ``inputs``: (label, path) pairs, empty paths skipped."""
    inputs = [(label, given) for label, given in inputs if given]
    for place in places:
        real = os.path.realpath(place)  # never raises: a symlink loop stays a path
        for label, given in inputs:
            src = os.path.realpath(given)
            if src == real or _same_file(place, given):
                return str(place), label, str(given), True
            if src.startswith(real.rstrip(os.sep) + os.sep):
                return str(place), label, str(given), False
    return None


def _same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # either missing, or unreadable: not the same existing file
        return False


def _target(path: str | os.PathLike) -> Path:
    """``path`` absolute, a symlink resolved to the folder it names (the link keeps pointing
    there); a symlink loop or a path that cannot be looked at is refused."""
    p = Path(path).absolute()
    try:
        os.stat(p)
    except FileNotFoundError:
        pass
    except OSError as e:
        why = ("is a symlink loop" if e.errno == errno.ELOOP
               else f"cannot be used as an output folder ({e.strerror})")
        raise OutputFolderError(e.errno, why, str(path)) from None
    return Path(os.path.realpath(p)) if p.is_symlink() else p


def check_replaceable(path: str | os.PathLike, owned: Collection[str] | None = None) -> Path:
    """The folder ``replace_dir_atomically`` would replace (a symlink resolved), or
    ``OutputFolderError`` saying why it must not be.

    Replacing a folder deletes everything in it, where writing into it kept what was there:
    ``-o .`` or ``-o ~`` must not wipe a user's files. So ``path`` must be absent, or a folder
    that is not the current folder or one above it (renaming it away would pull the working
    directory out from under the process) and, with ``owned`` (the top-level names the command
    writes; None: anything may go), holds nothing but what an earlier run wrote, at any depth:
    every file listed in its ``MANIFEST`` with the same size and hash."""
    p = _target(path)
    refusal = _refusal(p, owned)
    if refusal is not None:
        code, why, advice = refusal
        raise OutputFolderError(code, f"{why}; {advice}", str(path))
    return p


def _refusal(p: Path, owned: Collection[str] | None) -> tuple[int, str, str] | None:
    """Why the folder ``p`` must not be replaced now, as (errno, why, what to do instead)."""
    if not os.path.lexists(p):
        return None
    if not p.is_dir() or p.is_symlink():  # a link there now was not there when the run began
        return errno.ENOTDIR, "exists and is not a folder", "give a folder"
    here = Path.cwd().resolve()
    if p.resolve() == here or p.resolve() in here.parents:
        return errno.EISDIR, "is the current folder or contains it", "give a folder of its own"
    foreign = foreign_files(p, owned) if owned is not None else []
    if foreign:
        return errno.EEXIST, _holds(p, foreign, owned), "it replaces the whole folder, so give a new or empty one"
    return None


def foreign_files(folder: Path, owned: Collection[str]) -> list[str]:
    """The entries of ``folder``, at any depth, that its command did not write (relative paths,
    sorted): a file the folder's manifest does not list with its size and hash, a symlink or
    other non-regular file, anything under a top-level name not in ``owned`` (such a folder as
    one entry, ``NAME/``). Other folders count through what they hold."""
    listed = _read_manifest(folder) or {}
    foreign = []
    # a folder under a name the command never writes is foreign whole: not looked into
    for rel, kind, full in _walk(folder, into=lambda rel: rel.split("/")[0] in owned):
        if rel == MANIFEST:
            continue
        if rel.split("/")[0] not in owned:
            foreign.append(rel + ("/" if kind == "dir" else ""))
        elif kind == "other" or (kind == "file" and not _unchanged(full, listed.get(rel))):
            foreign.append(rel)
    return sorted(foreign)


def _holds(folder: Path, foreign: list[str], owned: Collection[str]) -> str:
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
    # names the command writes, but no list of them: a run of a version that kept none
    older = not (folder / MANIFEST).exists() and all(f.split("/")[0] in owned for f in foreign)
    why = (f": no {MANIFEST} lists them, as in a folder an older bucketplan wrote; remove the folder if it is "
           "only that" if older else "")
    return f"holds files this command did not write ({shown}{why})"


def _walk(root: Path, into=lambda rel: True) -> Iterator[tuple[str, str, str]]:
    """Every entry under ``root`` as (relative path, "dir" | "file" | "other", full path), symlinks
    never followed, folders entered where ``into(relative path)``; a folder that cannot be listed
    counts as "other"."""
    stack = [(str(root), "")]
    while stack:
        folder, rel = stack.pop()
        try:
            with os.scandir(folder) as entries:
                found = list(entries)
        except OSError:
            if rel:
                yield rel.rstrip("/"), "other", folder
                continue
            raise
        for e in found:
            name = rel + e.name
            if e.is_dir(follow_symlinks=False):
                yield name, "dir", e.path
                if into(name):
                    stack.append((e.path, name + "/"))
            else:
                yield name, "file" if e.is_file(follow_symlinks=False) else "other", e.path


def _digest(full: str) -> tuple[int, str] | None:
    """(size, sha256) of a regular file, read without following a symlink or blocking on a FIFO
    swapped in; None when it is no longer one."""
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY)
    except OSError:
        return None
    h = hashlib.sha256()
    size = 0
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def _unchanged(full: str, entry) -> bool:
    if not isinstance(entry, dict):
        return False
    try:
        if os.lstat(full).st_size != entry.get("bytes"):  # the cheap test first
            return False
    except OSError:
        return False
    return _digest(full) == (entry.get("bytes"), entry.get("sha256"))


def _read_manifest(folder: Path) -> dict | None:
    """The manifest's {relative path: {"bytes", "sha256"}}; None when it is missing or unreadable
    (then no file counts as written by the command)."""
    try:
        text = read_regular_text(folder / MANIFEST, BOOKKEEPING_MAX_BYTES, "manifest", missing_ok=True)
        files = json.loads(text)["files"] if text is not None else None
    except (BadFileError, ValueError, KeyError, TypeError):
        return None
    return files if isinstance(files, dict) else None


def _write_manifest(folder: Path) -> None:
    files = {}
    for rel, kind, full in _walk(folder):
        got = _digest(full) if kind == "file" else None
        if got is not None:
            files[rel] = {"bytes": got[0], "sha256": got[1]}
    lines = ",\n".join(f"  {json.dumps(rel)}: {json.dumps(entry)}" for rel, entry in sorted(files.items()))
    atomic_write_text(folder / MANIFEST, '{"files": {\n' + lines + "\n}}\n")  # a line per file


@contextmanager
def folder_lock(lock: str | os.PathLike, folder: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on the file ``lock`` (made if need be) for the block, or raise
    ``OutputFolderError`` naming ``folder`` at once when another process holds it: two runs
    writing one folder would mix or replace each other's results. flock, so the lock goes with the
    process however it ends; the file is removed on the way out, still locked (a run that opened
    it meanwhile sees it gone and locks a new one)."""
    try:
        # O_NONBLOCK: never blocks on a FIFO put there (fstat below refuses it); O_NOFOLLOW: a
        # symlink there is refused, never followed to make a file elsewhere
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        raise OutputFolderError(e.errno, f"cannot open its lock file {lock} ({e.strerror})", str(folder)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OutputFolderError(errno.EINVAL, f"its lock file {lock} is not a regular file; remove it",
                                    str(folder))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputFolderError(errno.EAGAIN, f"another run is writing this folder (it holds {lock}); wait "
                                    "for it to finish or give another folder", str(folder)) from None
        if not _same_file(fd, lock):  # its holder removed it as we opened it: lock the next one
            os.close(fd)
            fd = None
            with folder_lock(lock, folder):
                yield
            return
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.unlink(lock)  # while still held: no litter beside the folder, and no race
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def lock_beside(folder: Path) -> Path:
    """The lock file of a folder that is replaced as a whole: beside it, as a lock inside would go
    with the folder it replaces."""
    return folder.with_name(f".{folder.name}.lock")


@contextmanager
def replace_dir_atomically(path: str | os.PathLike, owned: Collection[str] | None = None) -> Iterator[Path]:
    """Yield a fresh, empty temporary folder beside ``path`` (``DIR.tmp-<pid>-<random>``); when
    the block completes, it becomes ``path``: the old folder is renamed aside, the new one renamed
    into place, the old one deleted. On any exception, KeyboardInterrupt included, the temporary
    folder is deleted and ``path`` is left exactly as it was.

    Why: a command that writes many files into one folder (``bucketplan compare -o DIR``) must
    never leave a mix of two runs -- a failed run's new traces beside the previous run's table.
    The folder is made in the same parent so that both renames stay on one filesystem (a rename
    is atomic there). For the whole run the lock ``.DIR.lock`` beside it is held
    (``folder_lock``): a second run on the same folder is refused at once. With ``owned``, the
    new folder gets a ``MANIFEST`` of what was written, and ``check_replaceable(path, owned)``
    holds both when the run starts and again just before the swap: a file put into the old folder
    meanwhile keeps it where it is, and the new one is left beside it under a name the
    ``OutputFolderError`` gives (``DIR.new-<pid>-<random>``), so neither the user's files nor
    the run's results are lost. Only a process killed outright (SIGKILL, power loss) can leave the
    temporary folder behind; ``path`` is still whole then."""
    p = _target(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with folder_lock(lock_beside(p), path):
        check_replaceable(path, owned)
        tmp = _fresh_dir(p, "tmp")
        try:
            yield tmp
            if owned is not None:
                _write_manifest(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _swap(path, p, tmp, owned)


def _swap(path, p: Path, tmp: Path, owned: Collection[str] | None) -> None:
    """``tmp`` renamed into ``p``'s place once ``p`` is checked again; the old folder deleted."""
    refusal = _refusal(p, owned)  # right before the rename: files may have come since the start
    if refusal is not None:
        kept = _fresh_dir(p, "new")
        os.rename(tmp, kept)  # over the empty placeholder (POSIX)
        raise OutputFolderError(refusal[0], f"{refusal[1]} (found as the run ended): left as it was; this run's "
                                f"results are in {kept}", str(path))
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
        late = foreign_files(aside, owned) if owned is not None else []
        if late:  # written in the instant between the check and the rename: kept, not deleted
            warnings.warn(f"{path}: replaced; {', '.join(late[:5])} came into the old folder during the swap "
                          f"and are kept in {aside}", stacklevel=3)
        else:
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
