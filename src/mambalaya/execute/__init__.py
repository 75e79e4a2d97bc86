"""Numerical execution of cascades (numpy): whole tensors, or tile by tile under a mapping."""

from mambalaya.execute.numpy_exec import carry_states, execute, run_einsum
from mambalaya.execute.tiled import OffChipStore, TiledRun, run_tiled

__all__ = ["OffChipStore", "TiledRun", "carry_states", "execute", "run_einsum", "run_tiled"]

# The one-call runner of a hybrid layer's step (mambalaya.execute.layers) is imported from its
# module: it reaches into the workloads, which this package's core does not need.
