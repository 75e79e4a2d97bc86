"""Numerical execution of cascades (numpy)."""

from mambalaya.execute.numpy_exec import carry_states, execute, run_einsum

__all__ = ["carry_states", "execute", "run_einsum"]
