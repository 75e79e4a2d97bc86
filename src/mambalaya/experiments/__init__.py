"""Experiments: single evaluations, design comparisons and the paper's reproduction."""
