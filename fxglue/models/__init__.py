"""Workload definitions: the models we trace (Llama shapes, Hugging Face architectures, a user's
factory), how they are parallelized (SimpleFSDP, DDP, Megatron TP) and the registry of named
workloads. Imports torch; never imports the bridge (``fxglue.pipeline`` ...) or ``fxglue.run``."""
