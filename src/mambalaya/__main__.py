"""``python -m mambalaya`` runs the command line."""

from mambalaya.cli import app

app()
