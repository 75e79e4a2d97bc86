"""The ``mambalaya`` command line, one module per command group.

Every command turns user errors (:class:`~mambalaya.errors.MambalayaError`) into one
paragraph on stderr and exit status 1; anything else escaping is a bug and keeps its traceback.
Options several commands share are declared once in :mod:`mambalaya.cli.options`.
"""

from __future__ import annotations

from mambalaya.cli import arch, cascade, evaluate, fusion, interop, reproduce, sweep  # noqa: F401 - register the commands
from mambalaya.cli.common import app

__all__ = ["app"]

if __name__ == "__main__":  # pragma: no cover
    app()
