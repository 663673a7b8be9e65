"""One way to read a collective's time curve: what every model of time asks of a link.

Why this exists: the simulator, the step models (anchored and positioned), the floors and the
cuts each read a link's curve, and each branched on how the link was stored (an α-β line or a
table of breakpoints: ``link.table is None`` in ten places). They ask the same few questions:
the time at some bytes, the fixed part (what merging saves), whether the curve is one line (then
its fixed part and slope price it exactly), and where it bends between two byte counts (a curve
is linear between its bends, so its extremes, chords, hulls and minorants over an interval need
only those and the ends). ``Curve`` answers them; a new link model is a new ``Curve``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from planner.core.problem import Link


@dataclass(frozen=True)
class Curve:
    """The time of a collective of ``kind`` on ``link`` as a function of its wire bytes."""

    link: Link
    kind: str

    def time_ms(self, wire_bytes: int) -> float:
        return self.link.time_ms(self.kind, wire_bytes)

    @property
    def fixed_ms(self) -> float:
        """The time at 0 bytes: what merging two collectives saves, at most."""
        return self.link.fixed_ms(self.kind)

    @property
    def is_line(self) -> bool:
        """One line over every byte count (an α-β link): its fixed part plus a constant time per
        byte, exactly."""
        return self.link.table is None

    def bends(self, lo: int = 0, hi: int | None = None) -> list[int]:
        """The byte counts strictly between ``lo`` and ``hi`` (None: no upper end) where the
        curve bends, ascending; none for a line."""
        if self.is_line:
            return []
        points = self.link.table.get(self.kind)
        if points is None:
            raise ValueError(f"link {self.link.pg}: its table has no {self.kind}")
        bs = [b for b, _ in points]
        start = bisect.bisect_right(bs, lo)
        stop = len(bs) if hi is None else bisect.bisect_left(bs, hi)
        return bs[start:stop]

    def points(self) -> list[tuple[int, float]]:
        """A table's own breakpoints ``(bytes, ms)``, from 0 (a line has none: ``is_line``)."""
        return [] if self.is_line else list(self.link.table[self.kind])


def curve(link: Link, kind: str) -> Curve:
    return Curve(link, kind)
