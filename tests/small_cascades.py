"""Small hand-checkable cascades the unit tests share."""

from __future__ import annotations

from mambalaya.einsum import loads_cascade


def matmul(m: int, k: int, n: int, left: str = "A", right: str = "W", right_role: str = "weight"):
    """``Y[m,n] = left[m,k] * right[k,n]``: M positions, K reduced, N outputs; ``right`` a weight
    (a GEMM) or an input (a product of two activations)."""
    return loads_cascade(f"""
ranks: {{M: {m}, K: {k}, N: {n}}}
tensors:
  {left}: {{ranks: [M, K], role: input}}
  {right}: {{ranks: [K, N], role: {right_role}}}
  Y: {{ranks: [M, N], role: output}}
einsums:
  - Y[m,n] = {left}[m,k]*{right}[k,n]
""")


def gemm(m: int, k: int, n: int):
    """A GEMM against a weight: ``Y = A x W``."""
    return matmul(m, k, n)
