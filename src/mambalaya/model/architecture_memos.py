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


__all__ = ["forget_architecture_results"]
