"""Tables (stdout) and docs/benchmarks.md with plots, from the results rows."""

from __future__ import annotations

from typing import Any

from bench.core import Row


def tables(results: dict[str, list[Row]], quick: bool) -> str:
    return "\n".join(f"{s}: {len(r)} rows" for s, r in results.items())


def write(results: dict[str, list[Row]], load_text: str, config: Any) -> None:
    pass
