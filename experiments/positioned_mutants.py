"""Mutation run of the positioned CP-SAT model: each constraint of ``planner/search/free/model.py``
dropped in turn, and ``tests/test_positioned.py`` run against the mutant.

A mutant is *killed* when some test fails; one that survives is either an equivalent mutant (the
constraint is implied by others: the table says why) or a gap in the tests. The mutation is made
on a copy of the source tree in a temporary folder (the checkout is never touched); the statement
on the named line becomes ``pass``. The tests run with one hypothesis seed, stopping at the first
failure, so a run is repeatable. The unmutated tree runs first and must pass.

    python -m experiments.positioned_mutants                      # every mutant
    python -m experiments.positioned_mutants --only fifo stall    # some

Writes ``table.md`` and ``rows.jsonl`` into ``--out`` (experiments/results/positioned_mutants).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.common import git_revision, machine, markdown_table

ROOT = Path(__file__).resolve().parents[1]
TARGET = "planner/search/free/model.py"
TESTS = "tests/test_positioned.py"
# (id, the statement dropped, exactly as it stands in TARGET, what it says)
MUTANTS = [
    ("one-bucket", "m.add_exactly_one(x[c.idx, a] for (i, a) in x if i == c.idx)",
     "every collective is in exactly one bucket"),
    ("anchor-member", "m.add_implication(var, x[a, a])", "a bucket's anchor is one of its members"),
    ("bucket-cap", "m.add(sum(colls[j].size * x[j, a] for j in js) <= (cap - colls[a].size) * x[a, a])",
     "a bucket's bytes stay within the bucket cap"),
    ("named-start-anchor", "            m.add_implication(lit, x[a, a])\n            starts[a]",
     "a named start belongs to a bucket that exists"),
    ("own-wait-member", "m.add_implication(y[a, b], x[b, a])", "a bucket waits at a member's own wait"),
    ("named-wait-anchor", "            m.add_implication(lit, x[a, a])\n            waits[a]",
     "a named wait belongs to a bucket that exists"),
    ("one-start", "m.add_exactly_one(lit for _, lit, _ in starts[a])", "a bucket starts at one place"),
    ("one-wait", "m.add_exactly_one(lit for _, lit, _ in waits[a])", "a bucket waits at one place"),
    ("member-start", "m.add(fs[i] == st[a]).only_enforce_if(var)", "a member starts where its bucket does"),
    ("member-wait", "m.add(fw[i] == wt[a]).only_enforce_if(var)", "a member waits where its bucket does"),
    ("start-before-wait", "m.add(st[c.idx] < wt[c.idx])", "a bucket starts before it waits"),
    ("release", "m.add(fs[c.idx] > SCALE * c.s_lo)", "a start follows its data's producers"),
    ("deadline", "m.add(fw[c.idx] < SCALE * c.w_hi)", "a wait precedes its consumers"),
    ("waits-before-start", "            m.add(fw[j] < fs[c.idx])\n        for j, _",
     "a start follows the waits it consumes"),
    ("folded-waits", "            m.add(fw[j] < fs[c.idx])\n\n",
     "a start follows the waits its folded conversion consumes"),
    ("issue", "m.add(begin[a] >= issue[a])", "a bucket begins on its stream after it is issued"),
    ("duration", "m.add(end[a] >= begin[a] + terms[a][3])", "a bucket lasts its duration"),
    ("launch-copy-in", "m.add(overhead >= launch + copy_in).only_enforce_if(lit)",
     "a start charges its launch and copy-in to compute"),
    ("clock-at-start", "m.add(t == clock + overhead)", "the compute clock after a start"),
    ("issued-at-clock", "m.add(issue[a] >= t).only_enforce_if(lit)", "a bucket is issued at the clock of its start"),
    ("fifo", "m.add(begin[a] >= frontier[pg]).only_enforce_if(lit)",
     "a bucket begins after its stream's earlier buckets end (FIFO)"),
    ("frontier-kept", "m.add(f >= frontier[pg])", "the stream's frontier never moves back"),
    ("frontier-end", "m.add(f >= end[a]).only_enforce_if(lit)", "the frontier passes a started bucket's end"),
    ("stall-clock", "m.add(stalled >= clock)", "a wait never moves the clock back"),
    ("stall", "m.add(stalled >= end[a]).only_enforce_if(lit)", "a wait blocks compute until its bucket ends"),
    ("copy-out", "m.add(copy_out >= terms[a][2]).only_enforce_if(lit)", "a wait charges its copy-out"),
    ("clock-at-wait", "m.add(t == stalled + copy_out)", "the compute clock after a wait"),
    ("merged", "m.add_max_equality(g, others)", "merged: the anchor has another member"),
    ("cap", "self.h.model.add(held <= self.cap - self.own(tick / INSTANTS_PER_POSITION))",
     "the memory at an instant is within the cap"),
    ("alive-one", "m.add(alive >= nbytes * (member + sum(factors) - len(factors)))",
     "a buffer counts when its member and places say it is alive"),
    ("alive-group", "m.add(alive >= sum(nbytes * member for nbytes, member in held) - most * (1 - cond))",
     "buffers of one bucket alive under one condition count together"),
    ("all-of", "self.h.model.add(lit >= sum(factors) - (len(factors) - 1))",
     "a conjunction of place literals"),
    ("place-in", "self.h.model.add(lit == sum(options[k][1] for k in chosen))",
     "a literal for 'the bucket sits at one of these places'"),
    ("last-use", "self.h.model.add_implication(lit, z)", "a member used later keeps the wait's storage alive"),
    ("alone-conversion", "m.add_implication(alone, lit.Not())",
     "a bucket of one starts after its own folded conversion"),
]
# Mutants no test can kill, and why: the constraint changes no solution the objective prefers.
EQUIVALENT = {
    "named-start-anchor": "a named start of a collective that anchors no bucket belongs to an empty bucket: "
                          "it moves no member and only adds launch time, so no optimum takes it",
    "named-wait-anchor": "likewise for a named wait: an empty bucket's wait stalls on nothing",
    "start-before-wait": "a wait placed before its own start would have to end before the bucket is issued; "
                         "the clock only moves forward, so that is infeasible for any bucket that takes time",
}


def _mutate(text: str, statement: str) -> str:
    """``text`` with ``statement`` (its first line, when it names its context) made ``pass``."""
    if text.count(statement) != 1:
        raise SystemExit(f"{TARGET}: {statement!r} occurs {text.count(statement)} times, not once")
    first = statement.lstrip("\n").split("\n")[0]
    indent = first[:len(first) - len(first.lstrip())]
    rest = statement[statement.index(first) + len(first):]
    return text.replace(statement, f"{indent}pass  # mutant{rest}")


def _run_tests(tree: Path, timeout_s: int) -> tuple[str, str, float]:
    """('passed' | 'killed' | 'timeout', the first failing test, seconds) of TESTS in ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    try:
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                              "--hypothesis-seed=0", "-m", "", TESTS], cwd=tree, env=env,
                             capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "timeout", "", time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    if run.returncode == 0:
        return "passed", "", seconds
    failed = [line.split()[1] for line in run.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return "killed", (failed[0].split("::")[-1] if failed else f"exit {run.returncode}"), seconds


def _tree(tmp: Path) -> Path:
    tree = tmp / "tree"
    ignore = shutil.ignore_patterns(".git", "__pycache__", ".hypothesis", "results", "*.egg-info")
    for part in ("planner", "fxglue", "bucketplan", "tests", "experiments"):
        shutil.copytree(ROOT / part, tree / part, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")  # pytest's markers and options
    return tree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="mutant ids (default: all)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per test run")
    ap.add_argument("--out", type=Path, default=Path("experiments/results/positioned_mutants"))
    args = ap.parse_args()
    chosen = [m for m in MUTANTS if not args.only or m[0] in args.only]
    unknown = set(args.only or ()) - {m[0] for m in MUTANTS}
    if unknown:
        raise SystemExit(f"--only: no mutant {sorted(unknown)[0]!r}")
    source = (ROOT / TARGET).read_text()
    revision = git_revision()  # of the tree copied now, which every mutant is made from
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tree = _tree(Path(tmp))
        status, first, seconds = _run_tests(tree, args.timeout)
        print(f"unmutated: {status} in {seconds:.0f} s", flush=True)
        if status != "passed":
            raise SystemExit(f"the unmutated tests do not pass ({first}): nothing to measure")
        for ident, statement, meaning in chosen:
            (tree / TARGET).write_text(_mutate(source, statement))
            status, first, seconds = _run_tests(tree, args.timeout)
            rows.append({"mutant": ident, "dropped": meaning, "result": status,
                         "failing_test": first or EQUIVALENT.get(ident, "") if status == "passed" else first,
                         "seconds": round(seconds, 1)})
            print(f"{ident}: {status} {first} ({seconds:.0f} s)", flush=True)
        (tree / TARGET).write_text(source)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "rows.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    killed = sum(r["result"] == "killed" for r in rows)
    command = "python -m experiments.positioned_mutants" + (f" --only {' '.join(args.only)}" if args.only else "")
    equivalent = sum(r["result"] == "passed" and r["mutant"] in EQUIVALENT for r in rows)
    lines = ["# Mutants of the positioned CP-SAT model against tests/test_positioned.py", "",
             f"`{command}`; git {revision}; {machine()}.", "",
             f"{killed} of {len(rows)} mutants killed; {equivalent} survive as equivalent (the reason in "
             f"`failing_test`); {len(rows) - killed - equivalent} survive unexplained.", "",
             *markdown_table(["mutant", "dropped", "result", "failing_test", "seconds"], rows)]
    (args.out / "table.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
