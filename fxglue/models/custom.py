"""Your own model as a workload: a factory in any Python file or module, or a Hugging Face config.

Why this exists: the built-in workloads show what the planner does; users come to plan *their*
model. A workload is the ``Workload.build`` protocol -- ``factory(groups) -> (module,
example_inputs, loss_fn)`` -- so any model whose factory follows it is traced, scheduled and
planned like the built-ins, with the same wrappers (SimpleFSDP, DDP, FSDP x TP for 2-D).

- ``--model pkg.module:factory`` or ``--model path/to/file.py:factory``. ``factory(groups)`` is
  called inside the tracing fake mode with ``fxglue.models.workloads.Groups`` (data-parallel group name
  and size; for 2-D also the TP group, which the factory's module uses for its own tensor
  parallelism). It returns ``(module, example_inputs, loss_fn)``: an ``nn.Module`` built in the
  dtype it trains in, a tuple of input tensors, and ``loss_fn(module, *inputs) -> scalar``.
  With ``--layers N`` it is called as ``factory(groups, layers=N)``. ``check --model`` calls it
  for real instead, on each gloo rank, and runs the very inputs it returns (only the factory
  knows which values its model accepts): once under a seed shared by every rank for the
  parameters, once more under a seed per data-parallel rank for that rank's inputs.
- ``--hf-config path/config.json``: any causal LM that ``transformers`` builds from a config
  alone (``AutoModelForCausalLM.from_config``), never a download; ``--layers`` overrides
  ``num_hidden_layers``. ``--hf MODEL_ID`` reads that model's config.json from the local
  Hugging Face cache only (a clear error when it is not there).
Every failure names the spec and what was wrong, as a ``WorkloadError`` (one line, exit 2).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path

import torch
import torch.nn as nn

from fxglue.models.base import Groups, Workload, WorkloadError, default_dtype

PARALLEL_STYLES = ("fsdp", "ddp", "2d")
HF_SEQ_LEN = 4096  # the built-in models' sequence length; one unpadded sequence per rank


def _load_factory(spec: str):
    """The callable named by ``module:attr`` or ``file.py:attr``."""
    if ":" not in spec:
        raise WorkloadError(f"--model {spec}: expected MODULE:FACTORY or FILE.py:FACTORY")
    where, _, attr = spec.rpartition(":")
    try:
        if where.endswith(".py") or os.sep in where:
            path = Path(where)
            if not path.is_file():
                raise WorkloadError(f"--model {spec}: no such file {where}")
            name = "bucketplan_user_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
            module_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except WorkloadError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's code: name it, one line
        raise WorkloadError(f"--model {spec}: importing {where} failed: {type(e).__name__}: {e}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise WorkloadError(f"--model {spec}: {where} has no callable {attr!r}")
    return factory


def _checked(spec: str, built) -> tuple[nn.Module, tuple[torch.Tensor, ...], object]:
    """The factory's result, or an error naming what is wrong with it."""
    if not isinstance(built, tuple) or len(built) != 3:
        raise WorkloadError(f"--model {spec}: the factory must return (module, example_inputs, loss_fn), "
                            f"got {type(built).__name__}")
    module, inputs, loss_fn = built
    if not isinstance(module, nn.Module):
        raise WorkloadError(f"--model {spec}: the factory's module is a {type(module).__name__}, not an nn.Module")
    if not isinstance(inputs, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise WorkloadError(f"--model {spec}: example_inputs must be a tuple of tensors")
    if not callable(loss_fn):
        raise WorkloadError(f"--model {spec}: loss_fn is not callable")
    if not any(True for _ in module.parameters()):
        raise WorkloadError(f"--model {spec}: the module has no parameters: nothing to communicate")
    return module, tuple(inputs), loss_fn


def factory_workload(spec: str, parallel: str = "fsdp", layers: int | None = None) -> Workload:
    """A workload from a user's factory (see the module docstring)."""
    if parallel not in PARALLEL_STYLES:
        raise WorkloadError(f"--parallel {parallel}: choose one of {', '.join(PARALLEL_STYLES)}")
    factory = _load_factory(spec)
    kwargs = {}
    if layers is not None:
        if "layers" not in inspect.signature(factory).parameters:
            raise WorkloadError(f"--model {spec}: --layers given but the factory takes no 'layers' argument")
        kwargs["layers"] = layers

    def build(groups: Groups):
        try:
            built = factory(groups, **kwargs)
        except WorkloadError:
            raise
        except Exception as e:  # noqa: BLE001 - the user's code: name it, one line
            raise WorkloadError(f"--model {spec}: the factory raised {type(e).__name__}: {e}") from None
        return _checked(spec, built)

    name = f"model:{spec}" + (f"@{layers}" if layers is not None else "")
    return Workload(name=name, description=f"user model {spec}, {parallel}", style=parallel, build=build,
                    layers=layers or 0, family="custom")


def hf_config_workload(config_path: str | None = None, *, model_id: str | None = None, parallel: str = "fsdp",
                       layers: int | None = None) -> Workload:
    """A workload from a Hugging Face causal-LM config (a file, or a model id in the local cache)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError:
        raise WorkloadError("--hf-config/--hf need the `models` extra (transformers)") from None
    from fxglue.models import hf_models

    if parallel not in ("fsdp", "ddp"):
        raise WorkloadError(f"--parallel {parallel}: a Hugging Face model runs as fsdp or ddp (its layers have no "
                            "tensor parallelism of ours)")
    what = config_path or model_id
    try:
        if model_id is not None:
            config = transformers.AutoConfig.from_pretrained(model_id, local_files_only=True)
        else:
            if not Path(config_path).is_file():
                raise WorkloadError(f"--hf-config {config_path}: no such file")
            config = transformers.AutoConfig.from_pretrained(config_path)
    except WorkloadError:
        raise
    except Exception as e:  # noqa: BLE001 - transformers' errors name the file; keep one line
        flag = "--hf" if model_id is not None else "--hf-config"
        hint = " (not in the local Hugging Face cache; nothing is downloaded)" if model_id is not None else ""
        raise WorkloadError(f"{flag} {what}: cannot read the config{hint}: {str(e).splitlines()[0]}") from None
    n_layers = layers if layers is not None else getattr(config, "num_hidden_layers", None)
    if not isinstance(n_layers, int) or n_layers < 1:
        raise WorkloadError(f"{what}: the config has no num_hidden_layers; give --layers")

    def build(groups: Groups):
        hf_models._register_attention()
        cfg = transformers.AutoConfig.for_model(**{**config.to_dict(), **hf_models._COMMON,
                                                   "num_hidden_layers": n_layers})
        # `dtype` first: transformers 5 warns on every read of the deprecated `torch_dtype`
        dtype = getattr(torch, str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
                                   or "bfloat16").removeprefix("torch."), torch.bfloat16)
        try:
            with default_dtype(dtype):
                module = transformers.AutoModelForCausalLM.from_config(cfg)
        except Exception as e:  # noqa: BLE001 - an architecture transformers cannot build
            raise WorkloadError(f"{what}: transformers cannot build a causal LM from it: "
                                f"{type(e).__name__}: {str(e).splitlines()[0]}") from None
        module.train()
        ids = torch.zeros((1, HF_SEQ_LEN), dtype=torch.long)
        return module, (ids, ids.clone()), hf_models.lm_loss

    name = f"hf-config:{what}" + (f"@{n_layers}" if layers is not None else "")
    return Workload(name=name, description=f"transformers {type(config).__name__} from {what}, {n_layers} layers, "
                    f"{parallel}", style=parallel, build=build, layers=n_layers, family="custom")
