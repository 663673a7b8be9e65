"""``bucketplan solve --positions free --deterministic``, run twice on one problem: the same plan,
byte for byte, even when the second run shares the machine with a busy process.

The problem is extracted once with the CLI (``bucketplan extract``, torch's schedule on
``--preset``). Each run is the CLI as a user types it; the second runs beside a process that keeps
one more core busy, so a search that read the wall clock would see less of it. The table gives
each run's load (the 1-minute load average before it), plan hash (sha256 of the file), step,
peak, evaluations and wall seconds.

    python -m experiments.deterministic_positioned --workload llama3-8b-fsdp-8 --time-limit 30

Writes ``table.md`` and ``rows.jsonl`` into ``--out``
(experiments/results/deterministic_positioned).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from experiments.common import git_revision, machine, markdown_table


def _busy() -> None:
    while True:
        pass


def _cli(*argv: str) -> subprocess.CompletedProcess:
    exe = shutil.which("bucketplan")
    if exe is None:
        raise SystemExit("bucketplan is not installed (README: pip install -e .)")
    run = subprocess.run([exe, *argv], capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"bucketplan {' '.join(argv)}: exit {run.returncode}\n{run.stderr[-2000:]}")
    return run


def _field(out: str, name: str) -> str:
    match = re.search(rf"^{name}\s+(.*)$", out, re.M)
    return match.group(1) if match else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="llama3-8b-fsdp-8")
    ap.add_argument("--preset", default="h100-8nodes")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/deterministic_positioned"))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _cli("extract", args.workload, "--preset", args.preset, "-o", str(folder))
        for k, loaded in ((1, False), (2, True)):
            burner = multiprocessing.Process(target=_busy, daemon=True) if loaded else None
            if burner is not None:
                burner.start()
            try:
                load_before = os.getloadavg()[0]
                t0 = time.perf_counter()
                run = _cli("solve", str(folder / "problem.json"), "-o", str(folder / f"plan-{k}.json"),
                           "--positions", "free", "--deterministic", "--time-limit", str(args.time_limit))
                seconds = time.perf_counter() - t0
            finally:
                if burner is not None:
                    burner.terminate()
            data = (folder / f"plan-{k}.json").read_bytes()
            wall = _field(run.stdout, "wall")
            rows.append({"run": k, "load": "one more core kept busy" if loaded else "as it was",
                         "load_avg_1min": round(load_before, 1),
                         "sha256": hashlib.sha256(data).hexdigest()[:16],
                         "step_ms": _field(run.stdout, "step / bound").split(" ms")[0],
                         "peak_gb": _field(run.stdout, "peak memory").split(" GB")[0],
                         "evaluations": (re.search(r"(\d+) evaluations", wall) or [None, ""])[1],
                         "seconds": round(seconds, 1)})
            print(rows[-1], flush=True)
    same = rows[0]["sha256"] == rows[1]["sha256"]
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "rows.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    command = (f"python -m experiments.deterministic_positioned --workload {args.workload} "
               f"--preset {args.preset} --time-limit {args.time_limit:g}")
    lines = [f"# `solve --positions free --deterministic` twice on {args.workload} @ {args.preset}", "",
             f"`{command}`; git {git_revision()}; {machine()}.", "",
             f"The two plan files are {'identical, byte for byte' if same else 'DIFFERENT'}.", "",
             *markdown_table(["run", "load", "load_avg_1min", "sha256", "step_ms", "peak_gb", "evaluations",
                              "seconds"], rows)]
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    if not same:
        raise SystemExit("the two deterministic runs wrote different plans")


if __name__ == "__main__":
    main()
