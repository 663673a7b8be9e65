"""Everything that touches torch.fx: workloads, torch's scheduler on CPU, problem extraction,
torch's greedy as a plan, applying any plan, and running graphs for real on gloo.

The public functions are imported lazily so that ``import fxglue`` stays cheap.
"""

_EXPORTS = {
    "extract_problem": "fxglue.extract",
    "greedy_plan": "fxglue.greedy",
    "apply_plan": "fxglue.apply",
    "PlanError": "fxglue.apply",
    "run_pipeline": "fxglue.pipeline",
    "check_workload": "fxglue.run.gloo",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'fxglue' has no attribute {name!r}")
