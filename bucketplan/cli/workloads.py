"""``bucketplan workloads``: the built-in workloads, one a line, name first."""

from __future__ import annotations


def add_parser(sub) -> None:
    s = sub.add_parser("workloads", help="list built-in workloads, one a line, name first")
    s.set_defaults(func=run)


def run(args) -> int:
    from fxglue.models.workloads import workloads

    for name, wl in workloads().items():
        print(f"{name}\t{wl.description}")
    return 0
