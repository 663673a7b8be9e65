"""What a plan costs: its step time, its peak memory, and the floors no plan can beat.

``simulator`` (the step of a plan, in ns), ``memory`` (its peak, as torch's estimator counts it),
``bounds`` (floors and lower bounds), ``measured`` (measured collective times: nccl-tests logs,
CSV, AutoParallel's tables). Imports only ``planner.core``.
"""
