"""Use a bucketplan plan in a real torch.compile training step (2 gloo ranks on this CPU).

    python examples/train_compiled.py record plans/    # compile as usual; problems are recorded
    bucketplan solve-dir plans/                        # solve them offline (any machine)
    python examples/train_compiled.py use plans/       # compile again with the plans applied

Each run trains 3 steps of examples/my_model.py (4 layers, ``--layers``) wrapped for DDP (``--parallel fsdp``:
SimpleFSDP-style) and prints the loss and, per compiled graph, what the plan cache did with it.
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


def train(rank: int, world: int, store: str, mode: str, plan_dir: str, parallel: str, preset: str,
          layers: int) -> None:
    from fxglue.run import compile as bucketplan_compile
    from fxglue.models.parallel import wrap
    from my_model import MyModel

    logging.basicConfig(level=logging.WARNING, format=f"[rank {rank}] %(message)s")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, store=dist.FileStore(store, world))
    torch.manual_seed(0)
    model = MyModel(vocab=256, dim=64, hidden=256, layers=layers)
    # regather=False: backward keeps the gathered parameters, so dynamo compiles whole graphs
    wrap(model, parallel, world, dist.group.WORLD.group_name, rank=rank, regather=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss_fn(tokens):
        logits = model(tokens[:, :-1])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())

    compiled = torch.compile(loss_fn)
    ctx = bucketplan_compile.record if mode == "record" else bucketplan_compile.use
    gen = torch.Generator().manual_seed(rank)
    with ctx(plan_dir, preset=preset) as session:
        for step in range(3):
            loss = compiled(torch.randint(0, 256, (4, 33), generator=gen))
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["record", "use"])
    ap.add_argument("plan_dir")
    ap.add_argument("--parallel", choices=["ddp", "fsdp"], default="ddp")
    ap.add_argument("--preset", default="h100-8nodes", help="the cluster the plans are priced for (h100-8nodes)")
    ap.add_argument("--layers", type=int, default=4, help="the model's depth (4); another depth is another graph, "
                                                          "with no plan until it is recorded and solved")
    args = ap.parse_args()
    from fxglue.run import compile as bucketplan_compile

    try:  # the preset and (for record) the directory, checked here once rather than in every rank
        (bucketplan_compile.record if args.mode == "record" else bucketplan_compile.use)(args.plan_dir,
                                                                                         preset=args.preset)
    except ValueError as e:  # PlanCacheError included
        print(f"train_compiled.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    store = os.path.join(tempfile.mkdtemp(prefix="bucketplan-example-"), "store")
    mp.spawn(train, args=(2, store, args.mode, args.plan_dir, args.parallel, args.preset, args.layers), nprocs=2)


if __name__ == "__main__":
    main()
