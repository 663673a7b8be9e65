"""Which transformer block, and which phase, each collective of a traced step belongs to.

Why this exists: torch's manual per-block pass (``fxglue.manual``) buckets by block, and the
positioned search (``planner.position_search``) seeds its plans the same way, so the problem
records each collective's block and phase at extraction (``Collective.module`` / ``phase``). A
traced step carries no module stack (``make_fx`` records none), so a collective is mapped to the
parameter it moves: an all_gather to the one placeholder it derives from (torch's FSDP
criterion), a reduce_scatter / all_reduce to the gradient output it flows to, and the parameter to
its owning block (torchtitan's ``get_transformer_block_buckets``).
"""

from __future__ import annotations

from collections import defaultdict

import torch.fx as fx
import torch.nn as nn

import planner
from fxglue.estimator import collective_kind

_MAX_BACKWARD_WALK = 4096  # nodes visited looking for a collective's parameter (bounds odd graphs)


def parameter_names(traced, module: nn.Module | None = None) -> list[str]:
    """The module's parameter FQNs in the order the traced step takes them (placeholders).

    Rebuilds the workload's module under a fresh ``FakeTensorMode`` (no memory, about a
    second) unless the caller has it (``module``), and reads ``named_parameters()``, the order
    ``parallel.wrap`` stores them in.
    """
    return [n for n, _ in (module if module is not None else _module_of(traced)).named_parameters()]


def _module_of(traced) -> nn.Module:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fxglue.models.workloads import get_workload

    wl = get_workload(traced.name)
    with FakeTensorMode():
        module, _, _ = wl.build(traced.groups)
    return module


def transformer_block_plans(module: nn.Module) -> list[list[str] | str]:
    """torchtitan's ``get_transformer_block_buckets`` for any decoder: one entry per block.

    torchtitan returns ``[tok_embeddings, [norm, output], layers.0, ..., layers.N-1]``. Here the
    blocks are the children of the ``ModuleList``/``ModuleDict`` holding the most parameters;
    the modules owning parameters registered before the first block form the first entry
    (the embedding), those after the last block the second (final norm and output head).
    An entry of one module is its FQN, of several a list, as in torchtitan.
    """
    containers = [(name, m) for name, m in module.named_modules()
                  if isinstance(m, (nn.ModuleList, nn.ModuleDict)) and len(m) > 0]
    if not containers:
        raise ValueError("no ModuleList/ModuleDict of blocks in the module")
    name, blocks = max(containers, key=lambda c: sum(p.numel() for p in c[1].parameters()))
    prefix = f"{name}." if name else ""
    block_fqns = [f"{prefix}{k}" for k, _ in blocks.named_children()]
    pre: list[str] = []
    post: list[str] = []
    seen_block = False
    for pname, _ in module.named_parameters():
        owner = pname.rpartition(".")[0]
        if any(owner == b or owner.startswith(b + ".") for b in block_fqns):
            seen_block = True
            continue
        side = post if seen_block else pre
        if owner not in side:
            side.append(owner)
    plans: list[list[str] | str] = []
    for side in (pre, post):
        if side:
            plans.append(side[0] if len(side) == 1 else list(side))
    return plans + block_fqns


def _walk(starts, step, limit: int | None = None) -> set[fx.Node] | None:
    """Nodes reachable from ``starts`` by ``step(node) -> next nodes`` (None past ``limit``)."""
    seen: set[fx.Node] = set()
    stack = list(starts)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if limit is not None and len(seen) > limit:
            return None
        stack.extend(step(n))
    return seen


def _loss_ancestors(graph: fx.Graph) -> set[fx.Node]:
    return _walk([graph.output_node().args[0][0]], lambda n: n.all_input_nodes)


def _placeholder_ancestors(start: fx.Node) -> set[fx.Node] | None:
    """The placeholders ``start`` derives from (None: more than _MAX_BACKWARD_WALK nodes away)."""
    seen = _walk(start.all_input_nodes, lambda n: () if n.op == "placeholder" else n.all_input_nodes,
                 _MAX_BACKWARD_WALK)
    return None if seen is None else {n for n in seen if n.op == "placeholder"}


def _grad_outputs(start: fx.Node, grad_index: dict[fx.Node, list[int]]) -> set[int]:
    """Gradient outputs reached from ``start`` through single-input chains (torch's FSDP test)."""
    reached = _walk([start], lambda n: [u for u in n.users if u.op != "output" and len(u.all_input_nodes) == 1])
    return {i for n in reached for i in grad_index.get(n, ())}


def collective_params(graph: fx.Graph, param_names: list[str]) -> dict[fx.Node, tuple[str, ...]]:
    """Each collective start -> the parameters it moves (FQNs), () when it moves none.

    all_gather: the parameter placeholders it derives from (one for SimpleFSDP's gather, all
    members for a merged one). reduce_scatter / all_reduce: the gradient outputs it flows to
    through single-input chains. A TP all_reduce of activations moves no parameter.
    """
    from torch._inductor.fx_passes.bucketing import _get_collective_node_from_wait, _schedulable_wait_node

    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    ph_param = {placeholders[i]: param_names[i] for i in range(min(len(param_names), len(placeholders)))}
    outs = graph.output_node().args[0]
    grad_index: dict[fx.Node, list[int]] = defaultdict(list)
    for i, o in enumerate(outs[1:1 + len(param_names)]):
        if isinstance(o, fx.Node):
            grad_index[o].append(i)
    result: dict[fx.Node, tuple[str, ...]] = {}
    for n in graph.nodes:
        if not (n.op == "call_function" and _schedulable_wait_node(n)):
            continue
        start = _get_collective_node_from_wait(n)
        if start is None or start in result:
            continue
        params: tuple[str, ...] = ()
        if collective_kind(start) == "all_gather":
            phs = _placeholder_ancestors(start)
            if phs and all(p in ph_param for p in phs):
                params = tuple(sorted(ph_param[p] for p in phs))
        else:
            idx = _grad_outputs(start, grad_index)
            params = tuple(sorted(param_names[i] for i in idx))
        result[start] = params
    return result


def _owner(param: str) -> str:
    return param.rpartition(".")[0]


def _plan_index(owner: str, plans: list[list[str] | str]) -> int | None:
    for i, entry in enumerate(plans):
        for fqn in ([entry] if isinstance(entry, str) else entry):
            if owner == fqn or owner.startswith(fqn + "."):
                return i
    return None


def block_of_collectives(gm: fx.GraphModule, param_names: list[str],
                         plans: list[list[str] | str], *, merged: bool = False) -> dict[str, tuple[int, str]]:
    """Each collective start's name -> (index of the module plan entry whose parameter it moves,
    "forward" or "backward"), for collectives that move exactly one parameter of one entry
    (``merged``: or several, all of one entry -- a graph torch's per-block pass already bucketed)."""
    fwd = {n.name for n in _loss_ancestors(gm.graph)}
    out = {}
    for start, params in collective_params(gm.graph, param_names).items():
        if not params or (len(params) != 1 and not merged):
            continue
        owners = {_plan_index(_owner(p), plans) for p in params}
        idx = owners.pop() if len(owners) == 1 else None
        if idx is not None:
            out[start.name] = (idx, "forward" if start.name in fwd else "backward")
    return out


def block_source(traced) -> tuple[list[str], list[list[str] | str]]:
    """The traced step's parameter names (placeholder order) and its transformer blocks: those a
    graph file recorded (``fxglue.graph_file.save_graph``), else from the workload's module,
    rebuilt once for both. Raises when neither is there."""
    meta = traced.meta or {}
    if "saved_parameters" in meta and "saved_blocks" in meta:
        return list(meta["saved_parameters"]), list(meta["saved_blocks"])
    if "graph_file" in meta:
        raise ValueError("the graph file records no parameter names and blocks")
    module = _module_of(traced)
    return parameter_names(traced, module), transformer_block_plans(module)


def with_blocks(problem: planner.Problem, traced, gm: fx.GraphModule, *, merged: bool = False) -> planner.Problem:
    """``problem`` with each collective's block and phase recorded (``Collective.module`` /
    ``phase``), as torchtitan's per-block buckets name them; unchanged (``meta.blocks`` says why)
    when the workload's module cannot be rebuilt or has no ModuleList of blocks. ``merged``: see
    ``block_of_collectives``."""
    try:
        names, plans = block_source(traced)
    except Exception as e:  # a factory or graph without a rebuildable module: blocks are optional
        return problem.model_copy(update={"meta": {**problem.meta, "blocks": f"none: {type(e).__name__}: {e}"}})
    labels = block_of_collectives(gm, names, plans, merged=merged)

    def fqn(idx: int) -> str:
        entry = plans[idx]
        return entry if isinstance(entry, str) else "+".join(entry)

    colls = tuple(c.model_copy(update={"module": fqn(labels[c.name][0]), "phase": labels[c.name][1]})
                  if c.name in labels else c for c in problem.collectives)
    meta = {**problem.meta, "blocks": f"{len(labels)} of {len(colls)} collectives by parameter owner"}
    return problem.model_copy(update={"collectives": colls, "meta": meta, "fingerprint": ""}).with_fingerprint()
