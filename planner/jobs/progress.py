"""Progress of a long search for a person watching: the latest line kept alive.

Torch-free, so both ``bucketplan solve`` and ``bucketplan compare`` (through ``bucketplan.compare``)
use it."""

from __future__ import annotations

import sys
import threading
import time


class LiveLine:
    """The latest progress line kept alive while a long search runs, so it is never silent: on a
    terminal rewritten in place every ``interval`` seconds with the elapsed time; elsewhere (a
    log) repeated every ``log_interval`` seconds as its own line."""

    def __init__(self, say, *, interval: float = 1.0, log_interval: float = 15.0, tty: bool | None = None):
        self.say, self.last, self.start = say, "", time.perf_counter()
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.interval = interval if self.tty else log_interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)

    def __call__(self, msg: str) -> None:
        self.last = msg
        if self.tty:
            print("\r\033[K", end="", file=sys.stderr)
        self.say(msg)

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            if not self.last:
                continue
            elapsed = time.perf_counter() - self.start
            if self.tty:
                print(f"\r\033[K  ... {elapsed:.0f}s: {self.last[:120]}", end="", file=sys.stderr, flush=True)
            else:
                self.say(f"still searching ({elapsed:.0f}s); last: {self.last}")

    def __enter__(self) -> "LiveLine":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self.tty:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
