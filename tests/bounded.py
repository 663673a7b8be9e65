"""``bounded(seconds)``: for in-process calls that old code blocked in (opening a FIFO waits for
a writer; reading /dev/zero never ends): the test fails with TimeoutError instead of hanging the
run. Main thread only (SIGALRM)."""

from __future__ import annotations

import signal
from contextlib import contextmanager


@contextmanager
def bounded(seconds: int = 20, what: str = "the call"):
    def expired(*_):
        raise TimeoutError(f"{what} did not return within {seconds} s (blocked?)")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
