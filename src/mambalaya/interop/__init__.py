"""Bridges from mambalaya to other accelerator-modelling tools (AccelForge)."""
