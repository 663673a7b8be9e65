"""One training step of torchtitan's tiny Llama 3 as torchtitan's graph_trainer runs it, on a
gloo rank, for test_titan.

``titan_step(rank, world, spec)`` runs on every rank of a ``fxglue.run.gloo.GlooWorld``: the
``debugmodel`` flavor of graph_trainer's Llama 3 config at two layers, in float32, parallelized by
torchtitan's own parallelize function over both ranks (meshes on CPU), traced by graph_trainer's
tracer, passed through the pass pipeline graph_trainer's trainer looks up by name (bucketplan's,
``fxglue.run.titan.register_pipeline``, in ``spec["mode"]``), and run by graph_trainer's
``run_traced`` -- ``GraphTrainer._make_fx_forward_backward_step`` step by step, since the trainer
itself needs CUDA. Returns the loss, every parameter's local gradient, the pass's events and the
collectives left in the graph it ran.
"""

from __future__ import annotations

import logging
import os

SEQ, BATCH = 32, 2


def titan_step(rank: int, world: int, spec: dict) -> dict:
    import torch
    from torchtitan.experiments.graph_trainer.make_fx_tracer import run_traced
    from torchtitan.experiments.graph_trainer.passes import _get_pass_name, apply_graph_passes
    from torchtitan.experiments.graph_trainer.registry import PASS_PIPELINE_REGISTRY

    from fxglue.models import titan
    from fxglue.pipeline import count_collectives
    from fxglue.run.titan import register_pipeline

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(spec["cache_dir"], f"rank{rank}")
    warnings: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("bucketplan.compile").addHandler(handler)

    with titan.quiet():
        config = titan.training_config(titan.ARCHS["llama3-8b"], 2, flavor="debugmodel")
        config.training.local_batch_size, config.training.seq_len = BATCH, SEQ
        config.training.mixed_precision_param = "float32"  # every compute dtype as the unsharded model's
        config.compile.disable_passes = ["cudagraph_pass"]  # CUDA graphs need CUDA
        config.compile.inductor_compilation = spec.get("inductor", "regional")
        dims = titan.parallel_dims(config, world)
        model, _ = titan.build_model(config, dims)
        model.to_empty(device="cpu")
        torch.manual_seed(0)  # the same parameters on every rank
        with torch.no_grad():
            model.init_states(buffer_device=None)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
    tokens = torch.randint(0, config.model_spec.model.vocab_size, (BATCH, SEQ), generator=gen)
    inputs = titan.step_inputs(config, tokens=tokens)
    traced = titan.trace_step(config, model, inputs)

    events = register_pipeline(spec["mode"], spec.get("plan_dir"), preset=spec.get("preset", "h100-8nodes"))
    config.compile.pass_pipeline = "bucketplan"
    passes = PASS_PIPELINE_REGISTRY[config.compile.pass_pipeline](traced, config, parallel_dims=dims)
    traced.gm = apply_graph_passes(traced.gm, traced.example_inputs, passes, compile_config=config.compile)
    outputs = run_traced(traced, module=model)(*inputs)
    logging.getLogger("bucketplan.compile").removeHandler(handler)
    local = [g.to_local() if hasattr(g, "to_local") else g for g in outputs[1:]]
    return {"loss": outputs[0].detach().clone(), "grads": [g.detach().clone() for g in local],
            "events": [vars(e) for e in events], "warnings": warnings,
            "passes": [_get_pass_name(p) for p in passes],
            "collectives": sum(count_collectives(traced.gm).values())}
