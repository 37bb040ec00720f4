"""Plain-text tables for terminal summaries, and the median their figures use (no dependencies)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

__all__ = ["format_table", "median"]


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned first column, right-aligned numbers.

    >>> print(format_table(["series", "last"], [["loss", 2.5], ["grad_norm", None]]))
    series     last
    ---------  ----
    loss        2.5
    grad_norm     -
    """
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [values[0].ljust(widths[0])]
        parts += [v.rjust(w) for v, w in zip(values[1:], widths[1:], strict=True)]
        return "  ".join(parts).rstrip()

    out = [line(list(headers)), line(["-" * w for w in widths])]
    return "\n".join([*out, *(line(r) for r in cells)])


def median(values: Sequence[float]) -> float | None:
    """The median, or None for no values (a table shows "-": nothing to summarise).

    >>> median([3, 1, 2]), median([1, 2]), median([])
    (2, 1.5, None)
    """
    return statistics.median(values) if len(values) else None
