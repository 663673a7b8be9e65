"""Work over many problems and its outputs: plan folders, sweeps, tables, the progress line.

``plan_dir`` (problems recorded from torch.compile, solved in turn), ``sweep`` (sweeps, Ray
optional), ``tables`` (the one table writer), ``progress`` (the live line of a long search).
May import every other room of ``planner``.
"""
