"""``bucketplan extract --graph GRAPH -o OUT`` held for a minute once the graph file is loaded, so
that a Ctrl-C lands after the file's code ran for certain (tests/test_graph_file.py); prints
``loaded`` on stderr when the hold begins.

    python -m tests.scripts.ctrl_c_after_graph_load GRAPH OUT
"""

import signal
import sys
import time

signal.signal(signal.SIGINT, signal.default_int_handler)

from bucketplan.cli import main  # noqa: E402
from fxglue.graph_file import GraphFile  # noqa: E402

real = GraphFile.load


def held_load(self):
    traced = real(self)
    print("loaded", file=sys.stderr, flush=True)
    time.sleep(60)
    return traced


if __name__ == "__main__":
    GraphFile.load = held_load
    sys.exit(main(["extract", "--graph", sys.argv[1], "-o", sys.argv[2], "-q"]))
