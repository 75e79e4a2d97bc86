"""mambalaya: Einsum-based fusion analysis of state-space models (Mamba) on accelerators."""

__version__ = "0.1.0"
