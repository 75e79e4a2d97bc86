"""The error types mambalaya reports to users.

Every error a user can cause (a malformed cascade, a bad spec field, a missing weight) is a
:class:`MambalayaError`; the CLI prints its message as one paragraph and exits non-zero. Any
other exception escaping the package is a bug.
"""

from __future__ import annotations


def one_line(text: str) -> str:
    """``text`` with its line breaks shown as ``\\n`` (a user's value or file name may hold one): a
    message is one paragraph, whatever it quotes."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


class MambalayaError(Exception):
    """Base class of every error mambalaya reports to users."""


class SpecError(MambalayaError):
    """A cascade, Einsum or spec is malformed or inconsistent.

    ``source`` names the file (or ``<string>``), ``line``/``column`` locate the fault when the
    text is at fault (1-based), ``einsum`` names the Einsum when a rule is broken.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        line: int | None = None,
        column: int | None = None,
        einsum: str | None = None,
    ) -> None:
        self.message = one_line(message)
        self.source = one_line(source) if source is not None else None
        self.line = line
        self.column = column
        self.einsum = einsum
        super().__init__(self._render())

    @property
    def location(self) -> str:
        parts = []
        if self.source:
            parts.append(self.source)
        if self.line is not None:
            parts.append(f"line {self.line}")
        if self.column is not None:
            parts.append(f"column {self.column}")
        where = ", ".join(parts)
        if self.einsum:
            where = f"{where}: Einsum {self.einsum}" if where else f"Einsum {self.einsum}"
        return where

    def at_source(self, source: str) -> "SpecError":
        """This error, located in ``source`` (a file whose content broke a rule that is checked
        later than the file is read, such as a mapping file's groups against a cascade)."""
        self.source = one_line(source)
        self.args = (self._render(),)
        return self

    def _render(self) -> str:
        where = self.location
        return f"{where}: {self.message}" if where else self.message


class ExecutionError(MambalayaError):
    """Arrays given to the executor do not fit the cascade (missing, wrong shape, bad dtype)."""
