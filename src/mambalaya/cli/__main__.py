"""``python -m mambalaya.cli``: the command line."""

from mambalaya.cli import app

app()
