"""bucketplan's plans in torchtitan's graph_trainer: config functions for torchtitan's launcher.

torchtitan 0.3.0 reads its configs from Python functions (``--module M --config F``); these wrap
graph_trainer's own configs and select the ``bucketplan`` pass pipeline: graph_trainer's default
passes with its FSDP bucketing pass replaced by bucketplan's (``fxglue.run.titan``). Three steps,
on the cluster the preset describes (set up with ``pip install -e '.[models,torchtitan]'``):

    export PYTHONPATH=examples                    # so that --module finds this file
    # 1. record: train as usual (torch's greedy bucketer buckets), every graph's problem is written
    BUCKETPLAN_MODE=record BUCKETPLAN_DIR=plans/ torchrun --nproc_per_node 8 -m torchtitan.train \\
        --module torchtitan_bucketplan --config graph_trainer_llama3_8b_bucketplan
    # 2. offline, on any machine: one verified plan per recorded graph
    bucketplan solve-dir plans/ --time-limit 60
    # 3. use: the same command; each graph gets its plan (a missing one: one warning, torch's greedy)
    BUCKETPLAN_MODE=use BUCKETPLAN_DIR=plans/ torchrun --nproc_per_node 8 -m torchtitan.train \\
        --module torchtitan_bucketplan --config graph_trainer_llama3_8b_bucketplan

Settings come from the environment because torchtitan's command line only knows its own config
fields: ``BUCKETPLAN_MODE`` (record, use), ``BUCKETPLAN_DIR`` (the plan directory, shared by every
rank), ``BUCKETPLAN_PRESET`` (the cluster the plans are priced for, as ``bucketplan presets``
lists; h100-8nodes). Record and use must see the same model, shapes, parallelism and preset: they
make each graph's fingerprint. In your own config function, the two lines of ``with_bucketplan``
are all it takes.
"""

from __future__ import annotations

import os

from fxglue.run.titan import PIPELINE, register_pipeline


def with_bucketplan(config):
    """``config`` (a graph_trainer config) with the bucketplan pipeline selected, registered in
    the mode, directory and preset the environment names."""
    mode = os.environ.get("BUCKETPLAN_MODE", "record")
    register_pipeline(mode, os.environ.get("BUCKETPLAN_DIR", "plans"),
                      preset=os.environ.get("BUCKETPLAN_PRESET", "h100-8nodes"))
    config.compile.pass_pipeline = PIPELINE
    return config


def graph_trainer_llama3_8b_bucketplan():
    from torchtitan.experiments.graph_trainer.llama3.config_registry import graph_trainer_llama3_8b

    return with_bucketplan(graph_trainer_llama3_8b())


def graph_trainer_llama3_debugmodel_bucketplan():
    from torchtitan.experiments.graph_trainer.llama3.config_registry import graph_trainer_llama3_debugmodel

    return with_bucketplan(graph_trainer_llama3_debugmodel())


def graph_trainer_deepseek_v3_16b_bucketplan():
    from torchtitan.experiments.graph_trainer.deepseek_v3.config_registry import graph_trainer_deepseek_v3_16b

    return with_bucketplan(graph_trainer_deepseek_v3_16b())
