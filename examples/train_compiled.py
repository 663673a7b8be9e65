"""Use a bucketplan plan in a real torch.compile training step (2 gloo ranks on this CPU).

    python examples/train_compiled.py record plans/    # compile as usual; problems are recorded
    bucketplan solve-dir plans/                        # solve them offline (any machine)
    python examples/train_compiled.py use plans/       # compile again with the plans applied
    python examples/train_compiled.py bench plans/     # measured against simulated, per configuration

Each run trains 3 steps of examples/my_model.py (4 layers, ``--layers``) wrapped for DDP (``--parallel fsdp``:
SimpleFSDP-style) and prints the loss and, per compiled graph, what the plan cache did with it.
``bench`` instead times the compiled step under torch's bucketing, torch's manual per-block pass
and the plans, writes a profiler trace of each, and sets each measured step beside its simulated
one (``fxglue.run.bench``; ``--out``, default bench/). Started by ``torchrun`` it runs on the ranks
torchrun gives it (NCCL on GPUs), else it spawns 2 gloo ranks here.
"""

import argparse
import logging
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _pricing(args) -> dict:
    """How every context prices the graphs: the same in record, use and bench (it is part of each
    graph's fingerprint)."""
    return {"preset": args.preset, "profile": args.profile, "profile_cpu": args.profile_cpu}


def _init(rank: int | None, world: int | None, store: str | None) -> tuple[int, torch.device]:
    """This process's rank and device: torchrun's (NCCL on a GPU), or one of the spawned gloo ranks."""
    if store is None:  # torchrun: RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous come from it
        cuda = torch.cuda.is_available()
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if cuda else "gloo")
        return dist.get_rank(), device
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, store=dist.FileStore(store, world))
    return rank, torch.device("cpu")


def train(rank: int | None, world: int | None, store: str | None, args) -> None:
    from fxglue.run import compile as bucketplan_compile
    from fxglue.models.parallel import wrap
    from my_model import MyModel

    rank, device = _init(rank, world, store)
    logging.basicConfig(level=logging.WARNING, format=f"[rank {rank}] %(message)s")
    torch.manual_seed(0)
    model = MyModel(vocab=256, dim=args.dim, hidden=args.hidden, layers=args.layers).to(device)
    # regather=False: backward keeps the gathered parameters, so dynamo compiles whole graphs
    wrap(model, args.parallel, dist.get_world_size(), dist.group.WORLD.group_name, rank=rank, regather=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss_fn(tokens):
        logits = model(tokens[:, :-1])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())

    gen = torch.Generator().manual_seed(rank)
    if args.mode == "bench":
        tokens = torch.randint(0, 256, (args.batch, args.seq + 1), generator=gen).to(device)
        bench(rank, device, args, loss_fn, opt, tokens)
        dist.destroy_process_group()
        return
    compiled = torch.compile(loss_fn)
    ctx = bucketplan_compile.record if args.mode == "record" else bucketplan_compile.use
    with ctx(args.plan_dir, **_pricing(args)) as session:
        for step in range(3):
            loss = compiled(torch.randint(0, 256, (args.batch, args.seq + 1), generator=gen).to(device))
            loss.backward()
            opt.step()
            opt.zero_grad()
            if rank == 0:
                print(f"step {step}: loss {loss.item():.6f}", flush=True)
    if rank == 0:
        if not session.events:
            print("no graph was compiled: inductor served this program from its cache (same plans, same key)")
        for e in session.events:
            print(f"{e.kind} graph {e.graph} (problem {e.fingerprint.split(':')[-1][:12]}): "
                  f"{e.collectives_before} -> {e.collectives_after} collectives ({e.outcome})", flush=True)
    dist.destroy_process_group()


def bench(rank: int, device: torch.device, args, loss_fn, opt, tokens) -> None:
    """Each configuration compiled afresh, timed, profiled and simulated (fxglue.run.bench)."""
    import json
    from pathlib import Path

    from fxglue.run import bench as b

    results = []
    for config in args.configs:
        torch._dynamo.reset()  # the next configuration compiles anew, under its own context
        compiled = torch.compile(loss_fn)

        def step():
            compiled(tokens).backward()

        def update():  # the optimizer, outside the timed part
            opt.step()
            opt.zero_grad()

        with b.configuration(config, args.plan_dir, args.out, **_pricing(args)) as session:
            step()  # compiles
            update()
            times = b.time_steps(step, steps=args.steps, warmup=args.warmup, device=device, after=update)
            trace = b.profile_steps(step, b.trace_path(args.out, config, rank), device=device)
            opt.zero_grad()
        slowest = b.slowest_rank(times, device)
        if rank == 0:
            b.save_problems(config, session, args.out)
            results.append(b.Result(config, slowest, b.simulated(config, session, args.plan_dir, args.out),
                                    str(trace)))
            print(f"{config}: measured {results[-1].measured_ms:.3f} ms", flush=True)
    if rank != 0:
        return
    lines = [f"# bench: {args.parallel}, {args.layers} layers, dim {args.dim}, {dist.get_world_size()} ranks "
             f"({device.type}), {args.steps} timed steps after {args.warmup} warm-up", ""]
    lines += b.table(results, args.preset)
    measured = []
    for r in results:
        got = b.contention_from_trace(json.loads(Path(r.trace).read_text()))
        if got is not None:
            measured.append(f"- {r.config}: compute {got[0]:.3f}x slower beside NCCL kernels ({got[1]} kernels, "
                            f"{got[2]:.3f} ms overlapped; plan at it with `--contention {max(got[0], 1.0):.3f}` on "
                            f"extract or compare, judge plans by it with "
                            f"`--scenarios torch,contention={max(got[0], 1.0):.3f}`)")
    lines += ["", "Traces (rank 0; `--profile` reads them" + ("" if device.type == "cuda" else " with --profile-cpu")
              + "): " + ", ".join(r.trace for r in results), "",
              "Contention measured in the traces:" if measured else
              "Contention: no compute kernel ran both beside an NCCL kernel and alone in these traces "
              "(a CPU run has no GPU kernels)."] + measured
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    print(f"wrote {out / 'bench.md'}", flush=True)


def main() -> None:
    from fxglue.run.bench import ALL_CONFIGS, CONFIGS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["record", "use", "bench"])
    ap.add_argument("plan_dir")
    ap.add_argument("--parallel", choices=["ddp", "fsdp"], default="ddp")
    ap.add_argument("--preset", default="h100-8nodes", help="the cluster the plans are priced for (h100-8nodes)")
    ap.add_argument("--layers", type=int, default=4, help="the model's depth (4); another depth is another graph, "
                                                          "with no plan until it is recorded and solved")
    ap.add_argument("--dim", type=int, default=64, help="the model's width (64); like --layers, a new graph")
    ap.add_argument("--hidden", type=int, default=256, help="its MLP's width (256)")
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank and step (4)")
    ap.add_argument("--seq", type=int, default=32, help="tokens per sequence (32)")
    ap.add_argument("--profile", metavar="TRACE.json",
                    help="price the graphs by a profiler trace of the step (e.g. one bench wrote; docs/training.md); "
                         "give it to record, use and bench alike")
    ap.add_argument("--profile-cpu", action="store_true", help="the --profile trace is of a CPU run")
    ap.add_argument("--out", default="bench", help="bench: where the table, traces and torch's recorded problems go "
                                                   "(bench/)")
    ap.add_argument("--steps", type=int, default=20, help="bench: timed steps per configuration (20)")
    ap.add_argument("--warmup", type=int, default=3, help="bench: untimed steps after the compile (3)")
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help=f"bench: configurations, of {', '.join(ALL_CONFIGS)} (default {','.join(CONFIGS)})")
    args = ap.parse_args()
    from fxglue.run import compile as bucketplan_compile

    def fail(message: str):
        print(f"train_compiled.py: error: {message}", file=sys.stderr)
        sys.exit(2)

    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if args.mode == "bench":
        unknown = [c for c in args.configs if c not in ALL_CONFIGS]
        if unknown or not args.configs or len(set(args.configs)) != len(args.configs):
            fail(f"--configs {','.join(args.configs)}: give distinct configurations of {', '.join(ALL_CONFIGS)}")
        if args.steps < 1 or args.warmup < 0:
            fail("--steps must be at least 1 and --warmup at least 0")
    if min(args.layers, args.dim, args.hidden, args.batch, args.seq) < 1:
        fail("--layers, --dim, --hidden, --batch and --seq must be at least 1")
    if args.profile_cpu and not args.profile:
        fail("--profile-cpu: give the CPU run's trace with --profile TRACE.json")
    if args.mode == "bench":  # bench writes into --out: never over the plans or the trace it reads
        from bucketplan.cli.common import CLIError, not_inputs
        from fxglue.run.bench import written

        try:
            not_inputs(written(args.out), "--out", args.out, [("the plan directory", args.plan_dir),
                                                             ("--profile", args.profile)])
        except CLIError as e:
            fail(str(e))
    try:  # the preset, the trace and the directories, checked here once rather than in every rank
        if args.mode == "use":  # no plans to use is a mistake to name, not a run of torch's bucketing
            bucketplan_compile.check_plan_dir(args.plan_dir)
        (bucketplan_compile.record if args.mode == "record" else bucketplan_compile.use)(args.plan_dir,
                                                                                         **_pricing(args))
        if args.mode == "bench":
            from fxglue.run.bench import record_dir

            bucketplan_compile.record(record_dir(args.out), **_pricing(args))
    except ValueError as e:  # PlanCacheError and ProfileError included
        fail(str(e))
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun: this process is one rank
        train(None, None, None, args)
        return
    store = os.path.join(tempfile.mkdtemp(prefix="bucketplan-example-"), "store")
    mp.spawn(train, args=(2, store, args), nprocs=2)


if __name__ == "__main__":
    main()
