"""``bucketplan verify PROBLEM PLAN`` with its check made to take a minute, so that a Ctrl-C lands
inside it for certain (tests/test_solve_limits.py); prints ``checking`` when the check begins.

    python -m tests.scripts.slow_verify PROBLEM PLAN
"""

import signal
import sys
import time

signal.signal(signal.SIGINT, signal.default_int_handler)

import planner.rules.verifier  # noqa: E402
from bucketplan.cli import main  # noqa: E402

real = planner.rules.verifier.check


def slow_check(*a, **k):
    print("checking", flush=True)
    time.sleep(60)
    return real(*a, **k)


if __name__ == "__main__":
    planner.rules.verifier.check = slow_check
    sys.exit(main(["verify", sys.argv[1], sys.argv[2]]))
