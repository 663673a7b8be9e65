"""Provenance shared by the experiment scripts: git revision and machine description."""

from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from planner.jobs.tables import TableStyle, markdown_lines


def git_revision() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        # results are outputs, not code: a run that rewrites committed tables is not "dirty"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)experiments/results"], capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict:
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "platform": platform.platform()}


def load_gz(path, model):
    """A gzipped Problem or Plan saved by ``save_gz`` (validated like any other input)."""
    import gzip

    return model.model_validate_json(gzip.decompress(Path(path).read_bytes()))


def save_gz(obj, path) -> None:
    import gzip

    import planner

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(planner.core.io.dumps(obj).encode()))


@functools.lru_cache(maxsize=4)
def _case_problems(folder: str) -> dict:
    import planner

    return {q.fingerprint: (f.name, q) for f in sorted(Path(folder).glob("*problem*.json.gz"))
            for q in [load_gz(f, planner.Problem)]}


def case_problems(folder) -> dict:
    """Every problem file of a case folder of a presets run, by fingerprint: (file name, problem).
    Loaded once per folder (a 32-layer problem takes a second), so every plan of the case finds its
    own problem (the one its ``problem_fingerprint`` names) without reading the files again."""
    return _case_problems(str(Path(folder).resolve()))


def read_rows(path) -> list[dict]:
    """The rows of a ``rows.jsonl`` written by ``append_row`` (none if it does not exist yet)."""
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def append_row(path, row: dict) -> None:
    """One finished row, appended at once: an interrupted run keeps what it finished and resumes."""
    with Path(path).open("a") as f:
        f.write(json.dumps(row) + "\n")


def rewrite_rows(path, rows: list[dict]) -> None:
    """``rows`` as the whole of ``rows.jsonl``, written atomically (a row replaced or dropped)."""
    from planner.core.io import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def run_missing(out: Path, cases, run, case_key, row_key) -> list[dict]:
    """``out/rows.jsonl``'s rows, then ``run(case)`` for every case whose ``case_key(case)`` is no
    row's ``row_key(row)``, each row appended as it ends (a run resumes where it stopped)."""
    rows = read_rows(out / "rows.jsonl")
    done = {row_key(r) for r in rows}
    for case in cases:
        if case_key(case) in done:
            continue
        print(f"{case.name} ...", file=sys.stderr, flush=True)
        row = run(case)
        rows.append(row)
        append_row(out / "rows.jsonl", row)
    return rows


def markdown_table(cols: list[str], rows: list[dict]) -> list[str]:
    """Header, rule and one line per row (missing cells empty, None as "None", "|" kept: the
    committed results tables as they were written)."""
    return markdown_lines(cols, rows, TableStyle(cell=str, pipe=None))
