"""Fusion: edge classes, mappings (groups + fused loops), legality and named mappings."""
