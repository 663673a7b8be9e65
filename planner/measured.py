"""Measured collective times: nccl-tests output and plain CSV tables, as ``Link`` tables.

Why this exists: torch's NCCL model, which every preset uses, can be several times off a real
cluster (issue 28 lists 2.5-8x across nodes), and the right figure depends on how a group is laid
out over the nodes. A user who has measured their cluster feeds the measurements here, and the
problem (and torch's scheduler, through ``fxglue.estimator``) is priced by them.

Two formats, told apart by their first line:
- **nccl-tests** output (``all_gather_perf``, ``reduce_scatter_perf``, ``all_reduce_perf``). Its
  ``size`` column is ``max(send bytes, receive bytes)`` of one rank: the gathered output of an
  all_gather, the scattered input of a reduce_scatter, the buffer of an all_reduce, which is
  exactly the full (unsharded) tensor ``planner`` calls ``wire_bytes``. Its ``count`` column is
  elements per rank for all_gather / reduce_scatter (``size = count * type size * nranks``) and
  all elements for all_reduce (``size = count * type size``). The out-of-place ``time`` (µs) is
  taken. The collective comes from the ``Collective test starting: NAME`` line, else from the
  file name, else from the rows (``redop none``: all_gather; count times type size equals size:
  all_reduce; else reduce_scatter). The ranks and their layout come from the ``#  Rank  N Group
  G Pid P on HOST`` lines (ranks per node = ranks / hosts), or, in a file without them, from
  ``ranks`` and ``ranks_per_node`` given by the caller.
- **CSV** with the header ``kind,group,ranks_per_node,bytes,ms``: ``group`` is a group size (an
  integer) or ``pg:NAME``, a process-group name of the graph (names are often digits);
  ``bytes`` the full tensor.

A graph's group takes a measurement of the same name, else one of the same size and ranks per
node (a data-parallel group with one rank per node is not one spanning whole nodes). Below the
smallest measured size the smallest's time holds (latency-bound); above the largest the last
segment extends (bandwidth-bound). Both are reported (``Measured.range_notes``). Kinds a group has no
measurement for keep the model it had.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from pathlib import Path

from planner.io import read_regular_text
from planner.problem import MAX_BYTES, MAX_MS, Link

KINDS = ("all_gather", "reduce_scatter", "all_reduce")
CSV_HEADER = ("kind", "group", "ranks_per_node", "bytes", "ms")
MAX_FILE_BYTES = 64 << 20
# nccl-tests' type names and their sizes in bytes (src/common.cu: test_typenames)
TYPE_BYTES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "half": 2, "float": 4,
              "double": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1}
_RANK_LINE = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)")
_STARTING = re.compile(r"Collective test starting:\s*(\w+)")


class MeasuredError(ValueError):
    """A measurement file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class Series:
    """One collective measured on one group shape: ``points`` (wire bytes, ms), increasing bytes."""

    kind: str
    points: tuple[tuple[int, float], ...]
    source: str  # file (and what in it) the points came from
    ranks: int | None = None  # group size; None: matched by name only
    ranks_per_node: int | None = None
    group: str | None = None  # a process-group name of the graph, where the CSV gave one

    def describe(self) -> str:
        lo, hi = self.points[0][0], self.points[-1][0]
        return f"{self.kind} measured ({self.source}: {len(self.points)} sizes, {_size(lo)} to {_size(hi)})"


def _size(b: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << k:
            return f"{b / (1 << k):g} {unit}"
    return f"{b} B"


def _number(text: str, where: str, what: str, kind=float, below: float | None = None):
    """``text`` as a finite number >= 0 (and below ``below``), else one MeasuredError naming it."""
    try:
        value = kind(text)
    except ValueError:
        raise MeasuredError(f"{where}: {what} {text!r} is not a number") from None
    if not value >= 0 or value != value or value == float("inf"):
        raise MeasuredError(f"{where}: {what} {text!r} must be a finite number >= 0")
    if below is not None and value >= below:
        raise MeasuredError(f"{where}: {what} {text!r} is beyond any machine (below {below:g})")
    return value


def _kind_from(name: str) -> str | None:
    name = name.lower()
    for kind in KINDS:
        if kind in name or kind.replace("_", "") in name:
            return kind
    return None


def _series_points(rows: list[tuple[int, float, str]], what: str) -> tuple[tuple[int, float], ...]:
    """Sorted, de-duplicated (bytes, ms); a size given twice with two times is refused."""
    by_size: dict[int, tuple[float, str]] = {}
    for b, ms, where in rows:
        if b in by_size and by_size[b][0] != ms:
            raise MeasuredError(f"{where}: {what} at {b} bytes measured twice ({by_size[b][1]} gave {by_size[b][0]} ms)")
        by_size[b] = (ms, where)
    return tuple((b, by_size[b][0]) for b in sorted(by_size))


def parse_nccl_tests(text: str, path: str, *, ranks: int | None = None,
                     ranks_per_node: int | None = None) -> Series:
    """One nccl-tests output (see the module docstring for its conventions)."""
    hosts: dict[int, str] = {}
    named = None
    rows: list[tuple[int, float, str]] = []
    evidence: list[str] = []  # what the rows say the collective is
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{path}:{number}"
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if m := _RANK_LINE.match(stripped):
                hosts[int(m.group(1))] = m.group(2)
            elif m := _STARTING.search(stripped):
                named = _kind_from(m.group(1))
                if named is None:
                    raise MeasuredError(f"{where}: {m.group(1)} is not all_gather, reduce_scatter or all_reduce")
            continue
        fields = stripped.split()
        if not fields[0][0].isdigit() or ":" in fields[0]:
            continue  # not a result row: NCCL's own log lines ("host:pid:tid [0] NCCL INFO ...") and the like
        if len(fields) < 8:
            raise MeasuredError(f"{where}: a result row needs size count type redop root time algbw busbw, "
                                f"got {len(fields)} field(s)")
        size = _number(fields[0], where, "size", int, below=MAX_BYTES)
        count = _number(fields[1], where, "count", int)
        type_name, redop = fields[2], fields[3]
        if type_name not in TYPE_BYTES:
            raise MeasuredError(f"{where}: unknown data type {type_name!r} (nccl-tests names: {', '.join(TYPE_BYTES)})")
        time_us = _number(fields[5], where, "out-of-place time", float, below=MAX_MS * 1e3)
        if size == 0:
            continue  # nccl-tests prints 0-byte rows for sizes below one element per rank
        if redop == "none":
            evidence.append("all_gather")
        elif count * TYPE_BYTES[type_name] == size:
            evidence.append("all_reduce")
        else:
            evidence.append("reduce_scatter")
        rows.append((size, time_us / 1e3, where))
    if not rows:
        raise MeasuredError(f"{path}: no result rows (size count type redop root time ...)")
    kind = named or _kind_from(Path(path).name) or (evidence[0] if len(set(evidence)) == 1 else None)
    if kind is None:
        raise MeasuredError(f"{path}: cannot tell which collective it measures (no 'Collective test starting' line, "
                            "no kind in the file name, rows disagree); name the file e.g. all_gather_perf.txt")
    if hosts:  # the header says: given ranks only fill in files without one
        n_hosts = len(set(hosts.values()))
        if len(hosts) % n_hosts:
            raise MeasuredError(f"{path}: {len(hosts)} ranks on {n_hosts} hosts is not the same number on each")
        ranks, ranks_per_node = len(hosts), len(hosts) // n_hosts
    if ranks is None or ranks_per_node is None:
        raise MeasuredError(f"{path}: no '#  Rank N Group G Pid P on HOST' lines to count the ranks and hosts; "
                            "give them (--collective-ranks N/PER_NODE)")
    return Series(kind, _series_points(rows, kind), f"nccl-tests {path}", ranks=ranks,
                  ranks_per_node=min(ranks, ranks_per_node or ranks))


def parse_csv(text: str, path: str) -> list[Series]:
    """A CSV of ``kind,group,ranks_per_node,bytes,ms`` rows (see the module docstring)."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None or tuple(h.strip() for h in header) != CSV_HEADER:
        raise MeasuredError(f"{path}:1: the header must be {','.join(CSV_HEADER)}")
    groups: dict[tuple, list[tuple[int, float, str]]] = {}
    for number, row in enumerate(reader, 2):
        where = f"{path}:{number}"
        if not row or not "".join(row).strip():
            continue
        if len(row) != len(CSV_HEADER):
            raise MeasuredError(f"{where}: {len(row)} field(s), the header has {len(CSV_HEADER)}")
        kind, group, per_node, nbytes, ms = (x.strip() for x in row)
        if kind not in KINDS:
            raise MeasuredError(f"{where}: kind {kind!r} is not one of {', '.join(KINDS)}")
        if not group:
            raise MeasuredError(f"{where}: group is empty (a group size or a process-group name)")
        per_node = _number(per_node, where, "ranks_per_node", int)
        if per_node < 1:
            raise MeasuredError(f"{where}: ranks_per_node must be at least 1")
        # process-group names are often digits too ("0"): a name is written pg:NAME, a bare integer is a size
        size = int(group) if group.isdigit() else None
        if group.startswith("pg:") and group[3:]:
            group = group[3:]
        if size is not None and size < 1:
            raise MeasuredError(f"{where}: group size must be at least 1")
        key = (kind, size, None if size is not None else group, min(per_node, size or per_node))
        groups.setdefault(key, []).append((_number(nbytes, where, "bytes", int, below=MAX_BYTES),
                                           _number(ms, where, "ms", below=MAX_MS), where))
    if not groups:
        raise MeasuredError(f"{path}: no measurements after the header")
    return [Series(kind, _series_points(rows, kind), str(path), ranks=size, ranks_per_node=per_node,
                   group=name) for (kind, size, name, per_node), rows in groups.items()]


def read_series(path: str | Path, *, ranks: int | None = None, ranks_per_node: int | None = None) -> list[Series]:
    """Every series of one measurement file (nccl-tests output or CSV)."""
    text = read_regular_text(path, MAX_FILE_BYTES, "collectives file")  # BadFileError: not a file, not UTF-8
    text = text.removeprefix("\ufeff")  # a byte-order mark (spreadsheets save CSV with one)
    first = next((line for line in text.splitlines() if line.strip()), "")
    if first.replace(" ", "").lower().startswith("kind,"):
        return parse_csv(text, str(path))
    if not text.strip():
        raise MeasuredError(f"{path}: empty")
    return [parse_nccl_tests(text, str(path), ranks=ranks, ranks_per_node=ranks_per_node)]


@dataclass
class Measured:
    """Measured series of any number of files; ``link`` prices a graph's group by them."""

    series: list[Series]
    used: dict[str, dict[str, Series]] = field(default_factory=dict)  # group -> kind -> series it took

    def __post_init__(self) -> None:
        for s in self.series:
            rising_end(s)

    @classmethod
    def read(cls, paths, *, ranks: int | None = None, ranks_per_node: int | None = None) -> "Measured":
        series: list[Series] = []
        for p in paths:
            series.extend(read_series(p, ranks=ranks, ranks_per_node=ranks_per_node))
        seen: dict[tuple, str] = {}
        for s in series:
            key = (s.kind, s.group, s.ranks, s.ranks_per_node)
            if key in seen:
                raise MeasuredError(f"{s.source}: {s.kind} on this group shape is also measured in {seen[key]}")
            seen[key] = s.source
        return cls(series)

    def find(self, kind: str, pg: str, ranks: int, ranks_per_node: int) -> Series | None:
        """The series for a group: by its name first, else by size and ranks per node."""
        by_name = [s for s in self.series if s.kind == kind and s.group == pg]
        if by_name:
            return by_name[0]
        return next((s for s in self.series if s.kind == kind and s.group is None and s.ranks == ranks
                     and s.ranks_per_node == min(ranks, ranks_per_node)), None)

    def link(self, base: Link, ranks_per_node: int) -> Link:
        """``base`` with every kind measured for its group replaced by the measured table."""
        table = dict(base.table) if base.table is not None else {k: _alpha_beta_table(base, k) for k in KINDS}
        used = {}
        for kind in KINDS:
            s = self.find(kind, base.pg, base.group_size, ranks_per_node)
            if s is not None:
                table[kind] = measured_table(s.points)
                used[kind] = s
        if not used:
            return base
        self.used[base.pg] = used
        rest = [k for k in KINDS if k not in used]
        what = "; ".join(s.describe() for s in used.values()) + (f"; {', '.join(rest)}: {base.hardware}" if rest else "")
        return Link(pg=base.pg, group_size=base.group_size, table=table, hardware=what)

    def range_notes(self, collectives) -> list[str]:
        """One line per group and kind whose collectives (``.pg``, ``.kind``, ``.wire_bytes``) lie
        outside the measured sizes: those times are extrapolated, and a user should know."""
        out = []
        for pg, used in self.used.items():
            for kind, s in used.items():
                lo, hi = s.points[0][0], s.points[-1][0]
                sizes = [c.wire_bytes for c in collectives if c.pg == pg and c.kind == kind]
                below, above = sum(b < lo for b in sizes), sum(b > hi for b in sizes)
                if below or above:
                    out.append(f"group {pg}: {kind} measured from {_size(lo)} to {_size(hi)}; "
                               f"{below} collective(s) below (taken flat), {above} above (last segment extended)")
        return out


def rising_end(s: Series) -> None:
    """Refuse a series whose time falls between its two largest sizes: the last segment is
    extended above them, and a falling one would price larger collectives ever cheaper, down to
    nothing (a noisy or misread last row; measure further, or drop the row)."""
    if len(s.points) >= 2:
        (b0, t0), (b1, t1) = s.points[-2], s.points[-1]
        if t1 < t0:
            raise MeasuredError(f"{s.source}: {s.kind} takes {t1:g} ms at {_size(b1)} but {t0:g} ms at {_size(b0)}: "
                                "a time that falls at the largest size cannot be extended above it")


def measured_table(points) -> tuple[tuple[int, float], ...]:
    """A ``Link`` table through the measured points: flat from 0 bytes to the smallest (the
    latency a collective cannot go under), linear between, the last segment extended above."""
    points = tuple((int(b), float(t)) for b, t in points)
    if points[0][0] == 0:
        return points if len(points) > 1 else (points[0], (1, points[0][1]))
    if len(points) == 1:  # one size: its time at every size up to it, then flat
        return (0, points[0][1]), points[0], (points[0][0] + 1, points[0][1])
    return ((0, points[0][1]),) + points


def _alpha_beta_table(link: Link, kind: str) -> tuple[tuple[int, float], ...]:
    """An α-β link's curve as a table (it is linear: two points say all of it)."""
    far = 1 << 40
    return (0, link.time_ms(kind, 0)), (far, link.time_ms(kind, far))
