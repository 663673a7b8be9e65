"""`planner.core.io.replace_dir_atomically`: an output folder is replaced whole when a run completes, never mixed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from planner.core.io import check_replaceable, replace_dir_atomically


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() if p.is_file() else "/" for p in sorted(root.rglob("*"))}


@pytest.fixture
def previous_run(tmp_path) -> Path:
    out = tmp_path / "cmp"
    (out / "traces").mkdir(parents=True)
    (out / "compare.csv").write_text("old table")
    (out / "traces" / "old-workload.json").write_text("old trace")
    return out


def _writer(out: Path, *, fail_with: BaseException | None = None) -> None:
    """A run: traces first, the table last; ``fail_with`` stops it between the two."""
    (out / "traces").mkdir()
    (out / "traces" / "new-workload.json").write_text("new trace")
    if fail_with is not None:
        raise fail_with
    (out / "compare.csv").write_text("new table")


def test_a_completed_run_replaces_the_folder_and_leaves_nothing_beside_it(tmp_path, previous_run):
    with replace_dir_atomically(previous_run) as tmp:
        assert tmp.parent == previous_run.parent and tmp.name.startswith(f"cmp.tmp-{os.getpid()}-")
        assert list(tmp.iterdir()) == []
        _writer(tmp)
        assert _tree(previous_run)["compare.csv"] == "old table"  # untouched until the run is done
    assert _tree(previous_run) == {"compare.csv": "new table", "traces": "/", "traces/new-workload.json": "new trace"}
    assert [p.name for p in tmp_path.iterdir()] == ["cmp"]  # no temporary or old folder left


def test_a_new_folder_is_made_with_its_parents(tmp_path):
    out = tmp_path / "a" / "b" / "cmp"
    with replace_dir_atomically(out) as tmp:
        _writer(tmp)
    assert _tree(out)["compare.csv"] == "new table" and [p.name for p in out.parent.iterdir()] == ["cmp"]
    # made as any folder is (umask), not private as a tempfile.mkdtemp folder would be
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask


@pytest.mark.parametrize("error", [RuntimeError("solver crashed"), KeyboardInterrupt()])
def test_a_failed_or_interrupted_run_leaves_the_folder_as_it_was(tmp_path, previous_run, error):
    before = _tree(previous_run)
    with pytest.raises(type(error)):
        with replace_dir_atomically(previous_run) as tmp:
            _writer(tmp, fail_with=error)
    assert _tree(previous_run) == before
    assert [p.name for p in tmp_path.iterdir()] == ["cmp"]


def test_a_failed_first_run_leaves_no_folder(tmp_path):
    with pytest.raises(RuntimeError):
        with replace_dir_atomically(tmp_path / "cmp") as tmp:
            _writer(tmp, fail_with=RuntimeError("boom"))
    assert list(tmp_path.iterdir()) == []


def test_a_failed_swap_puts_the_old_folder_back(tmp_path, previous_run, monkeypatch):
    before = _tree(previous_run)
    real_rename = os.rename

    def rename(src, dst):  # the second rename (new folder into place) fails
        if Path(src).name.startswith("cmp.tmp-"):
            raise OSError("disk gone")
        real_rename(src, dst)
    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError, match="disk gone"):
        with replace_dir_atomically(previous_run) as tmp:
            _writer(tmp)
    assert _tree(previous_run) == before and [p.name for p in tmp_path.iterdir()] == ["cmp"]


def test_a_symlinked_folder_is_replaced_where_it_points(tmp_path, previous_run):
    link = tmp_path / "link"
    link.symlink_to(previous_run)
    with replace_dir_atomically(link) as tmp:
        _writer(tmp)
    assert link.is_symlink() and _tree(link)["compare.csv"] == "new table"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp", "link"]


def test_folders_that_must_not_be_replaced_are_refused_before_the_run(tmp_path, previous_run, monkeypatch):
    owned = ("compare.csv", "traces")
    (tmp_path / "file").write_text("x")
    mine = tmp_path / "home"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    monkeypatch.chdir(previous_run)
    for path, error in ((tmp_path / "file", NotADirectoryError), (mine, FileExistsError),
                        (previous_run, IsADirectoryError), (tmp_path, IsADirectoryError)):
        with pytest.raises(error):
            with replace_dir_atomically(path, owned=owned):
                raise AssertionError("the run must not start")
    assert (mine / "thesis.tex").read_text() == "years of work" and _tree(previous_run)["compare.csv"] == "old table"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp", "file", "home"]
    monkeypatch.chdir(tmp_path / "home")
    assert check_replaceable(previous_run, owned) == previous_run  # only what the command writes: replaceable


def test_compare_writes_through_the_swap(tmp_path, previous_run, monkeypatch, capsys):
    """run_compare and `bucketplan compare` with the workload itself faked: a run interrupted after
    writing a trace leaves the old folder whole; a completed one replaces it (no tracing here)."""
    import bucketplan.compare as compare
    from bucketplan.cli import main as cli

    before = _tree(previous_run)

    def interrupted(target, *, traces_to, **_):
        (traces_to / "traces").mkdir(exist_ok=True)
        (traces_to / "traces" / f"{target}--cpsat.json").write_text("{}")
        raise KeyboardInterrupt
    monkeypatch.setattr(compare, "compare_workload", interrupted)
    assert cli(["compare", "llama3-8b-ddp-2", "-o", str(previous_run), "-q", "--force"]) == 130
    assert "left as it was" in capsys.readouterr().err
    assert _tree(previous_run) == before and [p.name for p in tmp_path.iterdir()] == ["cmp"]

    def completed(target, *, traces_to, **_):
        (traces_to / "traces").mkdir(exist_ok=True)
        (traces_to / "traces" / f"{target}--cpsat.json").write_text("{}")
        return target
    monkeypatch.setattr(compare, "compare_workload", completed)
    monkeypatch.setattr(compare, "table_rows", lambda rows: [])
    monkeypatch.setattr(compare, "plots", lambda rows, out: (out / "timeline.png").write_bytes(b"png"))
    monkeypatch.setattr(compare, "save_plans", lambda rows, out: None)
    compare.run_compare(["llama3-8b-ddp-2"], out=previous_run)
    assert sorted(_tree(previous_run)) == ["compare.csv", "compare.json", "compare.md", "timeline.png", "traces",
                                           "traces/llama3-8b-ddp-2--cpsat.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["cmp"]


def test_compare_refuses_a_folder_it_would_wipe_before_tracing(tmp_path, capsys):
    from bucketplan.cli import main as cli

    (tmp_path / "notes.txt").write_text("mine")
    # a folder that exists is never silently replaced: the refusal names --force
    assert cli(["compare", "llama3-8b-ddp-2", "-o", str(tmp_path), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "exists" in err and "--force" in err
    # and --force still never wipes files compare did not write
    assert cli(["compare", "llama3-8b-ddp-2", "-o", str(tmp_path), "-q", "--force"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds files this command did not write (notes.txt)" in err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
