"""Errors a user can act on: every one names the file, the line, the field and the fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Violation:
    """One broken rule in a recipe."""

    file: str
    line: int | None
    field: str  # dotted path, e.g. "kv_transfer.max_tokens_in_buffer"
    message: str
    fix: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        text = f"{where}: {self.field}: {self.message}"
        return f"{text}\n    fix: {self.fix}" if self.fix else text

    def to_dict(self) -> dict:
        return asdict(self)


class TkError(Exception):
    """An error tk reports to the user without a traceback (exit code 1 unless stated)."""

    exit_code = 1


class RecipeError(TkError):
    """One or more violations in a recipe; nothing has been written."""

    exit_code = 2

    def __init__(self, violations: list[Violation]):
        self.violations = list(violations)
        super().__init__("\n".join(str(v) for v in self.violations))
