"""Hypothesis strategies: random small, internally consistent bucketing problems and plans."""

from __future__ import annotations

import hypothesis.strategies as st

import planner

KINDS = ("all_gather", "reduce_scatter", "all_reduce")


@st.composite
def problems(draw, max_collectives: int = 6, max_compute: int = 6, max_pgs: int = 2,
             dtypes=("bfloat16", "float32"), costs: bool = False, kinds=KINDS) -> planner.Problem:
    """A schedule of compute nodes with collectives started and waited around them.

    ``costs``: links priced by random cost tables (any shape, not only concave ones) and a
    random bucketing cost (copies and launches), instead of α-β links with free merging.
    ``kinds``: the collective kinds drawn from (one kind, one group and one dtype: every pair may
    merge, where the bucket cap allows).

    Dependencies only point backwards in the schedule; hiding nodes of a collective are
    compute nodes strictly between its start and wait.
    """
    n_colls = draw(st.integers(1, max_collectives))
    n_compute = draw(st.integers(0, max_compute))
    n_pgs = draw(st.integers(1, max_pgs))
    # Token sequence: compute nodes in order, then starts/waits inserted at random slots.
    seq: list[tuple[str, int]] = [("c", j) for j in range(n_compute)]
    for i in range(n_colls):
        a = draw(st.integers(0, len(seq)))
        seq.insert(a, ("s", i))
        b = draw(st.integers(a + 1, len(seq)))
        seq.insert(b, ("w", i))
    names = {("c", j): f"mm_{j}" for j in range(n_compute)}
    names.update({("s", i): f"coll_{i}" for i in range(n_colls)})
    names.update({("w", i): f"wait_{i}" for i in range(n_colls)})
    index = {tok: k for k, tok in enumerate(seq)}

    nodes = []
    for k, tok in enumerate(seq):
        # like functional collectives: a start is used by its wait only, a wait uses its start only
        earlier = [j for j in range(k) if seq[j][0] != "s"]
        deps = draw(st.lists(st.sampled_from(earlier), max_size=2, unique=True)) if earlier and draw(
            st.booleans()) else []
        if tok[0] == "w":
            deps = [index[("s", tok[1])]]
        kind = {"c": "compute", "s": "start", "w": "wait"}[tok[0]]
        est = 0.0 if kind == "wait" else draw(st.sampled_from([0.1, 0.5, 1.0, 2.0]))
        # the compute of unpinned nodes scheduled before it (problem version 2), on some nodes
        unpinned = draw(st.sampled_from([0.0, 0.0, 0.3]))
        nodes.append(planner.Node(name=names[tok], kind=kind, pos=k, est_ms=est, deps=tuple(sorted(deps)),
                                  unpinned_ms=unpinned))

    pgs = [f"pg{p}" for p in range(n_pgs)]
    colls = []
    for i in range(n_colls):
        s, w = index[("s", i)], index[("w", i)]
        between = [names[seq[k]] for k in range(s + 1, w) if seq[k][0] == "c"]
        hiding = draw(st.lists(st.sampled_from(between), unique=True)) if between else []
        hiding.sort(key=lambda n: next(k for k, t in enumerate(seq) if names[t] == n))
        kind = draw(st.sampled_from(kinds))
        pg = draw(st.sampled_from(pgs))
        dtype = draw(st.sampled_from(dtypes))
        est = draw(st.sampled_from([0.2, 0.5, 1.0]))
        if not hiding:
            status, exposed = "exposed", est
        else:
            status = draw(st.sampled_from(["hidden", "partly"]))
            exposed = 0.0 if status == "hidden" else est / 2
        size = draw(st.integers(1, 64)) * 1024
        colls.append(planner.Collective(
            name=f"coll_{i}", wait=f"wait_{i}", kind=kind, pg=pg, key=f"{kind}/{pg}/{dtype}", dtype=dtype,
            size_bytes=size, wire_bytes=size, est_ms=est, exposed_ms=exposed, start_pos=s, wait_pos=w,
            hiding=tuple(hiding), status=status, fsdp=False))
    timelines = []
    for pg in pgs:
        idx, types = [], ""
        mine = {f"coll_{i}" for i, c in enumerate(colls) if c.pg == pg}
        for k, tok in enumerate(seq):
            if tok[0] == "c":
                idx.append(k)
                types += "c"
            elif names[("s", tok[1])] in mine:
                idx.append(k)
                types += tok[0]
        timelines.append(planner.Timeline(pg=pg, nodes=tuple(idx), types=types))
    if costs:
        links = tuple(planner.Link(pg=pg, group_size=draw(st.sampled_from([2, 4, 8])),
                                   table={k: draw(_cost_tables()) for k in KINDS}) for pg in pgs)
        bucketing = planner.BucketingCost(copy_gbps=draw(st.sampled_from([0.05, 1.0, 100.0])),
                                          launch_ms=draw(st.sampled_from([0.0, 0.01, 0.5])))
    else:
        links = tuple(planner.Link(pg=pg, group_size=draw(st.sampled_from([2, 4, 8])), latency_ms=0.02,
                                   bandwidth_gbps=50.0) for pg in pgs)
        bucketing = None
    cap = draw(st.sampled_from([64 * 1024, 128 * 1024, 1 << 30]))
    return planner.Problem(schema_version=2 if any(n.unpinned_ms for n in nodes) else 1,
                           bucket_mode="default", bucket_cap_bytes=cap, n_scheduled=len(seq),
                           collectives=tuple(colls), nodes=tuple(nodes), timelines=tuple(timelines),
                           links=links, bucketing=bucketing,
                           meta={"generator": "tests.strategies.problems"}).with_fingerprint()


@st.composite
def _cost_tables(draw):
    """Breakpoints (bytes, ms) from 0 to past any bucket these problems make (6 x 64 KiB)."""
    sizes = sorted(set(draw(st.lists(st.integers(1, 1 << 19), min_size=0, max_size=4))) | {1 << 20})
    return tuple((b, draw(st.floats(0.0, 3.0))) for b in [0, *sizes])


@st.composite
def plans(draw, problem: planner.Problem) -> planner.Plan:
    """A structurally valid plan (disjoint buckets, anchors among members); not necessarily feasible."""
    names = [c.name for c in problem.collectives]
    order = draw(st.permutations(names))
    buckets = []
    k = 0
    while k < len(order):
        size = draw(st.integers(1, len(order) - k))
        members = tuple(order[k:k + size])
        k += size
        if size > 1 or draw(st.booleans()):
            buckets.append(planner.Bucket(members=members, start=draw(st.sampled_from(members)),
                                          wait=draw(st.sampled_from(members))))
    return planner.Plan(problem_fingerprint=problem.fingerprint, planner="random",
                        params={"seed": draw(st.integers(0, 10))}, created="2026-01-01T00:00:00+00:00",
                        buckets=tuple(buckets))


def two_gathers(wires: tuple[int, int], sizes: tuple[int, int], link: planner.Link,
                cap: int = 1 << 30) -> planner.Problem:
    """mm_0, two all_gathers of one key (started, then both waited), mm_1: the smallest problem
    where a merge is feasible, for regression tests of bucket-size arithmetic."""
    N = planner.Node
    nodes = (N(name="mm_0", kind="compute", pos=0, est_ms=1.0),
             N(name="ag1", kind="start", pos=1, est_ms=0.0),
             N(name="ag2", kind="start", pos=2, est_ms=0.0),
             N(name="w1", kind="wait", pos=3, est_ms=0.0, deps=(1,)),
             N(name="w2", kind="wait", pos=4, est_ms=0.0, deps=(2,)),
             N(name="mm_1", kind="compute", pos=5, est_ms=1.0, deps=(3, 4)))
    colls = tuple(planner.Collective(name=f"ag{k}", wait=f"w{k}", kind="all_gather", pg="0",
                                     key="all_gather/0/bfloat16", dtype="bfloat16", size_bytes=sizes[k - 1],
                                     wire_bytes=wires[k - 1], est_ms=0.0, exposed_ms=0.0, start_pos=k,
                                     wait_pos=2 + k, status="exposed") for k in (1, 2))
    return planner.Problem(bucket_mode="default", bucket_cap_bytes=cap, n_scheduled=6, collectives=colls,
                           nodes=nodes, links=(link,),
                           timelines=(planner.Timeline(pg="0", nodes=(0, 1, 2, 3, 4, 5), types="csswwc"),)
                           ).with_fingerprint()


def folded_pair(link: planner.Link, conversion_ms: float = 2.0) -> planner.Problem:
    """ag_a (hidden by mm_0, waited), then a conversion (``conversion_ms``) that ag_b folds,
    ag_b, mm_1, ag_b's wait: merging the two at ag_a's start moves the conversion up to there."""
    N = planner.Node
    nodes = (N(name="ag_a", kind="start", pos=0, est_ms=0.0),
             N(name="mm_0", kind="compute", pos=1, est_ms=1.0),
             N(name="w_a", kind="wait", pos=2, est_ms=0.0, deps=(0,)),
             N(name="conv", kind="compute", pos=3, est_ms=conversion_ms),
             N(name="ag_b", kind="start", pos=4, est_ms=0.0, deps=(3,)),
             N(name="mm_1", kind="compute", pos=5, est_ms=3.0),
             N(name="w_b", kind="wait", pos=6, est_ms=0.0, deps=(4,)))
    common = dict(kind="all_gather", pg="0", key="all_gather/0/bfloat16", dtype="bfloat16", size_bytes=1 << 20,
                  wire_bytes=1 << 20, est_ms=0.0)
    colls = (planner.Collective(name="ag_a", wait="w_a", exposed_ms=0.0, start_pos=0, wait_pos=2, hiding=("mm_0",),
                                status="hidden", **common),
             planner.Collective(name="ag_b", wait="w_b", exposed_ms=0.0, start_pos=4, wait_pos=6, hiding=("mm_1",),
                                status="hidden", folded=("conv",), **common))
    return planner.Problem(bucket_mode="default", bucket_cap_bytes=1 << 30, n_scheduled=7, collectives=colls,
                           nodes=nodes, links=(link,),
                           timelines=(planner.Timeline(pg="0", nodes=tuple(range(7)), types="scwcscw"),)
                           ).with_fingerprint()


def merged(problem: planner.Problem) -> planner.Plan:
    """Every collective of ``problem`` in one bucket, anchored at the first."""
    names = tuple(c.name for c in problem.collectives)
    return planner.Plan(problem_fingerprint=problem.fingerprint, planner="test", created="2026-01-01T00:00:00+00:00",
                        buckets=(planner.Bucket(members=names, start=names[0], wait=names[0]),))


@st.composite
def folded_conversions(draw, p: planner.Problem) -> planner.Problem:
    """``p`` with dtype conversions a merge folds away (``Collective.folded``): a compute node
    scheduled before a start, another collective's hider where one can be, becomes that start's
    input and nothing else's (the shape torch folds). It then moves with the start."""
    kinds = {n.name: n.kind for n in p.nodes}
    nodes, colls = list(p.nodes), list(p.collectives)
    index = {n.name: i for i, n in enumerate(nodes)}
    taken: set[str] = set()
    for k, c in enumerate(colls):
        before = [n.name for n in nodes if n.kind == "compute" and n.pos < c.start_pos and n.name not in taken]
        hiders = [h for o in colls for h in o.hiding if kinds[h] == "compute" and h in before and o is not c]
        if not before or not (hiders or draw(st.booleans())):  # a hider that can fold always does
            continue
        f = draw(st.sampled_from(hiders or before))
        taken.add(f)
        colls[k] = c.model_copy(update={"folded": (f,)})
        fi = index[f]
        for i, n in enumerate(nodes):
            deps = tuple(sorted(set(n.deps) | {fi})) if n.name == c.name else tuple(d for d in n.deps if d != fi)
            nodes[i] = n.model_copy(update={"deps": deps})
    fields = {k: getattr(p, k) for k in type(p).model_fields if k not in ("collectives", "nodes", "fingerprint")}
    return planner.Problem(**fields, nodes=tuple(nodes), collectives=tuple(colls)).with_fingerprint()


@st.composite
def exact_memory(draw, p: planner.Problem) -> planner.Problem:
    """``p`` with an exact memory profile (``planner.cost.memory``): every scheduled position a run
    of its own with random own bytes, random bytes just before each pinned node, and buffers for
    each collective: an all_gather's result (its wire bytes or nothing) until its wait, its wait's
    storage until its last user (a random node after the wait where none uses it); a reduce's input
    from a random position before its start. The graph's own bytes come in units of the largest
    collective, so that a spike can keep a gather out. Each wait gets a compute node after it as a
    user where it has none and one exists (FSDP's gathers are all used)."""
    unit = max(c.wire_bytes for c in p.collectives)
    n = p.n_scheduled
    index = {node.name: k for k, node in enumerate(p.nodes)}
    nodes = list(p.nodes)
    for c in p.collectives:
        later = [k for k, node in enumerate(nodes) if node.pos > c.wait_pos and node.kind == "compute"]
        if later and not any(index[c.wait] in node.deps for node in nodes):
            k = draw(st.sampled_from(later))
            nodes[k] = nodes[k].model_copy(update={"deps": tuple(sorted(set(nodes[k].deps) | {index[c.wait]}))})
    p = p.model_copy(update={"nodes": tuple(nodes)})
    buffers = {}
    for c in p.collectives:
        users = [node.pos for node in p.nodes if index[c.wait] in node.deps]  # the wait's last user, as torch's
        last = max(users) if users else draw(st.integers(c.wait_pos, n - 1))
        wire = st.sampled_from([0, c.wire_bytes, c.wire_bytes])
        if c.kind == "all_gather":
            buffers[c.name] = planner.CollectiveBuffers(out_bytes=draw(wire), out_last_use=c.wait_pos,
                                                        wait_bytes=draw(wire), wait_last_use=last)
        else:
            buffers[c.name] = planner.CollectiveBuffers(
                out_bytes=draw(wire), out_last_use=c.wait_pos, in_bytes=draw(wire),
                in_alloc=draw(st.integers(-1, c.start_pos - 1)), wait_bytes=draw(wire), wait_last_use=last)
    runs = tuple(range(n))
    peaks = tuple(draw(st.integers(0, 3)) * unit for _ in runs)
    # what the graph holds just before a node is still held while it runs: never above its run's peak
    memory = planner.MemoryProfile(segment_peak_bytes=(max(peaks, default=0),) * (len(p.nodes) + 1), buffers=buffers,
                                   run_starts=runs, run_peak_bytes=peaks,
                                   before_bytes=tuple(draw(st.integers(0, peaks[node.pos] // unit)) * unit
                                                      if unit else 0 for node in p.nodes))
    return p.model_copy(update={"memory": memory}).with_fingerprint()


@st.composite
def gathers_before_use(draw) -> planner.Problem:
    """FSDP's shape, small: compute nodes in order, and one or two all_gathers of one bucket key,
    each waited just before the compute node that uses it and started somewhere before that, with
    an exact memory profile (``exact_memory``) whose spikes can keep a gather from starting early."""
    n_compute = draw(st.integers(2, 4))
    seq: list[tuple[str, int]] = [("c", j) for j in range(n_compute)]
    user_of = {}  # gather -> the compute node that uses it
    for i in range(draw(st.integers(1, 2))):
        user_of[i] = draw(st.integers(1, n_compute - 1))
        at = seq.index(("c", user_of[i]))
        seq.insert(at, ("w", i))
        seq.insert(draw(st.integers(0, at)), ("s", i))
    index = {tok: k for k, tok in enumerate(seq)}
    N = planner.Node
    nodes = []
    for k, tok in enumerate(seq):
        if tok[0] == "c":
            waits = tuple(sorted(index[("w", i)] for i, user in user_of.items() if user == tok[1]))
            nodes.append(N(name=f"mm_{tok[1]}", kind="compute", pos=k, est_ms=draw(st.sampled_from([0.5, 1.0, 2.0])),
                           deps=waits))
        elif tok[0] == "s":
            nodes.append(N(name=f"ag_{tok[1]}", kind="start", pos=k, est_ms=0.0))
        else:
            nodes.append(N(name=f"w_{tok[1]}", kind="wait", pos=k, est_ms=0.0, deps=(index[("s", tok[1])],)))
    colls = []
    for i in sorted(user_of):
        size = draw(st.sampled_from([1, 2, 4])) << 20
        colls.append(planner.Collective(
            name=f"ag_{i}", wait=f"w_{i}", kind="all_gather", pg="0", key="all_gather/0/bfloat16", dtype="bfloat16",
            size_bytes=size, wire_bytes=size, est_ms=1.0, exposed_ms=1.0, start_pos=index[("s", i)],
            wait_pos=index[("w", i)], status="exposed"))
    link = planner.Link(pg="0", group_size=2, latency_ms=draw(st.sampled_from([0.1, 0.5, 1.0])),
                        bandwidth_gbps=draw(st.sampled_from([1.0, 2.0, 4.0])))
    problem = planner.Problem(bucket_mode="default", bucket_cap_bytes=1 << 30, n_scheduled=len(seq),
                              collectives=tuple(colls), nodes=tuple(nodes), links=(link,),
                              timelines=()).with_fingerprint()
    return draw(exact_memory(problem))
