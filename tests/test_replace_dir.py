"""`planner.core.io.replace_dir_atomically`: an output folder is replaced whole when a run completes, never mixed;
only while it holds nothing but what an earlier run wrote (its manifest, at every depth, checked again at the swap);
one writer at a time."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from planner.core.io import MANIFEST, OutputFolderError, check_replaceable, replace_dir_atomically

OWNED = ("compare.csv", "traces")


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() if p.is_file() else "/" for p in sorted(root.rglob("*"))}


@pytest.fixture
def previous_run(tmp_path) -> Path:
    """An earlier run's folder, written as a run writes it: with its manifest."""
    out = tmp_path / "cmp"
    with replace_dir_atomically(out, owned=OWNED) as tmp:
        (tmp / "traces").mkdir()
        (tmp / "compare.csv").write_text("old table")
        (tmp / "traces" / "old-workload.json").write_text("old trace")
    return out


def _hold_lock(folder: Path) -> int:
    """Another run's lock on ``folder``: the file descriptor holding it (close it to let go)."""
    fd = os.open(folder.with_name(f".{folder.name}.lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


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
    assert [p.name for p in tmp_path.iterdir()] == ["cmp"]  # no temporary or old folder left, nor its lock


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
    (tmp_path / "file").write_text("x")
    mine = tmp_path / "home"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    monkeypatch.chdir(previous_run)
    for path, why in ((tmp_path / "file", "exists and is not a folder"),
                      (mine, r"holds files this command did not write \(thesis.tex\)"),
                      (previous_run, "is the current folder"), (tmp_path, "is the current folder")):
        with pytest.raises(OutputFolderError, match=why):
            with replace_dir_atomically(path, owned=OWNED):
                raise AssertionError("the run must not start")
    assert (mine / "thesis.tex").read_text() == "years of work" and _tree(previous_run)["compare.csv"] == "old table"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp", "file", "home"]
    monkeypatch.chdir(tmp_path / "home")
    assert check_replaceable(previous_run, OWNED) == previous_run  # only what the command wrote: replaceable


@pytest.mark.parametrize("change", ["nested file", "edited file", "symlink", "no manifest"])
def test_a_folder_is_replaced_only_while_it_holds_just_what_a_run_wrote(tmp_path, previous_run, change):
    """At every depth, not only the top-level names: a user's file in traces/, one of the run's
    files edited since, a link, or a folder with no manifest (a run that kept none) is refused."""
    if change == "nested file":
        (previous_run / "traces" / "mine").mkdir()
        (previous_run / "traces" / "mine" / "notes.txt").write_text("mine")
    elif change == "edited file":
        (previous_run / "traces" / "old-workload.json").write_text("old trace, annotated")
    elif change == "symlink":
        (previous_run / "traces" / "link").symlink_to(tmp_path)
    else:
        (previous_run / MANIFEST).unlink()
    before = _tree(previous_run)
    shown = {"nested file": "traces/mine/notes.txt", "edited file": "traces/old-workload.json",
             "symlink": "traces/link", "no manifest": f"compare.csv, traces/old-workload.json: no {MANIFEST}"}[change]
    with pytest.raises(OutputFolderError, match=f"holds files this command did not write \\({shown}"):
        with replace_dir_atomically(previous_run, owned=OWNED):
            raise AssertionError("the run must not start")
    assert _tree(previous_run) == before and [p.name for p in tmp_path.iterdir()] == ["cmp"]


def test_a_file_put_into_the_folder_during_the_run_keeps_it_and_the_results(tmp_path, previous_run):
    """Checked again right before the swap: a file dropped into a nested folder while the run
    went on keeps the old folder as it was (the file with it), and the run's results are left
    beside it, in the folder the refusal names."""
    with pytest.raises(OutputFolderError, match="found as the run ended") as refused:
        with replace_dir_atomically(previous_run, owned=OWNED) as tmp:
            _writer(tmp)
            (previous_run / "traces" / "r").mkdir()
            (previous_run / "traces" / "r" / "mine.txt").write_text("written meanwhile")
    assert "traces/r/mine.txt" in refused.value.strerror
    assert _tree(previous_run)["traces/r/mine.txt"] == "written meanwhile"
    assert _tree(previous_run)["compare.csv"] == "old table"
    kept = Path(refused.value.strerror.rpartition("results are in ")[2])
    assert kept.parent == tmp_path and kept.name.startswith("cmp.new-")
    assert _tree(kept)["compare.csv"] == "new table" and MANIFEST in _tree(kept)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp", kept.name]


def test_a_file_put_in_at_the_instant_of_the_swap_is_kept_aside(tmp_path, previous_run, monkeypatch):
    """The last moment: a file arriving between the check and the rename goes aside with the old
    folder, which is then kept (with a warning naming it) instead of deleted."""
    real_rename = os.rename

    def rename(src, dst):  # the old folder renamed aside: a file came just before
        if Path(src) == previous_run:
            (previous_run / "traces" / "late.txt").write_text("just in time")
        real_rename(src, dst)
    monkeypatch.setattr(os, "rename", rename)
    with pytest.warns(UserWarning, match="traces/late.txt came into the old folder during the swap") as warned:
        with replace_dir_atomically(previous_run, owned=OWNED) as tmp:
            _writer(tmp)
    assert _tree(previous_run)["compare.csv"] == "new table"
    aside = Path(str(warned[0].message).rpartition("kept in ")[2])
    assert aside.parent == tmp_path and _tree(aside)["traces/late.txt"] == "just in time"


def test_a_second_writer_of_the_folder_is_refused_at_once(tmp_path, previous_run):
    before = _tree(previous_run)
    fd = _hold_lock(previous_run)
    try:
        with pytest.raises(OutputFolderError, match="another run is writing this folder"):
            with replace_dir_atomically(previous_run, owned=OWNED):
                raise AssertionError("the run must not start")
    finally:
        os.close(fd)
    assert _tree(previous_run) == before
    with replace_dir_atomically(previous_run, owned=OWNED) as tmp:  # free again once the other one is done
        _writer(tmp)
    assert _tree(previous_run)["compare.csv"] == "new table"


def test_a_symlink_loop_is_refused_in_one_line(tmp_path):
    loop = tmp_path / "selfloop"
    loop.symlink_to(loop)
    with pytest.raises(OutputFolderError, match="is a symlink loop"):
        check_replaceable(loop, OWNED)
    with pytest.raises(OutputFolderError, match="is a symlink loop"):
        with replace_dir_atomically(loop, owned=OWNED):
            raise AssertionError("the run must not start")
    assert [p.name for p in tmp_path.iterdir()] == ["selfloop"] and loop.is_symlink()


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
    assert sorted(_tree(previous_run)) == [MANIFEST, "compare.csv", "compare.json", "compare.md", "timeline.png",
                                           "traces", "traces/llama3-8b-ddp-2--cpsat.json"]
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
