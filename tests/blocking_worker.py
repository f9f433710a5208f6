"""``dpss worker`` whose analyze_gauss runs never end (``python -m tests.blocking_worker``;
settings from ``DPSS_*``): a kill lands mid-job whatever the machine's speed, where a slow
eigendecomposition only made it likely (and took half a minute)."""

from __future__ import annotations

import sys
import threading
from typing import Any

from service import cli
from service.mechanisms import analyze_gauss


def _block(*_args: Any, **_kwargs: Any) -> Any:
    threading.Event().wait()  # until the process is killed


def main() -> None:
    # Patched before the worker forks its runs: the children inherit it.
    analyze_gauss.gauss_release = _block  # type: ignore[assignment]
    sys.argv = ["dpss", "worker"]
    cli.main()


if __name__ == "__main__":
    main()
