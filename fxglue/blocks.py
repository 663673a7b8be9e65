"""Which transformer block, and which phase, each collective of a traced step belongs to.

Why this exists: torch's manual per-block pass (``fxglue.manual``) buckets by block, and the
positioned search (``planner.search.free.position_search``) seeds its plans the same way, so the problem
records each collective's block and phase at extraction (``Collective.module`` / ``phase``). A
traced step carries no module stack (``make_fx`` records none), so a collective is mapped to the
parameter it moves: an all_gather to the one placeholder it derives from (torch's FSDP
criterion), a reduce_scatter / all_reduce to the gradient output it flows to, and the parameter to
its owning block (torchtitan's ``get_transformer_block_buckets``).

A ``torch.compile`` post-grad graph (``fxglue.run.compile``) has no workload module to rebuild,
but AOT autograd left what is needed on its nodes, and ``compiled_graph_blocks`` reads it there:

- *which collectives move a parameter*: the same criterion, on AOT autograd's descriptors
  (``node.meta["desc"]``): an all_gather derived from exactly one input of the compiled step
  (``PlainAOTInput`` / ``ParamAOTInput``), a reduce_scatter / all_reduce flowing to an output that
  is an input's gradient (``GradAOTOutput``). A TP all_reduce of activations moves none.
- *whose parameter*: dynamo's ``nn_module_stack`` (``fwd_nn_module_stack`` on backward nodes, as
  torch's ``graph_view`` reads them) on the collective itself, whose innermost entry is the module
  running it -- for a parametrization-based wrapper (``parallel.wrap``, SimpleFSDP) the
  parameter's ``<owner>.parametrizations.<name>``, so the owner is the part before it. The path is
  taken relative to dynamo's root source (``L['self']`` when the model itself is compiled,
  ``G['model']`` or ``L['model']`` for a step that calls it), as torch's ``_clean_stack_name``
  strips ``L['self']``; a collective outside any module (or under another root form) gets no
  block.
- *the blocks*: the container of the most moved elements among the module paths with an index
  segment (``layers.3``: a ``ModuleList``, or torchtitan's ``ModuleDict`` of "0", "1", ...), and
  its children the blocks, named as ``transformer_block_plans`` names them. A ``ModuleDict`` with
  other keys is not recognised from a path, and its collectives get no block.
- *before and after the blocks*: ``transformer_block_plans`` groups the other owners by where
  their parameters are registered, which a graph does not show; here by where the owner runs in
  the forward, from autograd's sequence numbers (``seq_nr``, which backward nodes share with the
  forward op they differentiate): entirely before every block's nodes, or entirely after. The
  two agree wherever a model registers its modules in the order it runs them (checked on the
  built-in Llama: ``tok_emb``, ``norm+output``, as ``bucketplan extract`` names them). An owner
  that runs on both sides, or has no sequence numbers, gets no block.
- *the phase*: the graph's own (AOT autograd's backward graph takes the tangents).
"""

from __future__ import annotations

import re
from collections import defaultdict

import torch.fx as fx
import torch.nn as nn

import planner
from fxglue.estimator import collective_kind
from fxglue.models.base import transformer_block_plans  # noqa: F401 - re-exported: fxglue.blocks' API

_MAX_BACKWARD_WALK = 4096  # nodes visited looking for a collective's parameter (bounds odd graphs)


def parameter_names(traced, module: nn.Module | None = None) -> list[str]:
    """The module's parameter FQNs in the order the traced step takes them (placeholders).

    Rebuilds the workload's module under a fresh ``FakeTensorMode`` (no memory, about a
    second) unless the caller has it (``module``), and reads ``named_parameters()``, the order
    ``parallel.wrap`` stores them in.
    """
    return [n for n, _ in (module if module is not None else module_of(traced)).named_parameters()]


def module_of(traced) -> nn.Module:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fxglue.models.workloads import get_workload

    wl = get_workload(traced.name)
    with FakeTensorMode():
        module, _, _ = wl.build(traced.groups)
    return module


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


def loss_ancestors(graph: fx.Graph) -> set[fx.Node]:
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


def block_owner(param: str) -> str:
    return param.rpartition(".")[0]


def plan_index(owner: str, plans: list[list[str] | str]) -> int | None:
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
    fwd = {n.name for n in loss_ancestors(gm.graph)}
    out = {}
    for start, params in collective_params(gm.graph, param_names).items():
        if not params or (len(params) != 1 and not merged):
            continue
        owners = {plan_index(block_owner(p), plans) for p in params}
        idx = owners.pop() if len(owners) == 1 else None
        if idx is not None:
            out[start.name] = (idx, "forward" if start.name in fwd else "backward")
    return out


# ---------------------------------------------------------------------------------------
# torch.compile's post-grad graphs (see the module docstring)
# ---------------------------------------------------------------------------------------


def is_compiled_graph(graph: fx.Graph) -> bool:
    """A graph from AOT autograd (torch.compile's forward or backward): its placeholders carry
    descriptors, which ``make_fx`` never records."""
    return any("desc" in n.meta for n in graph.find_nodes(op="placeholder"))


def compiled_graph_phase(graph: fx.Graph) -> str:
    """"backward" for AOT autograd's backward graph (it takes the tangents), else "forward"."""
    names = [n.name for n in graph.find_nodes(op="placeholder")]
    return "backward" if any(n.startswith("tangents") for n in names) else "forward"


_ROOT_SOURCE = re.compile(r"^[A-Za-z_]\w*\[(?:'[^']*'|\"[^\"]*\")\]")  # dynamo's L['self'], G['model']
_KEY = re.compile(r"(?:\._modules)?\[(?:'([^']*)'|\"([^\"]*)\")\]")  # an older path's _modules['layers']['0']


def _stack_path(node: fx.Node) -> tuple[str, bool] | None:
    """The module running ``node`` (dotted, relative to the compiled root), and whether it is a
    parametrization of that module (the innermost entry under ``parametrizations``); None
    without a module stack or with a root dynamo names otherwise."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    path = list(stack.values())[-1][0]
    root = _ROOT_SOURCE.match(path)
    if root is None:
        return None
    rest = _KEY.sub(lambda m: "." + (m.group(1) if m.group(1) is not None else m.group(2)), path[root.end():])
    segments = [s for s in rest.split(".") if s]
    if "parametrizations" in segments:
        return ".".join(segments[:segments.index("parametrizations")]), True
    return ".".join(segments), False


def _owns(owner: str, path: str) -> bool:
    """Whether the module at ``path`` is ``owner`` or inside it; a parameter of the root module
    itself (owner "") counts the root's own nodes only, or it would own every block's."""
    return path == owner or (owner != "" and path.startswith(owner + "."))


def _moved_params(graph: fx.Graph) -> dict[fx.Node, str]:
    """Each collective start that moves a parameter -> the module owning it (see the module
    docstring: descriptors say whether, the module stack whose)."""
    from torch._functorch._aot_autograd.descriptors import GradAOTOutput, ParamAOTInput, PlainAOTInput
    from torch._inductor.fx_passes.bucketing import _get_collective_node_from_wait, _schedulable_wait_node

    out = graph.output_node()
    outs = out.args[0] if isinstance(out.args[0], (list, tuple)) else (out.args[0],)
    grad_index: dict[fx.Node, list[int]] = defaultdict(list)
    for i, (o, d) in enumerate(zip(outs, out.meta.get("desc") or ())):
        if isinstance(o, fx.Node) and isinstance(d, GradAOTOutput):
            grad_index[o].append(i)
    owners: dict[fx.Node, str] = {}
    for n in graph.nodes:
        if not (n.op == "call_function" and _schedulable_wait_node(n)):
            continue
        start = _get_collective_node_from_wait(n)
        if start is None or start in owners:
            continue
        if collective_kind(start) == "all_gather":
            phs = _placeholder_ancestors(start)
            moves = phs is not None and len(phs) == 1 and isinstance(
                next(iter(phs)).meta.get("desc"), (PlainAOTInput, ParamAOTInput))
        else:
            moves = bool(_grad_outputs(start, grad_index))
        where = _stack_path(start)
        if moves and where is not None:
            owners[start] = where[0]
    return owners


def _numel(start: fx.Node) -> int:
    val = start.args[0].meta.get("val") if start.args and isinstance(start.args[0], fx.Node) else None
    return int(val.numel()) if val is not None and hasattr(val, "numel") else 0


def _block_container(owners: dict[fx.Node, str]) -> str | None:
    """The module path whose indexed children hold the most moved elements, the shallowest of
    equals (None: no path below the root has an index segment)."""
    weight: dict[str, int] = defaultdict(int)
    for start, owner in owners.items():
        segments = owner.split(".")
        for j in range(1, len(segments)):
            if segments[j].isdigit():
                weight[".".join(segments[:j])] += _numel(start)
    if not weight:
        return None
    return max(weight, key=lambda c: (weight[c], -c.count("."), c))


def _sides(graph: fx.Graph, prefix: str, owners: set[str]) -> dict[str, tuple[str, int]]:
    """Owners outside the blocks -> ("pre" or "post", where the owner first runs): where their
    modules run in the forward, by autograd's sequence numbers; an owner on both sides or
    without numbers is left out."""
    block_seq: list[int] = []
    owner_seq: dict[str, list[int]] = defaultdict(list)
    for n in graph.nodes:
        seq = n.meta.get("seq_nr")
        if n.op != "call_function" or seq is None or getattr(n.target, "namespace", None) == "_c10d_functional":
            continue
        where = _stack_path(n)
        if where is None or where[1]:  # a wrapper's own ops (a gradient's copy) run at the backward's end
            continue
        path = where[0]
        if path.startswith(prefix):
            block_seq.append(seq)
            continue
        for owner in owners:
            if _owns(owner, path):
                owner_seq[owner].append(seq)
    if not block_seq:
        return {}
    first, last = min(block_seq), max(block_seq)
    sides = {}
    for owner, seqs in owner_seq.items():
        if max(seqs) < first:
            sides[owner] = ("pre", min(seqs))
        elif min(seqs) > last:
            sides[owner] = ("post", min(seqs))
    return sides


def compiled_graph_blocks(graph: fx.Graph) -> dict[str, tuple[str, str]]:
    """Each collective start's name -> (its block, as ``with_blocks`` names it, and the graph's
    phase), for a torch.compile post-grad graph's collectives that move a parameter of a block,
    or of the modules before or after the blocks (see the module docstring)."""
    owners = _moved_params(graph)
    container = _block_container(owners)
    if container is None:
        return {}
    prefix, depth = f"{container}.", container.count(".") + 1
    outside = {o for o in owners.values() if not o.startswith(prefix)}
    sides = _sides(graph, prefix, outside)
    # an entry of several owners names them joined, in the order they run
    entry = {side: "+".join(sorted((o for o, (s, _) in sides.items() if s == side), key=lambda o: (sides[o][1], o)))
             for side in ("pre", "post")}
    phase = compiled_graph_phase(graph)
    labels = {}
    for start, owner in owners.items():
        if owner.startswith(prefix):
            labels[start.name] = (prefix + owner.split(".")[depth], phase)
        elif owner in sides:
            labels[start.name] = (entry[sides[owner][0]], phase)
    return labels


def block_source(traced) -> tuple[list[str], list[list[str] | str]]:
    """The traced step's parameter names (placeholder order) and its transformer blocks: those
    recorded with it (a graph file's, ``fxglue.graph_file.save_graph``; a gloo rank's, from its
    own module), else from the workload's module, rebuilt once for both. Raises when neither is
    there."""
    meta = traced.meta or {}
    if "saved_parameters" in meta and "saved_blocks" in meta:
        return list(meta["saved_parameters"]), list(meta["saved_blocks"])
    if "graph_file" in meta:
        raise ValueError("the graph file records no parameter names and blocks")
    module = module_of(traced)
    return parameter_names(traced, module), transformer_block_plans(module)


def with_blocks(problem: planner.Problem, traced, gm: fx.GraphModule, *, merged: bool = False) -> planner.Problem:
    """``problem`` with each collective's block and phase recorded (``Collective.module`` /
    ``phase``), as torchtitan's per-block buckets name them: for a torch.compile post-grad graph
    (or a step the compile hook was handed) from its nodes' module stacks
    (``compiled_graph_blocks``), else from the traced workload's
    parameter names and blocks (``block_source``); unchanged (``meta.blocks`` says why) when the
    workload's module cannot be rebuilt or has no ModuleList of blocks. ``merged``: see
    ``block_of_collectives``."""
    if is_compiled_graph(gm.graph) or (traced.meta or {}).get("source") == "torch.compile":
        labels = compiled_graph_blocks(gm.graph)
        how = "by module stack"
    else:
        try:
            names, plans = block_source(traced)
        except Exception as e:  # a factory or graph without a rebuildable module: blocks are optional
            return problem.model_copy(update={"meta": {**problem.meta, "blocks": f"none: {type(e).__name__}: {e}"}})

        def fqn(idx: int) -> str:
            entry = plans[idx]
            return entry if isinstance(entry, str) else "+".join(entry)

        labels = {name: (fqn(idx), phase)
                  for name, (idx, phase) in block_of_collectives(gm, names, plans, merged=merged).items()}
        how = "by parameter owner"
    colls = tuple(c.model_copy(update={"module": labels[c.name][0], "phase": labels[c.name][1]})
                  if c.name in labels else c for c in problem.collectives)
    meta = {**problem.meta, "blocks": f"{len(labels)} of {len(colls)} collectives {how}"}
    return problem.model_copy(update={"collectives": colls, "meta": meta, "fingerprint": ""}).with_fingerprint()
