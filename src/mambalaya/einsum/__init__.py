"""The extended-Einsum IR: ranks, tensors, Einsums, cascades, their text format and statistics."""

from mambalaya.einsum.cascade import EINSUM_KINDS, Cascade, build_cascade
from mambalaya.einsum.cascade_file import dump_cascade, load_cascade, loads_cascade
from mambalaya.einsum.ir import (
    Access,
    AffineIndex,
    Binary,
    Const,
    Einsum,
    Param,
    Rank,
    Role,
    TensorSpec,
    Unary,
)
from mambalaya.einsum.parse import evaluate_size, parse_einsum

__all__ = [
    "EINSUM_KINDS",
    "Access",
    "AffineIndex",
    "Binary",
    "Cascade",
    "Const",
    "Einsum",
    "Param",
    "Rank",
    "Role",
    "TensorSpec",
    "Unary",
    "build_cascade",
    "dump_cascade",
    "evaluate_size",
    "load_cascade",
    "loads_cascade",
    "parse_einsum",
]
