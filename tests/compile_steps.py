"""One training step of a tiny Llama under ``torch.compile`` on a gloo rank, for test_compile.

``compiled_step(rank, world, spec)`` runs on every rank of a ``fxglue.run.gloo.GlooWorld``:
eager (``mode="eager"``), compiled as torch compiles by default, without overlap scheduling or
bucketing (``"plain"``), with torch's overlap schedule and nothing merged
(``"unbucketed"``), or compiled inside ``fxglue.run.compile.record`` / ``use`` on ``spec["plan_dir"]``. It returns the loss, every stored parameter's gradient and the pass's events.
"""

from __future__ import annotations

import logging
import os


def build(rank: int, world: int, style: str, layers: int, seq: int):
    """``style`` fsdp, ddp, or 2d: FSDP over both ranks x Megatron TP over one rank (each rank its
    own TP group, so the ranks' graphs and problems differ by the group's name)."""
    import torch

    from fxglue.models import parallel
    from fxglue.models.llama import LLAMA_TINY, Llama, lm_loss
    from fxglue.models.workloads import mesh_groups

    groups = mesh_groups(style, world, tp_size=1)
    torch.manual_seed(0)  # the same full model on every rank
    module = Llama(LLAMA_TINY.with_(n_layers=layers), tp_size=1, tp_group=groups.tp)
    wrapped = parallel.wrap(module, "ddp" if style == "ddp" else "fsdp", groups.dp_size, groups.dp, rank=rank,
                            regather=False)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
    tokens = torch.randint(0, LLAMA_TINY.vocab_size, (2, seq), generator=gen)
    labels = torch.randint(0, LLAMA_TINY.vocab_size, (2, seq), generator=gen)
    return module, wrapped, (tokens, labels), lm_loss, groups


def compiled_step(rank: int, world: int, spec: dict) -> dict:
    import torch
    import torch._inductor.config as inductor_config

    from fxglue.run import compile as bucketplan_compile
    from fxglue.models import parallel

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(spec["cache_dir"], f"rank{rank}")
    inductor_config.compile_threads = 1
    module, wrapped, inputs, loss_fn, groups = build(rank, world, spec["style"], spec.get("layers", 2), spec.get("seq", 16))

    def step(*args):
        return loss_fn(module, *args)

    warnings: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("bucketplan.compile").addHandler(handler)
    torch._dynamo.reset()
    mode = spec["mode"]
    fn = step if mode == "eager" else torch.compile(step, backend="inductor")
    session = None
    # inductor's caches as a user has them (on by default), in this test's own folder
    if mode in ("record", "use", "unbucketed"):
        where = () if mode == "unbucketed" else (spec["plan_dir"],)
        ctx = getattr(bucketplan_compile, mode)(*where, preset=spec.get("preset", "h100-8nodes"),
                                                tp_group=groups.tp, tp_size=groups.tp_size)
        with ctx as session:
            loss = fn(*inputs)
            loss.backward()
    else:
        loss = fn(*inputs)
        loss.backward()
    logging.getLogger("bucketplan.compile").removeHandler(handler)
    grads = [p.grad.detach().clone() for p in parallel.stored_params(wrapped)]
    return {"loss": loss.detach().clone(), "grads": grads, "warnings": warnings,
            "events": [vars(e) for e in session.events] if session else []}
