"""planner/jobs/progress.py: the live line of a long search (``bucketplan solve``, ``compare``)."""

from __future__ import annotations


def test_a_long_search_is_never_silent_in_a_log():
    """`solve`'s live line: in a log (not a terminal) the latest incumbent/bound line is repeated
    every interval while the search is quiet, and nothing is repeated before the first line."""
    import time

    from planner.jobs.progress import LiveLine

    lines = []
    with LiveLine(lines.append, log_interval=0.05, tty=False) as live:
        time.sleep(0.12)
        assert lines == []  # nothing said yet: nothing to repeat
        live("incumbent 12.5 ms, bound 10 ms at 1.0s")
        time.sleep(0.3)
    assert lines[0] == "incumbent 12.5 ms, bound 10 ms at 1.0s"
    repeats = [x for x in lines[1:] if x.startswith("still searching")]
    assert len(repeats) >= 3 and all("incumbent 12.5 ms, bound 10 ms" in x for x in repeats)
    count = len(lines)
    time.sleep(0.15)
    assert len(lines) == count  # stopped with the search
