"""Reports on cascades: tables and diagrams.

Submodules are imported on demand (``from mambalaya.report.diagram import draw_cascade``) so
that importing the package does not pull in matplotlib.
"""
