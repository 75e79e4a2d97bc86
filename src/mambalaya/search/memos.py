"""What a cascade keeps per architecture, and how a process drops it."""

from __future__ import annotations

from mambalaya.einsum.cascade import Cascade


#: The results a cascade keeps per architecture (or compute section): choices, group totals,
#: cycles and pick tables. The architecture-free tables (traffic closed forms, tilings, reads)
#: are not among them.
_ARCHITECTURE_MEMOS = ("_best_group_memo", "_group_totals_memo", "_group_cycles_memo", "_pick_tables_memo",
                       "_grid_cycles_memo", "_einsum_cycles_memo", "_least_cycles_memo",
                       "_cycles_bounds_memo")


def forget_architecture_results(cascade: Cascade) -> None:
    """Drop what ``cascade`` keeps per architecture, keeping its architecture-free tables: for a
    process that moves on to architectures no earlier one shares (a sensitivity worker), whose
    memory would otherwise grow with every setting."""
    for memo in _ARCHITECTURE_MEMOS:
        cascade.__dict__.pop(memo, None)
    for model in cascade.__dict__.get("_group_cost_model_memo", {}).values():
        model.forget_cycles()


def forget_results(cascade: Cascade) -> None:
    """Drop every memo ``cascade`` keeps (its ``*_memo`` entries, architecture-free ones
    included), for a process done with it. Its cost models and tables refer back to it, a
    reference cycle: a cascade dropped with its memos would wait for the cyclic collector, and
    in a sweep's worker, whose memos :func:`gc.freeze` moves out of the collector's reach,
    stay for the life of the process."""
    for name in [k for k in cascade.__dict__ if k.endswith("_memo") and k != "structure_memo"]:
        del cascade.__dict__[name]


__all__ = ["forget_architecture_results", "forget_results"]
