"""Graphs from anywhere: read and write FX graphs in torch's repro format.

Why this exists: users meet collectives in graphs they already have -- torch's minifier and AOT
repro files (``torch._dynamo.repro.after_aot.save_graph_repro``: a ``Repro`` module, a
``load_args(reader)`` function and, for distributed graphs, ``setup_fake_process_groups({...})``
under ``__main__``), graphs other tools dump, the forward and the backward graph a compile
produces separately. ``load_graph`` turns such a file into a ``TracedWorkload`` that goes
through the same ``fxglue.pipeline.prepare`` as a built-in workload; ``save_graph`` writes a
traced workload in that format (torch's own writer, plus what bucketplan needs to read it back
as it was: the groups' roles, the parameter names and the transformer blocks).

How a file is read:
- It is executed as a module (never as ``__main__``, so its ``run_repro`` does not run). The
  environment variables and torch configs a repro sets at import are put back afterwards.
- The ``Repro`` module's forward is traced by ``torch.fx`` and every device literal in it
  (``device(type='cuda', index=0)``) is mapped to the CPU; ``load_args`` is answered by a reader
  that makes fake CPU tensors of the recorded shapes, strides and dtypes (no data is read:
  storages shared between inputs become separate tensors); then the graph is traced once more
  under ``FakeTensorMode``, as built-in workloads are (``workloads.trace_step``).
- Process groups: ``--group NAME=SIZE[@RANKS_PER_NODE][:dp|tp]`` flags, else the file's
  ``get_pg_config()`` (``{name: {"size": N, "role": "tp", "ranks_per_node": R}}``, role and ranks
  per node optional), else the ``setup_fake_process_groups({...})`` literal torch writes. Every
  group a collective names must be sized by one of them. Groups are data-parallel unless marked
  ``tp``; ranks per node default to the cluster preset's layout for that role.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.machinery
import importlib.util
import io
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.fx as fx

from fxglue.models.base import Groups, TracedWorkload, WorkloadError

ROLES = ("dp", "tp")
_CONFIGS = ("torch._dynamo.config", "torch._inductor.config", "torch._functorch.config",
            "torch.fx.experimental._config")
_GROUP_FLAG = re.compile(r"^(?P<name>[^=\s]+)=(?P<size>\d+)(?:@(?P<per_node>\d+))?(?::(?P<role>\w+))?$")


class GraphFileError(WorkloadError):
    """A graph file that cannot be planned: one line naming the file and what is wrong."""


@dataclass(frozen=True)
class GroupSpec:
    """A process group of a graph file: its name in the graph, size, role and ranks per node."""

    name: str
    size: int
    role: str = "dp"
    ranks_per_node: int | None = None  # None: the cluster preset's layout for the role


def parse_group(text: str) -> GroupSpec:
    """``--group NAME=SIZE[@RANKS_PER_NODE][:dp|tp]``."""
    m = _GROUP_FLAG.match(text)
    if not m or int(m["size"]) < 1 or (m["per_node"] is not None and int(m["per_node"]) < 1):
        raise GraphFileError(f"--group {text!r}: give NAME=SIZE[@RANKS_PER_NODE][:dp|tp], sizes positive "
                             "(e.g. 0=64 or 3=8@8:tp)")
    role = m["role"] or "dp"
    if role not in ROLES:
        raise GraphFileError(f"--group {text!r}: role {role!r} is not one of {', '.join(ROLES)}")
    return GroupSpec(m["name"], int(m["size"]), role, int(m["per_node"]) if m["per_node"] else None)


@dataclass(frozen=True)
class GraphFile:
    """A graph file as a workload: ``fxglue.pipeline.prepare`` loads it afresh each time (the
    scheduler reorders a traced graph in place, so one load serves one problem)."""

    path: str
    groups: tuple[GroupSpec, ...] | None = None  # None: the file's own

    @property
    def name(self) -> str:
        return f"graph:{Path(self.path).name}"

    def load(self) -> TracedWorkload:
        return load_graph(self.path, None if self.groups is None else list(self.groups))


# ---------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------


class _FakeInputReader:
    """What ``load_args(reader)`` calls, answered with fake CPU tensors (under the caller's
    FakeTensorMode) of the recorded shapes and dtypes; devices are ignored."""

    def __init__(self):
        self.args: list = []

    def storage(self, storage_hash, nbytes, *, device=None, dtype_hint=None):
        return (nbytes, dtype_hint)

    def tensor(self, storage, shape, stride=None, *, storage_offset=None, dtype=None, requires_grad=None,
               is_leaf=None, **metadata):
        dtype = dtype or torch.float32
        t = (torch.empty(tuple(shape), dtype=dtype) if stride is None
             else torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype))
        self.args.append(t)
        return t

    def symint(self, val):
        self.args.append(val)
        return val


def _exec_module(path: Path):
    """The file run as a module (not ``__main__``); the environment and torch configs it changes
    at import are restored afterwards."""
    import importlib

    name = "bucketplan_graph_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    environ = dict(os.environ)
    configs = {c: importlib.import_module(c) for c in _CONFIGS}
    saved = {c: m.save_config() for c, m in configs.items()}
    try:
        # a source loader whatever the suffix (a dumped graph is not always named .py)
        spec = importlib.util.spec_from_loader(name, importlib.machinery.SourceFileLoader(name, str(path)))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as e:
        raise GraphFileError(f"{path}: does not load: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                             ) from None
    finally:
        os.environ.clear()
        os.environ.update(environ)
        with warnings.catch_warnings():  # restoring a deprecated key warns; it is only put back
            warnings.simplefilter("ignore", FutureWarning)
            for c, m in configs.items():
                m.load_config(saved[c])
    return module


def _main_block_groups(source: str) -> dict | None:
    """The literal torch's repro passes to ``setup_fake_process_groups`` under ``__main__``."""
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
                == "setup_fake_process_groups" and node.args):
            try:
                return ast.literal_eval(node.args[0])
            except ValueError:
                return None
    return None


def _config_groups(path: Path, module, source: str) -> list[GroupSpec]:
    """The groups the file itself sizes: ``get_pg_config()``, else torch's ``setup_fake_process_groups``."""
    config = None
    if callable(getattr(module, "get_pg_config", None)):
        try:
            config = module.get_pg_config()
        except Exception as e:
            raise GraphFileError(f"{path}: get_pg_config() failed: {type(e).__name__}: {e}") from None
    if config is None:
        config = _main_block_groups(source) or {}
    if not isinstance(config, dict):
        raise GraphFileError(f"{path}: get_pg_config() returned {type(config).__name__}, not a dict of groups")
    groups = []
    for name, info in config.items():
        info = {"size": info} if isinstance(info, int) else info
        size, role, per_node = (info.get("size"), info.get("role", "dp"), info.get("ranks_per_node")
                                ) if isinstance(info, dict) else (None, None, None)
        if not isinstance(size, int) or size < 1 or role not in ROLES or not (per_node is None or (
                isinstance(per_node, int) and per_node >= 1)):
            raise GraphFileError(f"{path}: group {name!r}: {info!r} is not {{'size': N[, 'role': 'dp'|'tp', "
                                 "'ranks_per_node': R]}")
        groups.append(GroupSpec(str(name), size, role, per_node))
    return groups


def _map_devices(gm: fx.GraphModule) -> int:
    """Every device literal of the graph on the CPU (a trace here has no GPU); how many were mapped."""
    from torch.utils._pytree import tree_map

    mapped = 0

    def to_cpu(x):
        nonlocal mapped
        if isinstance(x, torch.device) and x.type != "cpu":
            mapped += 1
            return torch.device("cpu")
        return x

    for n in gm.graph.nodes:
        n.args, n.kwargs = tree_map(to_cpu, n.args), tree_map(to_cpu, n.kwargs)
        if isinstance(n.kwargs.get("device"), str) and n.kwargs["device"] != "cpu":
            n.kwargs = {**n.kwargs, "device": torch.device("cpu")}
            mapped += 1
    gm.recompile()
    return mapped


def graph_group_names(gm: fx.GraphModule) -> list[str]:
    """The process-group names the graph's collectives use, in order of first use."""
    from torch._inductor.fx_passes.overlap_scheduling import get_group_name

    from fxglue.estimator import collective_kind

    names: dict[str, None] = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and collective_kind(n) is not None:
            names[get_group_name(n)] = None
    return list(names)


def _register_groups(path: Path, groups: list[GroupSpec]) -> None:
    """The graph's group names registered on torch's fake process group (rank 0): a group as large
    as the world is the world group, a smaller one a new group of the first ranks."""
    from torch._C._distributed_c10d import _register_process_group
    from torch.distributed.distributed_c10d import _get_group_size_by_name

    from fxglue.models.workloads import ensure_fake_world

    ensure_fake_world(max(g.size for g in groups))
    world = dist.get_world_size()
    for g in groups:
        try:
            size = _get_group_size_by_name(g.name)
        except Exception:  # not registered yet
            size = None
        if size == g.size:
            continue
        if size is not None:
            raise GraphFileError(f"{path}: group {g.name!r} of {g.size} ranks: that name is taken by a group of "
                                 f"{size} ranks in this process (the world group is {dist.group.WORLD.group_name!r})")
        pg = dist.group.WORLD if g.size == world else dist.new_group(list(range(g.size)))
        _register_process_group(g.name, pg)


def load_graph(path: str | os.PathLike, groups: list[GroupSpec] | None = None) -> TracedWorkload:
    """A repro-format graph file as a traced workload, on fake CPU tensors (module docstring)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fxglue.models.workloads import trace_step
    from planner.io import read_regular_text

    path = Path(path)
    t0 = time.perf_counter()
    try:
        source = read_regular_text(path, 256 << 20, "graph file")
    except (OSError, ValueError) as e:
        raise GraphFileError(f"{path}: cannot read the graph file: {e}") from None
    module = _exec_module(path)
    repro = getattr(module, "mod", None)
    if not isinstance(repro, torch.nn.Module):
        repro = getattr(module, "Repro", None)
        repro = repro() if isinstance(repro, type) and issubclass(repro, torch.nn.Module) else None
    load_args = getattr(module, "load_args", None)
    if repro is None or not callable(load_args):
        raise GraphFileError(f"{path}: not a repro file: it needs a Repro module (or `mod`) and load_args(reader), "
                             "as torch's save_graph_repro writes them")
    if getattr(load_args, "_version", 0) > 0:
        raise GraphFileError(f"{path}: load_args is version {load_args._version}; torch {torch.__version__} "
                             "writes version 0")
    try:
        gm = fx.symbolic_trace(repro)
    except Exception as e:
        raise GraphFileError(f"{path}: the Repro module does not trace: {type(e).__name__}: {e}") from None
    mapped = _map_devices(gm)
    used = graph_group_names(gm)
    if not used:
        raise GraphFileError(f"{path}: no collectives (all_gather, reduce_scatter, all_reduce) in the graph")
    specs = {g.name: g for g in (_config_groups(path, module, source) if groups is None else groups)}
    missing = [name for name in used if name not in specs]
    if missing:
        raise GraphFileError(f"{path}: the graph's collectives use group {missing[0]!r}, which neither "
                             f"{'--group' if groups is not None else 'get_pg_config() nor setup_fake_process_groups'}"
                             f" sizes: give --group {missing[0]}=SIZE")
    in_use = [specs[name] for name in used]
    _register_groups(path, in_use)
    fake_mode = FakeTensorMode()
    reader = _FakeInputReader()
    try:
        with fake_mode:
            load_args(reader)
        traced_gm = trace_step(gm, reader.args, fake_mode=fake_mode)
    except Exception as e:
        raise GraphFileError(f"{path}: the graph does not trace on fake CPU tensors: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from None
    groups = _workload_groups(path, in_use)
    return TracedWorkload(name=GraphFile(str(path)).name, gm=traced_gm, fake_mode=fake_mode,
                          groups=groups, trace_s=time.perf_counter() - t0,
                          meta={**_saved_meta(module), "graph_file": str(path), "devices_mapped": mapped,
                                "groups": {"dp": groups.dp, "tp": groups.tp},  # as built-in workloads record them
                                "graph_groups": {g.name: {"size": g.size, "role": g.role} for g in in_use},
                                "group_ranks_per_node": {g.role: g.ranks_per_node for g in in_use
                                                         if g.ranks_per_node is not None}})


def _workload_groups(path: Path, groups: list[GroupSpec]) -> Groups:
    """``Groups`` of the graph: the tensor-parallel group, if one is marked, and the largest
    data-parallel one (every unmarked group is priced as data-parallel)."""
    tp = [g for g in groups if g.role == "tp"]
    if len(tp) > 1:
        raise GraphFileError(f"{path}: groups {', '.join(repr(g.name) for g in tp)} are all marked tp; one "
                             "tensor-parallel group is supported")
    dp = max((g for g in groups if g.role == "dp"), key=lambda g: g.size, default=None)
    per_role: dict[str, int] = {}
    for g in groups:
        if g.ranks_per_node is not None and per_role.setdefault(g.role, g.ranks_per_node) != g.ranks_per_node:
            raise GraphFileError(f"{path}: {g.role} groups give different ranks per node ({per_role[g.role]} and "
                                 f"{g.ranks_per_node}); one layout per role is supported")
    if dp is None:
        return Groups(dp=tp[0].name, dp_size=tp[0].size, tp=tp[0].name, tp_size=tp[0].size)
    return Groups(dp=dp.name, dp_size=dp.size, tp=tp[0].name if tp else None, tp_size=tp[0].size if tp else 1)


def _saved_meta(module) -> dict:
    """What ``save_graph`` recorded besides the graph (absent from other tools' files)."""
    meta = {}
    for key in ("parameters", "blocks", "workload"):
        value = getattr(module, f"bucketplan_{key}", None)
        if value is not None:
            meta[f"saved_{key}"] = value
    return meta


# ---------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------


def save_graph(traced: TracedWorkload, path: str | os.PathLike) -> Path:
    """Write a traced (not yet scheduled) workload as a repro file that ``load_graph`` reads back
    to the same graph: torch's ``save_graph_repro``, plus ``get_pg_config()`` with the groups'
    roles and, where the workload's module can be rebuilt, its parameter names and blocks."""
    from torch._dynamo.repro.after_aot import save_graph_repro

    from fxglue.blocks import block_source
    from planner.io import atomic_write_text

    path = Path(path)
    args = [n.meta["val"] for n in traced.gm.graph.find_nodes(op="placeholder")]
    buf = io.StringIO()
    with traced.fake_mode:
        save_graph_repro(buf, traced.gm, args, "inductor")
    text = buf.getvalue()
    main = "if __name__ == '__main__':"
    if main not in text:
        raise GraphFileError(f"{traced.name}: torch's repro writer wrote no __main__ block; cannot add the groups")
    from torch.distributed.distributed_c10d import _get_group_size_by_name

    roles = {traced.groups.tp: "tp"} if traced.groups.tp else {}
    config = {name: {"size": _get_group_size_by_name(name), "role": roles.get(name, "dp")}
              for name in graph_group_names(traced.gm)}
    ours = ["# bucketplan: the graph's process groups (name -> size, role); ranks per node come from the cluster",
            "def get_pg_config():", f"    return {config!r}", ""]
    try:
        names, plans = block_source(traced)
        ours += ["# bucketplan: the parameter each placeholder is, and the transformer blocks (per-block plans)",
                 f"bucketplan_parameters = {names!r}", f"bucketplan_blocks = {plans!r}", ""]
    except Exception:  # a module that cannot be rebuilt: no blocks, as when extracting it directly
        pass
    ours += [f"bucketplan_workload = {({k: v for k, v in traced.meta.items() if k != 'groups'})!r}", ""]
    text = text.replace(main, "\n".join(ours) + "\n" + main, 1)
    atomic_write_text(path, text)
    return path
