"""The command line's Ctrl-C latch (``bucketplan.cli.ctrl_c.CtrlC``) in a process of its own: it
sends SIGINT to itself, so a signal that went astray ends this process, never the test run.
Prints one line per step, ``ok`` last (tests/test_ctrl_c_keeps_work.py).

    python -m tests.scripts.ctrl_c_latch
"""

import os
import signal
import time
from types import SimpleNamespace

from bucketplan.cli.ctrl_c import CtrlC


def raised_while(step) -> bool:
    """Whether a KeyboardInterrupt came while ``step`` ran or within a second after it."""
    try:
        step()
        time.sleep(1)
    except KeyboardInterrupt:
        return True
    return False


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    ours = signal.getsignal(signal.SIGINT)
    latch = CtrlC.install()
    print("first raises", raised_while(lambda: os.kill(os.getpid(), signal.SIGINT)), flush=True)
    print("second raises", raised_while(lambda: os.kill(os.getpid(), signal.SIGINT)), flush=True)
    print("count", latch.count, flush=True)
    # a KeyboardInterrupt Python dropped ("Exception ignored in" a weakref callback) comes again,
    # after the hook has returned (raised inside it, it would be dropped again)
    returned = []
    print("dropped one comes again", raised_while(
        lambda: (latch._on_unraisable(SimpleNamespace(exc_value=KeyboardInterrupt())), returned.append(1))), flush=True)
    print("after the hook returned", returned == [1], flush=True)
    latch.uninstall(exiting=True)
    print("exiting: ignored", signal.getsignal(signal.SIGINT) == signal.SIG_IGN, flush=True)
    signal.signal(signal.SIGINT, ours)
    inside = CtrlC.install()
    inside.count = 1
    inside.uninstall()  # main() called inside a program: its handler back
    print("inside a program: its handler back", signal.getsignal(signal.SIGINT) == ours, flush=True)
    print("ok", flush=True)
