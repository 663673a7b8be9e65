"""Measured collective times (nccl-tests output, CSV, AutoParallel's tables) as ``Link`` tables.

Why this exists: torch's NCCL model, which every preset uses, can be several times off a real
cluster (2.5-8x across nodes against published nccl-tests figures), and the right figure depends on how a group is laid
out over the nodes. A user who has measured their cluster feeds the measurements here, and the
problem (and torch's scheduler, through ``fxglue.estimator``) is priced by them.

Three formats, told apart by their first line:
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
- **AutoParallel's collectives table** (its overlap simulator's ``colls*.table``, named by a
  repro file's ``get_colls_estimations_file()``; read as ``CollectiveEstimationParser`` of
  AutoParallel's ``autoparallel/tools/overlap_simulator/run.py`` reads it): a header ``Group
  Group Size Collective  1MB (ms)  2MB (ms) ... 2048MB (ms)``, a line of dashes, then one row
  per process group, group size and collective -- ``0  32  all_gather_into_tensor  1.0136
  1.7497 ...`` -- with milliseconds at each size. The size is that of the collective's *input*
  tensor in MiB (AutoParallel looks rows up by ``node.args[0]``'s bytes / 2**20): the shard an
  all_gather sends, the full tensor a reduce_scatter scatters, the buffer of an all_reduce; so
  an all_gather's wire bytes are the column's size times the group size (in its own tables an
  all_gather at X MB costs what a reduce_scatter at X times the group size does). Rows of
  ``all_gather_into_tensor_out`` and torch's other functional collectives are read and not used:
  AutoParallel prices every all_gather by the ``all_gather_into_tensor`` row, and bucketplan
  plans none of the others. A row names its group, so it prices only the graph's group of that
  name and size (AutoParallel takes any group whose name contains the row's; a table here is
  matched exactly). Between columns the time is linear in bytes, as AutoParallel interpolates,
  except that it takes a column's time for any size whose whole MiB is that column (1.5 MB as 1
  MB); below the first column the first column's time holds, as in AutoParallel; above the last,
  the last segment extends.

A graph's group takes a measurement of the same name, else one of the same size and ranks per
node (a data-parallel group with one rank per node is not one spanning whole nodes). Below the
smallest measured size the smallest's time holds (latency-bound); above the largest the last
segment extends (bandwidth-bound). Both are reported (``fxglue.presets.pricing_lines``). Kinds a group has no
measurement for keep the model it had. Measurements a graph file carries (``Measured.fallback``:
the table its ``get_colls_estimations_file()`` names) count only where the caller's own have none
for the group and kind.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from planner.core.io import read_regular_text
from planner.core.problem import MAX_BYTES, MAX_MS, Link

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
    group: str | None = None  # a process-group name of the graph, where the CSV or the table gave one
    # the file it was read from (``read_series``), to say which file priced nothing; not its value
    file: str | None = field(default=None, compare=False, repr=False)

    def describe(self) -> str:
        lo, hi = self.points[0][0], self.points[-1][0]
        return f"{self.kind} measured ({self.source}: {len(self.points)} sizes, {size_text(lo)} to {size_text(hi)})"


def size_text(b: int) -> str:
    """Bytes as a measurement names them: "64 MiB", "1.5 KiB", "512 B"."""
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << k:
            return f"{b / (1 << k):g} {unit}"
    return f"{b} B"


def _number(text: str, where: str, what: str, kind=float, below: float | None = None):
    """``text`` as a finite number >= 0 (and below ``below``), else one MeasuredError naming it."""
    shown = repr(text) if len(text) <= 40 else repr(text[:37] + "...")  # a field may be any length
    try:
        value = kind(text)
    except ValueError:
        if text.strip().isdecimal():  # more digits than int() converts (sys.get_int_max_str_digits)
            raise MeasuredError(f"{where}: {what} {shown} is beyond any machine "
                                f"({len(text.strip())} digits)") from None
        raise MeasuredError(f"{where}: {what} {shown} is not a number") from None
    if not value >= 0 or value != value or value == float("inf"):
        raise MeasuredError(f"{where}: {what} {shown} must be a finite number >= 0")
    if below is not None and value >= below:
        raise MeasuredError(f"{where}: {what} {shown} is beyond any machine (below {below:g})")
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
                hosts[_number(m.group(1), where, "rank", int)] = m.group(2)
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
        # process-group names are often digits too ("0"): a name is written pg:NAME, a bare integer is a
        # size (isdecimal: "²" is a digit to isdigit but no integer to int)
        size = _number(group, where, "group size", int) if group.isdecimal() else None
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


# AutoParallel's names of torch's functional collectives -> the kinds bucketplan plans
TABLE_KINDS = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
               "all_reduce": "all_reduce"}
# rows a table may carry that price nothing here (module docstring): the out= variant of the
# gather, which AutoParallel prices by the all_gather_into_tensor row, and the functional
# collectives nobody buckets
TABLE_UNUSED = ("all_gather_into_tensor_out", "all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced",
                "all_reduce_coalesced", "all_to_all_single", "broadcast")
MIB = 1 << 20
# ranks of one group: beyond any cluster built, as fxglue.graph_file.MAX_GROUP_SIZE
MAX_TABLE_GROUP = 1 << 20
_TABLE_COLUMN = re.compile(r"^(\d+)MB$")
_TABLE_UNIT = re.compile(r"^\((\w+)\)$")


def is_colls_table(first_line: str) -> bool:
    """Whether a file's first line is the header of AutoParallel's collectives table."""
    return first_line.split()[:1] == ["Group"]


def parse_colls_table(text: str, path: str) -> list[Series]:
    """AutoParallel's collectives table (see the module docstring): one series per row of a
    collective bucketplan plans, named by its group and sized by its group size."""
    lines = text.splitlines()
    numbered = [(i, line) for i, line in enumerate(lines, 1) if line.strip()]
    if not numbered:
        raise MeasuredError(f"{path}: empty")
    (head_no, header), rest = numbered[0], numbered[1:]
    words = header.split()
    if words[:4] != ["Group", "Group", "Size", "Collective"]:
        raise MeasuredError(f"{path}:{head_no}: a collectives table's header starts 'Group  Group Size  Collective', "
                            f"then one column per size ('1MB (ms)'); got {header.strip()[:60]!r}")
    sizes: list[int] = []
    for word in words[4:]:
        if m := _TABLE_COLUMN.match(word):
            sizes.append(_number(m.group(1), f"{path}:{head_no}", "column size (MB)", int, below=MAX_BYTES / MIB))
        elif (m := _TABLE_UNIT.match(word)) and sizes:
            if m.group(1) != "ms":  # the times are read as milliseconds, as AutoParallel reads them
                raise MeasuredError(f"{path}:{head_no}: column {sizes[-1]}MB is in {m.group(1)}; the table's times "
                                    "are milliseconds ('(ms)')")
        else:
            raise MeasuredError(f"{path}:{head_no}: header word {word[:40]!r} is not a size column ('1MB', "
                                "optionally followed by '(ms)')")
    if not sizes:
        raise MeasuredError(f"{path}:{head_no}: no size columns ('1MB (ms)  2MB (ms) ...') in the header")
    if len(set(sizes)) != len(sizes):
        raise MeasuredError(f"{path}:{head_no}: column {next(x for x in sizes if sizes.count(x) > 1)}MB is given twice")
    if not rest or set(rest[0][1].strip()) - {"-", " "}:
        # AutoParallel skips the line under the header unread: a row there would be lost
        raise MeasuredError(f"{path}:{rest[0][0] if rest else head_no + 1}: the line under the header must be the "
                            "rule of dashes the table's writer puts there")
    series: list[Series] = []
    seen: dict[tuple[str, int, str], str] = {}
    for number, line in rest[1:]:
        where = f"{path}:{number}"
        fields = line.split()
        if len(fields) != 3 + len(sizes):
            raise MeasuredError(f"{where}: {len(fields)} field(s); a row is group, group size, collective and "
                                f"{len(sizes)} time(s), one per column of the header")
        group, size_text, name = fields[:3]
        if name not in TABLE_KINDS and name not in TABLE_UNUSED:
            raise MeasuredError(f"{where}: collective {name[:40]!r} is not one of "
                                f"{', '.join((*TABLE_KINDS, *TABLE_UNUSED))}")
        if not size_text.isdecimal() or not 1 <= (ranks := _number(size_text, where, "group size", int,
                                                                   below=MAX_TABLE_GROUP + 1)):
            raise MeasuredError(f"{where}: group size {size_text[:40]!r} is not a count of ranks (1 or more)")
        times = [_number(t, where, f"time at {mb}MB", below=MAX_MS) for mb, t in zip(sizes, fields[3:])]
        key = (group, ranks, name)
        if key in seen:
            raise MeasuredError(f"{where}: group {group} of {ranks} ranks: {name} is also given on {seen[key]}")
        seen[key] = where
        if name not in TABLE_KINDS:
            continue
        kind = TABLE_KINDS[name]
        per_byte = ranks if kind == "all_gather" else 1  # the column is the input: an all_gather's shard
        wire = [mb * MIB * per_byte for mb in sizes]
        if wire[-1] >= MAX_BYTES:
            raise MeasuredError(f"{where}: {name} at {max(sizes)}MB on {ranks} ranks moves {wire[-1]:.3g} bytes, "
                                "beyond what a problem records")
        rows = [(b, ms, where) for b, ms in zip(wire, times)]
        series.append(Series(kind, _series_points(rows, kind), where, ranks=ranks, group=group))
    if not seen:
        raise MeasuredError(f"{path}: no rows under the header")
    return series


def read_series(path: str | Path, *, ranks: int | None = None, ranks_per_node: int | None = None) -> list[Series]:
    """Every series of one measurement file (nccl-tests output, CSV or AutoParallel's table)."""
    text = read_regular_text(path, MAX_FILE_BYTES, "collectives file")  # BadFileError: not a file, not UTF-8
    text = text.removeprefix("\ufeff")  # a byte-order mark (spreadsheets save CSV with one)
    first = next((line for line in text.splitlines() if line.strip()), "")
    if first.replace(" ", "").lower().startswith("kind,"):
        series = parse_csv(text, str(path))
    elif is_colls_table(first):
        series = parse_colls_table(text, str(path))
    elif not text.strip():
        raise MeasuredError(f"{path}: empty")
    else:
        series = [parse_nccl_tests(text, str(path), ranks=ranks, ranks_per_node=ranks_per_node)]
    return [replace(s, file=str(path)) for s in series]


@dataclass
class Measured:
    """Measured series of any number of files; ``link`` prices a graph's group by them."""

    series: list[Series]
    used: dict[str, dict[str, Series]] = field(default_factory=dict)  # group -> kind -> series it took
    # series a group takes only where ``series`` has none for it and the kind: what a graph file
    # carries (its collectives table), under what the user gave (--collectives, --profile)
    fallback: list[Series] = field(default_factory=list)

    def __post_init__(self) -> None:
        for s in (*self.series, *self.fallback):
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
        """The series for a group: by its name first (and its size, where the series gives one),
        else by size and ranks per node; ``fallback`` only where ``series`` has none."""
        for pool in (self.series, self.fallback):
            by_name = [s for s in pool if s.kind == kind and s.group == pg and s.ranks in (None, ranks)]
            if by_name:
                return by_name[0]
            found = next((s for s in pool if s.kind == kind and s.group is None and s.ranks == ranks
                          and s.ranks_per_node == min(ranks, ranks_per_node)), None)
            if found is not None:
                return found
        return None

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


def rising_end(s: Series) -> None:
    """Refuse a series whose time falls between its two largest sizes: the last segment is
    extended above them, and a falling one would price larger collectives ever cheaper, down to
    nothing (a noisy or misread last row; measure further, or drop the row)."""
    if len(s.points) >= 2:
        (b0, t0), (b1, t1) = s.points[-2], s.points[-1]
        if t1 < t0:
            raise MeasuredError(f"{s.source}: {s.kind} takes {t1:g} ms at {size_text(b1)} but {t0:g} ms at {size_text(b0)}: "
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
