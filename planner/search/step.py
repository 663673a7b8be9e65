"""The step-time objective: CP-SAT minimizes ``planner.simulate``'s step, with a bound in ms.

Why this exists: users pay for step time, not for collectives. With the anchors fixed, the
final order is fixed, so the simulator is a max-plus recurrence over the start and wait
positions, which CP-SAT states directly on top of the rule model of ``planner.search.cpsat`` (its
``x``/``y`` assignment, every rule, the candidate pruning). Times are integer nanoseconds
(rounding each term to 1 µs drifted 27 µs at 8 layers in a prototype; ns keep the drift under
a microsecond).

Walking the positions in order, one variable per event (``StepModel``):
- a start at position s: ``Q = Q_prev + C(prev, s) + launch·x[a,a] + copy_in(a)``; the bucket it
  anchors is issued at ``Q`` and ends ``E[a] >= max(Q, E[previous start on its group]) +
  dur(a)`` (FIFO stream that waits on compute at issue; ``dur``, launch and copies are 0 when
  ``a`` anchors nothing, so no enforcement literal is needed: a prototype measured that these
  literals kept a 2-layer model from being proved);
- a wait at position w: ``S >= Q_prev + C(prev, w)`` and ``S >= E[a]`` if bucket ``a`` is
  waited here (``y[a, b]``), then its copy-out: ``Q = S + K``, ``K >= copy_out(a)`` if so;
- the step is ``Q_last + C(last, end)``.
With ``>=`` and minimization the optimum for a fixed plan is the simulator's step.

Durations. A bucket's time is the link's curve at its bytes ``B[a] = Σ wire·x[i,a]``. An α-β
link is one line (exact). A table link gets two things: a concave minorant on the bytes the
bucket can have (the minimum of chords between geometrically spaced points of the curve,
lowered by the most it exceeds the curve at any breakpoint: torch's tree all_reduce is not
concave), which with its chord and per-byte cuts is what the LP sees; and the curve itself to
within 2 PIECE_TOLERANCE_NS (``duration_pieces``: chords between the curve's own breakpoints,
grouped into regions on which their minimum follows them, a boolean per region where a
bucket's bytes may fall in several). Never above the curve, so the bound is valid for the true
step; exact but for those few ns (where members' bytes are whole BYTE_UNITs), so a plan can
meet it. Every plan the model returns is still scored by ``planner.simulate`` itself
(``SolveResult.objective`` is that score).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from planner.cost.bounds import BucketReach, bucket_reach, per_byte_floors
from planner.cost.curves import curve
from planner.search.cpsat import ModelHandle, build_tick
from planner.core.problem import Link, Plan, Problem, copy_bytes

NS_PER_MS = 1_000_000
# Durations are lines in bytes counted in units of BYTE_UNIT (each member's bytes rounded down,
# so the line stays below the curve), in fixed point ns x 2**k: NVLink moves ~370 bytes per ns,
# so a slope needs fractional bits. CP-SAT refuses a model whose variable domains could add up
# past int64, so k is the largest that keeps every bucket's line values under
# 2**(61 - log2(buckets) - 2), and never past 2**MAGNITUDE_LOG2_MOST: at 32 layers about 2**19, a
# rounding under 0.2 µs for a 16 GiB bucket.
BYTE_UNIT = 64
# CP-SAT is not sound on values this large: a first statement of the exact pieces with lines up
# to 2**54 had it prove a plan optimal at 144.361 ms while the same model accepts a 144.321 plan
# with every variable fixed (llama3-8b-ddp-2 @ h100-64nodes, with and without presolve and LP);
# up to 2**50 the two agreed there, and still failed elsewhere (see _add_exact_duration). The
# minorant's lines stay under 2**50 as a precaution; the pieces are stated relative to each
# region's start under 2**PIECE_MAGNITUDE_LOG2, where no disagreement was seen.
MAGNITUDE_LOG2_MOST = 50
PIECE_MAGNITUDE_LOG2 = 42
# Chord points per duration curve (geometric between a bucket's least and largest bytes).
CHORD_POINTS = 24
# The exact pieces of a table curve (``duration_pieces``): chords between its own breakpoints
# that stay within PIECE_TOLERANCE_NS under it, grouped into regions on which their minimum is
# within PIECE_TOLERANCE_NS of the chords (so within twice that of the curve). At 2 layers (62
# buckets at most) that keeps a model's total under the 1 µs a plan may be from the bound to be
# called OPTIMAL (solver.STEP_OPTIMAL_TOLERANCE_MS).
PIECE_TOLERANCE_NS = 5.0


def to_ns(ms: float) -> int:
    return int(round(ms * NS_PER_MS))


def _highest_ms(link: Link, kind: str, lo: int, hi: int) -> float:
    """The most a collective of ``kind`` costs on ``link`` at any bytes in [lo, hi] (a curve is
    linear between its breakpoints)."""
    return max(link.time_ms(kind, b) for b in (lo, max(lo, hi), *curve(link, kind).bends(lo, hi)))


def duration_lines(link: Link, kind: str, lo: int, hi: int, magnitude_log2: int = 50,
                   rounded: int = 1) -> tuple[int, list[tuple[int, int]]]:
    """``(scale, lines)``: lines ``(c, s)`` in ns x scale, ``s`` per BYTE_UNIT bytes, with
    ``min_j (c_j + s_j * u) <= time(b)`` for every ``b`` in ``[lo, hi]`` and ``u`` the units of
    ``b`` summed over members each rounded down, ``rounded`` of them at most (b / BYTE_UNIT -
    rounded < u <= b / BYTE_UNIT); a concave minorant of the link's curve, exact for an α-β link
    up to rounding."""
    def f_ns(b: int) -> float:
        return link.time_ms(kind, b) * NS_PER_MS

    cv = curve(link, kind)
    if cv.is_line or hi <= lo:
        c = f_ns(0) if cv.is_line else f_ns(lo)
        s = (f_ns(1 << 30) - f_ns(0)) / (1 << 30) if cv.is_line else 0.0
        return _scaled([(c, s)], hi, magnitude_log2, rounded)
    ratio = (hi / max(lo, 1)) ** (1 / (CHORD_POINTS - 1))
    pts = sorted({lo, hi, *(min(hi, int(lo * ratio**k)) for k in range(CHORD_POINTS))})
    lines = []
    for b0, b1 in zip(pts, pts[1:]):
        s = (f_ns(b1) - f_ns(b0)) / (b1 - b0)
        lines.append((f_ns(b0) - s * b0, s))
    # how far the minimum of the chords rises above the curve, at every breakpoint in range
    checks = [lo, hi] + cv.bends(lo, hi)
    excess = max(0.0, max(min(c + s * b for c, s in lines) - f_ns(b) for b in checks))
    return _scaled([(c - excess - 1, s) for c, s in lines], hi, magnitude_log2, rounded)


def _scaled(lines: list[tuple[float, float]], hi: int, magnitude_log2: int,
            rounded: int = 1) -> tuple[int, list[tuple[int, int]]]:
    """Integer lines in BYTE_UNIT bytes at the largest power-of-two scale whose values on
    [0, hi] stay under 2**magnitude_log2 (rounded down: the minorant stays below the curve)."""
    largest = max(abs(c) + abs(s) * hi for c, s in lines) + 1
    scale = 1 << max(0, magnitude_log2 - math.ceil(math.log2(largest)))
    # a slope s with s <= 0 loses nothing by the unit's rounding only if it is not negative;
    # negative slopes (a curve that falls) are taken as far along as the rounding of ``rounded``
    # members can hide (at least one unit)
    return scale, [(math.floor(c * scale) + (max(1, rounded) * math.floor(s * BYTE_UNIT * scale) if s < 0 else 0),
                    math.floor(s * BYTE_UNIT * scale)) for c, s in lines]


def _interpolating_chords(link: Link, kind: str, lo: int, hi: int, tol_ns: float) -> list[tuple[int, int, float, float]]:
    """Chords ``(b0, b1, c, s)`` (ns, ns per byte) between breakpoints of the curve ``f`` covering
    [lo, hi], each as long as it stays under ``f`` and within ``tol_ns`` of it at every breakpoint it
    spans (``f`` is linear between breakpoints and where a falling last segment reaches 0, so it
    does everywhere)."""
    points = curve(link, kind).points()
    inner = curve(link, kind).bends(lo, hi)
    (b_a, t_a), (b_b, t_b) = points[-2], points[-1]
    if t_b < t_a:  # extended past the last breakpoint it falls, and stops at 0 (Link.time_ms):
        # linear up to floor(zero), 0 from ceil(zero) (a chord across the zero would lie above it)
        zero = b_b + t_b * (b_b - b_a) / (t_a - t_b)
        inner += sorted({b for b in (math.floor(zero), math.ceil(zero)) if lo < b < hi and b > b_b})
    bs = np.array([lo, *inner, hi], dtype=float)
    ts = np.array([link.time_ms(kind, int(b)) * NS_PER_MS for b in bs])
    chords, i, n = [], 0, len(bs)
    while i < n - 1:
        k = i + 1
        while k + 1 < n:
            slope = (ts[k + 1] - ts[i]) / (bs[k + 1] - bs[i])
            above = ts[i + 1:k + 1] - (ts[i] + slope * (bs[i + 1:k + 1] - bs[i]))  # f - chord inside
            if above.min() < 0 or above.max() > tol_ns:
                break
            k += 1
        slope = (ts[k] - ts[i]) / (bs[k] - bs[i])
        chords.append((int(bs[i]), int(bs[k]), float(ts[i] - slope * bs[i]), float(slope)))
        i = k
    return chords


def duration_pieces(link: Link, kind: str, lo: int, hi: int, slack_bytes: int,
                    tol_ns: float = PIECE_TOLERANCE_NS) -> list[tuple[int, int, list[tuple[float, float]]]]:
    """The curve of a table link on [lo, hi] as regions ``(b0, b1, lines)`` (lines ``(c, s)``, ns and ns
    per byte): on [b0, b1 + slack_bytes] the minimum of a region's lines lies under the curve, and
    on [b0, b1] within ``2 tol_ns`` of it. Why: the concave minorant of ``duration_lines`` is far
    from a curve that is not concave (torch's all_reduce: 0.45 ms at 8 nodes, 2.5 ms at 64, per
    bucket), which kept DDP plans from meeting their bound; choosing the region a bucket's bytes
    fall in (a boolean per region) makes the duration exact. A region grows while the
    minimum of its lines stays within ``tol_ns`` of its chords (always across a concave bend;
    across a convex one, which the minimum cannot follow, only while it is small).
    ``slack_bytes``: how far a bucket's bytes may lie past its region (the model counts each
    member's bytes rounded down to BYTE_UNIT); with a slack the lines are lowered to stay under
    the curve there, so exactness holds where it is 0."""
    chords = _interpolating_chords(link, kind, lo, hi, tol_ns)
    regions: list[list[tuple[int, int, float, float]]] = [[]]
    for chord in chords:
        if chord[1] - chord[0] <= 1:
            # a jump (torch's tables step at powers of two): its steep line, extended over a region,
            # would not fit the model's integers; its first byte is a flat region, then a new one
            regions += [[(chord[0], chord[0], chord[2] + chord[3] * chord[0], 0.0)], []]
            continue
        trial = regions[-1] + [chord]
        ends = np.array([b for c in trial for b in c[:2]], dtype=float)
        g = np.array([c[2] + c[3] * b for c in trial for b in c[:2]])  # the chords at their own ends
        low = np.min([c[2] + c[3] * ends for c in trial], axis=0)
        if (g - low).max() <= tol_ns:  # the minimum of lines still follows the chords
            regions[-1] = trial
        else:
            regions.append([chord])
    if not regions[-1]:  # the curve ends on a jump: its last byte is a region too
        b = chords[-1][1]
        regions[-1] = [(b, b, chords[-1][2] + chords[-1][3] * b, 0.0)]
    out = []
    for region in (r for r in regions if r):
        b0, b1 = region[0][0], region[-1][1]
        lines = [(c, s) for _, _, c, s in region]
        # past b1 (by at most slack_bytes) the curve may bend under the region's lines: lower them by that
        # the model reads the lines at a bucket's bytes rounded down, up to slack_bytes under its
        # true bytes: a falling line is read as if that far along (no change without a slack)
        lines = [(c + s * slack_bytes if s < 0 else c, s) for c, s in lines]
        past = [b1 + slack_bytes] + curve(link, kind).bends(b1, b1 + slack_bytes)
        excess = max(0.0, *(min(c + s * b for c, s in lines) - link.time_ms(kind, b) * NS_PER_MS for b in past))
        out.append((b0, b1, [(c - excess, s) for c, s in lines]))
    return out


def _add_exact_duration(m: cp_model.CpModel, dur, pieces: list, anchors, units, lo: int, hi: int, name: str) -> int:
    """``dur`` (ns) at least the region minimum of ``pieces`` (``duration_pieces``) where the bucket's
    bytes ``[lo, hi]`` fall; returns the regions used. A boolean per region when they are several
    (their sum is ``anchors``, 1 when the collective anchors a bucket; with one region ``anchors``
    is its boolean). Each region is stated relative to its start, on small numbers: ``dur >= base
    + rise`` where ``rise`` is at least the minimum of the region's lines over ``here``, the units
    past the region's first (0 unless the region is chosen), in fixed point under
    2**PIECE_MAGNITUDE_LOG2. Why so: stated on ``units`` itself with values up to 2**50, CP-SAT
    reported a feasible model INFEASIBLE (hf-qwen3-2 @ h100-8nodes, with its presolve off, and
    at 2**54 with it on; a plan with every variable fixed was accepted)."""
    used = [(b0, b1, lines) for b0, b1, lines in pieces if b1 >= lo and b0 <= hi]
    # the units a bucket in each region can count: from the anchor's own (the first region; its
    # rounding down) or the region's start, to the region's end or the reach (the last region);
    # a region with no whole unit in it (a jump's first byte, a boundary just under the reach) drops out
    ranges = [(lo // BYTE_UNIT if k == 0 else -(-b0 // BYTE_UNIT), hi // BYTE_UNIT if k == len(used) - 1 else b1 // BYTE_UNIT,
               lines) for k, (b0, b1, lines) in enumerate(used)]
    ranges = [r for r in ranges if r[1] >= r[0]]
    chosen = []
    for k, (u_lo, u_hi, lines) in enumerate(ranges):
        span = u_hi - u_lo
        # the least any line takes on the region (a line's least is at an end; a curve can fall)
        base = math.floor(min(c + s * BYTE_UNIT * u for c, s in lines for u in (u_lo, u_hi)))
        rel = [(c + s * BYTE_UNIT * u_lo - base, s * BYTE_UNIT) for c, s in lines]  # ns, ns per unit past u_lo
        largest = max(max(abs(c), abs(c + s * span)) for c, s in rel) + 1
        scale = 1 << max(0, PIECE_MAGNITUDE_LOG2 - math.ceil(math.log2(largest)))
        ints = [(math.floor(c * scale), math.floor(s * scale)) for c, s in rel]
        top = max(max(abs(c), abs(c + s * span)) for c, s in ints) + 1
        z = anchors if len(ranges) == 1 else m.new_bool_var(f"in_piece[{name},{k}]")
        here = m.new_int_var(0, span, f"piece_units[{name},{k}]")
        m.add(here == units - u_lo).only_enforce_if(z)
        m.add(here == 0).only_enforce_if(~z)
        least = m.new_int_var(-top, top, f"piece_least[{name},{k}]")
        m.add_min_equality(least, [c + s * here for c, s in ints])
        rise = m.new_int_var(0, top // scale + 1, f"piece_rise[{name},{k}]")
        m.add(scale * rise >= least)
        m.add(dur >= base + rise).only_enforce_if(z)
        chosen.append(z)
    if len(chosen) > 1:
        m.add(sum(chosen) == anchors)
    return len(chosen)


@dataclass
class StepModel:
    """The step variables added to a rule model; ``final`` is the step in ns."""

    handle: ModelHandle
    final: cp_model.LinearExpr
    floor_ns: int
    stats: dict = field(default_factory=dict)


def compute_prefix(problem: Problem) -> tuple[list[int], list[int], int]:
    """(positions of the pinned nodes, compute scheduled before each -- the unpinned compute
    just before it included, its own not -- total) in ns, the running sum rounded once so that
    differences telescope."""
    positions = [n.pos for n in problem.nodes]
    prefix, acc = [], 0.0
    for n in problem.nodes:
        acc += n.unpinned_ms
        prefix.append(to_ns(acc))
        acc += n.own_ms
    return positions, prefix, to_ns(acc)


@dataclass(frozen=True)
class _Pricing:
    """What pricing any bucket of one model reads: the model and its handle, the problem, the
    duration lines' ``magnitude``, each anchor's byte ``reach``, the least ms per byte of each
    (group, kind) curve (``least``) and the exact curve ``pieces`` where a minorant is not."""

    m: cp_model.CpModel
    handle: ModelHandle
    problem: Problem
    magnitude: int
    reach: BucketReach
    least: dict[tuple, Callable[[int], float]]
    pieces: dict[tuple, list]


def _anchor_terms(pricing: _Pricing, a: int, members: list[int], folded_ns: cp_model.LinearExprT = 0):
    """(launch, copy_in, copy_out, duration) in ns of the bucket ``a`` may anchor: 0 when it
    anchors nothing; copies only when something joins it (torch merges nothing alone), the
    copy-in with the folded conversions it runs (``folded_ns``, ``_folded_terms``)."""
    m, handle, problem = pricing.m, pricing.handle, pricing.problem
    magnitude, reach, least, pieces = pricing.magnitude, pricing.reach, pricing.least, pricing.pieces
    x, colls, cost = handle.x, handle.colls, problem.bucketing
    ca = problem.collectives[colls[a].idx]
    link = problem.link(ca.pg)
    joiners = [i for i in members if i != a]
    wires = {i: problem.collectives[colls[i].idx].wire_bytes for i in members}
    launch = copy_in = copy_out = 0
    if cost is not None:
        launch = to_ns(cost.launch_ms) * x[a, a]
    if cost is not None and joiners:
        merged = m.new_bool_var(f"merged[{ca.name}]")  # a has a joiner: torch's merge copies
        for i in joiners:
            m.add_implication(x[i, a], merged)
        m.add_implication(merged, x[a, a])
        cin, cout = {}, {}
        for i in members:
            pair = copy_bytes(ca.kind, [wires[i], 0], link.group_size, problem.bucket_mode)
            cin[i], cout[i] = to_ns(cost.copy_ms(pair[0])), to_ns(cost.copy_ms(pair[1]))
        copy_in = sum(cin[i] * x[i, a] for i in joiners) + cin[a] * merged
        copy_out = sum(cout[i] * x[i, a] for i in joiners) + cout[a] * merged
    if curve(link, ca.kind).is_line:
        # an α-β link is a line: its fixed part once, each member's bytes (exact up to ns)
        fixed = link.fixed_ms(ca.kind)
        dur = to_ns(fixed) * x[a, a] + sum(to_ns(link.time_ms(ca.kind, wires[i]) - fixed) * x[i, a] for i in members)
        return launch, copy_in + folded_ns, copy_out, dur
    # a table link: a concave minorant of its curve at the bucket's bytes, which never exceed
    # what a bucket issued at a's start can hold (``bounds.bucket_reach``)
    hi = min(sum(wires.values()), reach.anchored[ca.name])  # the reach is never below a's own bytes
    units = m.new_int_var(0, hi // BYTE_UNIT, f"bytes[{ca.name}]")
    m.add(units == sum((wires[i] // BYTE_UNIT) * x[i, a] for i in members))
    scale, lines = duration_lines(link, ca.kind, wires[a], hi, magnitude,
                                  rounded=sum(1 for w in wires.values() if w % BYTE_UNIT))
    # every byte costs at least the curve's least time per byte up to the reach (a linear cut the
    # LP sees even where it relaxes the minimum over lines away); 1 ns below it, as the lines, so
    # that it never asks more than the curve (it is exact at hi when time/bytes falls all the way)
    per_unit = math.floor(least[ca.pg, ca.kind](hi) * NS_PER_MS * BYTE_UNIT * scale)
    top = max(abs(c) + abs(s) * (hi // BYTE_UNIT) for c, s in lines) + 1
    scaled = m.new_int_var(-top, top, f"dur_scaled[{ca.name}]")
    m.add_min_equality(scaled, [c * x[a, a] + s * units for c, s in lines])
    # the least it needs to be, up to what the lines, the cut or the curve itself can ask (the
    # minorant's values can stay below the curve's highest, which the exact pieces ask)
    highest = math.ceil(_highest_ms(link, ca.kind, wires[a], hi) * NS_PER_MS)
    dur = m.new_int_var(0, max(max(top, per_unit * (hi // BYTE_UNIT)) // scale, highest) + 1, f"dur[{ca.name}]")
    m.add(scale * dur >= scaled)
    _add_chord_cut(m, dur, scale, lines, x[a, a], units, wires[a] // BYTE_UNIT, hi // BYTE_UNIT)
    if per_unit > 0:
        m.add(scale * dur >= per_unit * units - scale * x[a, a])
    if (ca.pg, ca.kind) in pieces:  # the exact curve, where the minorant above is not
        _add_exact_duration(m, dur, pieces[ca.pg, ca.kind], x[a, a], units, wires[a], hi, ca.name)
    return launch, copy_in + folded_ns, copy_out, dur


def bucket_terms(m: cp_model.CpModel, handle: ModelHandle, problem: Problem, anchors: list[int],
                  members: dict[int, list[int]], magnitude: int, reach: BucketReach, least: dict, pieces: dict):
    """Per anchor its ``_anchor_terms``, and what folded conversions leave behind when they move
    into a bucket's copy-in (``_folded_terms``)."""
    terms = {}
    folded_in, away = _folded_terms(handle, problem)
    pricing = _Pricing(m, handle, problem, magnitude, reach, least, pieces)
    for a in anchors:
        build_tick()  # a build that passes its deadline stops here too (planner.search.cpsat.build_guard)
        terms[a] = _anchor_terms(pricing, a, members[a], folded_in.get(a, 0))
    return terms, away


class _MovedAway:
    """The ns each folded conversion's own position loses when its collective is merged (an
    expression of the model's variables), taken in position order by the walk over events."""

    def __init__(self, moved: list[tuple[int, cp_model.LinearExprT]]):
        self.moved, self.k = sorted(moved, key=lambda t: t[0]), 0

    def take(self, pos: int | None) -> cp_model.LinearExprT:
        """What moved away from the positions before ``pos`` (None: all) not taken yet."""
        out: cp_model.LinearExprT = 0
        while self.k < len(self.moved) and (pos is None or self.moved[self.k][0] < pos):
            out = out + self.moved[self.k][1]
            self.k += 1
        return out


def _folded_terms(handle: ModelHandle, problem: Problem):
    """A folded conversion runs, when its collective is merged, as part of its bucket's copy-in
    and not at its own position (``planner.cost.simulator``): per anchor, the ns its members' moved
    conversions add to the copy-in; and the ns their own positions lose (``_MovedAway``)."""
    x, colls = handle.x, handle.colls
    by_name = {n.name: n for n in problem.nodes}
    adds: dict[int, cp_model.LinearExprT] = {}
    away = []
    for c in colls:
        folded = problem.collectives[c.idx].folded
        ns = sum(to_ns(by_name[f].est_ms) for f in folded)
        if not ns:
            continue
        joined = handle.joined(c.idx)
        merged = (1 - x[c.idx, c.idx]) + joined  # joins another, or is joined (0 or 1)
        for a in handle.anchors(c.idx):
            adds[a] = adds.get(a, 0) + ns * (x[c.idx, a] if a != c.idx else joined)
        away += [(by_name[f].pos, to_ns(by_name[f].est_ms) * merged) for f in folded]
    return adds, _MovedAway(away)


def chord_cut(lines: list[tuple[int, int]], lo: int, hi: int) -> tuple[int, int] | None:
    """``(c, s)`` with ``c + s u <= min_j (c_j + s_j u)`` for every ``u`` in ``[lo, hi]``: the chord of
    the concave minorant between ``lo`` and ``hi`` (a concave function lies above its chords),
    slope rounded down; None where it is not useful (one point) or the argument fails (a
    falling chord, whose rounding would lift the line at ``hi``)."""
    if hi <= lo:
        return None
    g_lo, g_hi = (min(c + s * u for c, s in lines) for u in (lo, hi))
    slope = (g_hi - g_lo) // (hi - lo)
    return None if slope < 0 else (g_lo - slope * lo, slope)


def _add_chord_cut(m: cp_model.CpModel, dur, scale: int, lines: list[tuple[int, int]], anchors, units,
                   lo: int, hi: int) -> None:
    """The chord as a linear cut on the bucket's duration. The min over lines is a disjunction
    CP-SAT's LP relaxes to almost nothing; the chord gives the LP the duration, exact at both ends
    (the collective alone, everything merged). Measured on llama3-8b-ddp-2 @ h100-8nodes (60 s, 2
    workers): bound 120.4 -> 128.3 ms, best plan 134.9 found at 6 s instead of 16 s.
    ``anchors`` is 0 (and ``units`` 0) when the collective anchors nothing."""
    cut = chord_cut(lines, lo, hi)
    if cut is not None:
        m.add(scale * dur >= cut[0] * anchors + cut[1] * units)


def pieces_by_key(problem: Problem, handle: ModelHandle, members: dict[int, list[int]], anchors: list[int],
                   reach: BucketReach) -> dict[tuple, list]:
    """``duration_pieces`` per (process group, kind) of a table link, over the bytes its buckets can
    have, with the slack of the most members a bucket of it can have whose bytes the model rounds
    (none where every member's bytes are whole BYTE_UNITs, as tensors' usually are: a region's
    lines lowered for that slack lost 0.5 ms where torch's curve falls past a power of two)."""
    colls = handle.colls
    spans: dict[tuple, list[int]] = {}
    for a in anchors:
        ca = problem.collectives[colls[a].idx]
        if curve(problem.link(ca.pg), ca.kind).is_line:
            continue
        wires = [problem.collectives[colls[i].idx].wire_bytes for i in members[a]]
        lo, hi, n = spans.setdefault((ca.pg, ca.kind), [ca.wire_bytes, ca.wire_bytes, 0])
        spans[ca.pg, ca.kind] = [min(lo, ca.wire_bytes), max(hi, min(sum(wires), reach.anchored[ca.name])),
                                 max(n, sum(1 for w in wires if w % BYTE_UNIT))]
    return {(pg, kind): duration_pieces(problem.link(pg), kind, lo, hi, BYTE_UNIT * n)
            for (pg, kind), (lo, hi, n) in spans.items() if hi > lo}


def horizon_ns(problem: Problem, reach: BucketReach, compute_ns: int) -> int:
    """A bound on every clock of the step model: twice the compute, each collective at the curve's
    highest up to the largest bucket it can be in (not its own time: a curve that bends up can
    price a merge above its members' sum), and every launch and copy."""
    horizon = compute_ns + sum(to_ns(_highest_ms(problem.link(c.pg), c.kind, c.wire_bytes, reach.member[c.name]))
                               for c in problem.collectives)
    if problem.bucketing is not None:
        horizon += len(problem.collectives) * to_ns(problem.bucketing.launch_ms) + sum(
            to_ns(problem.bucketing.copy_ms(c.wire_bytes * 2)) for c in problem.collectives)
    return 2 * horizon + 1


def add_step_objective(handle: ModelHandle, problem: Problem, *, floor_ms: float = 0.0,
                       reach: BucketReach | None = None, exact: bool = True) -> StepModel:
    """Make ``handle``'s model minimize the simulated step (ns); see the module docstring.
    ``floor_ms``: a valid lower bound on the step (``planner.cost.bounds.step_floor``), stated.
    ``reach``: ``bucket_reach(problem)`` when the caller has it. ``exact``: table curves by
    their ``duration_pieces`` too, else by the concave minorant alone."""
    m, colls, x, y = handle.model, handle.colls, handle.x, handle.y
    members = handle.candidate_members()
    anchors = sorted((a for a in members if (a, a) in x), key=lambda a: colls[a].s)
    waited_at: dict[int, list[tuple[int, int]]] = {}  # wait position -> (bucket anchor, wait anchor)
    for (a, b) in y:
        waited_at.setdefault(colls[b].w, []).append((a, b))
    positions, prefix, total = compute_prefix(problem)

    def compute_before(pos: int) -> int:
        return prefix[bisect.bisect_left(positions, pos)]

    reach = reach or bucket_reach(problem)
    horizon = horizon_ns(problem, reach, total)
    magnitude = min(MAGNITUDE_LOG2_MOST, 61 - math.ceil(math.log2(len(anchors) + 1)) - 2)
    least = per_byte_floors(problem)  # per table, computed once
    pieces = pieces_by_key(problem, handle, members, anchors, reach) if exact else {}
    terms, away = bucket_terms(m, handle, problem, anchors, members, magnitude, reach, least, pieces)

    # the walk over starts and waits in position order
    events = sorted([(colls[a].s, "s", a) for a in anchors] + [(w, "w", w) for w in waited_at])
    q_prev: cp_model.LinearExprT = 0
    prev_compute = 0
    stream_end: dict[str, cp_model.LinearExprT] = {}
    ends: dict[int, cp_model.IntVar] = {}
    clock_at_wait: dict[int, cp_model.IntVar] = {}
    n_events = 0
    for pos, what, ref in events:
        build_tick()
        here = compute_before(pos)
        gap = here - prev_compute - away.take(pos)  # a conversion that moved is not run where it was
        prev_compute = here
        n_events += 1
        if what == "s":
            a = ref
            launch, copy_in, _, dur = terms[a]
            q = m.new_int_var(0, horizon, f"issue[{colls[a].name}]")
            m.add(q == q_prev + gap + launch + copy_in)
            e = m.new_int_var(0, horizon, f"end[{colls[a].name}]")
            m.add(e >= q + dur)
            pg = colls[a].pg
            if pg in stream_end:
                m.add(e >= stream_end[pg] + dur)
            stream_end[pg] = e
            ends[a] = e
            q_prev = q
        else:
            s = m.new_int_var(0, horizon, f"stalled[{pos}]")
            m.add(s >= q_prev + gap)
            k = m.new_int_var(0, horizon, f"copy_out[{pos}]")
            for a, b in waited_at[pos]:
                if a not in ends:  # waited before it could be issued: the rules forbid it anyway
                    m.add(y[a, b] == 0)
                    continue
                # y[a, a] is also set for a collective that anchors nothing (its wait is its own
                # and vanishes): only an anchor's wait acts
                active = [y[a, b]] if a != b else [y[a, b], x[a, a]]
                m.add(s >= ends[a]).only_enforce_if(active)
                m.add(k >= terms[a][2]).only_enforce_if(active)
            t = m.new_int_var(0, horizon, f"clock[{pos}]")
            m.add(t == s + k)
            clock_at_wait[pos] = t
            q_prev = t
    redundant = _latest_wait_cuts(m, handle, anchors, ends, clock_at_wait)
    final = q_prev + (total - prev_compute) - away.take(None)
    floor_ns = max(0, to_ns(floor_ms) - n_events)  # minus the rounding of one ns per event
    m.add(final >= floor_ns)
    m.minimize(final)
    stats = {"step_events": n_events, "step_anchors": len(anchors), "step_redundant": redundant}
    return StepModel(handle, final, floor_ns, stats)


def _latest_wait_cuts(m: cp_model.CpModel, handle: ModelHandle, anchors: list[int], ends: dict,
                      clock_at_wait: dict) -> int:
    """Redundant cuts: with P_k the latest position at which any of the first k buckets of a
    group can be waited, the clock after P_k is at least the k-th end (each of those buckets is
    waited by then and the stream is FIFO; the k-th start lies before P_k). They tie the stream
    to the compute clock in the LP (a prototype measured them helping its proofs)."""
    colls = handle.colls
    latest: dict[int, int] = {}
    for (a, b) in handle.y:
        latest[a] = max(latest.get(a, -1), colls[b].w)
    added = 0
    by_pg: dict[str, list[int]] = {}
    for a in anchors:
        by_pg.setdefault(colls[a].pg, []).append(a)
    for chain in by_pg.values():
        horizon = -1
        for k, a in enumerate(chain):
            horizon = max(horizon, latest.get(a, -1))
            following = max(horizon, latest.get(chain[k + 1], -1)) if k + 1 < len(chain) else None
            if following != horizon and horizon in clock_at_wait:  # only the last end before P grows
                m.add(clock_at_wait[horizon] >= ends[a])
                added += 1
    return added



def hint_every_variable(handle: ModelHandle, twin: ModelHandle, plan: Plan, *, time_limit_s: float = 10.0) -> bool:
    """Hint ``plan`` with every variable of ``handle``'s model set, times included: ``twin`` (the
    same model, built the same way) is solved with the plan's assignment fixed and its values
    become the hints. A prototype measured full hints finding better plans sooner than x/y hints.
    False (and nothing hinted) when the plan does not fit the model's candidates."""
    if not _fix(twin, plan):
        return False
    solver = cp_model.CpSolver()
    solver.parameters.catch_sigint_signal = False  # Ctrl-C is ours (solver.run_search)
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = time_limit_s
    if solver.solve(twin.model) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return False
    model, fixed = handle.model, twin.model
    model.clear_hints()
    for k in range(len(model.proto.variables)):  # both built alike: same variables, same order
        var = model.get_int_var_from_proto_index(k)
        model.add_hint(var, solver.value(fixed.get_int_var_from_proto_index(k)))
    return True


def _fix(handle: ModelHandle, plan: Plan) -> bool:
    """Fix the assignment variables to ``plan`` (False if one of its choices is not a candidate)."""
    by_name = {c.name: c.idx for c in handle.colls}
    anchor_of = {i: i for i in range(len(handle.colls))}
    wait_of = dict(anchor_of)
    for b in plan.buckets:
        for name in b.members:
            anchor_of[by_name[name]] = by_name[b.start]
        wait_of[by_name[b.start]] = by_name[b.wait]
    if any((i, a) not in handle.x for i, a in anchor_of.items()) or \
            any((a, w) not in handle.y for a, w in wait_of.items() if anchor_of[a] == a):
        return False
    for (i, a), var in handle.x.items():
        handle.model.add(var == int(anchor_of[i] == a))
    for (a, b), var in handle.y.items():
        if anchor_of[a] == a:
            handle.model.add(var == int(wait_of[a] == b))
    return True
