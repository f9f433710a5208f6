"""The service's Dask configuration (``dask.yaml`` beside this module) and a LocalCluster
built with it.

A deployment's scheduler and Dask workers read the file themselves: the image installs it in
``{sys.prefix}/etc/dask``, one of the places Dask reads at import, and anywhere else
``DASK_CONFIG`` can name it (docs/deployment.md). A process that builds a
:func:`local_cluster` (the bench, the tests) gets the same settings, in its scheduler and in
each worker: the nanny hands its configuration to the worker process it starts.

The settings turn down what every Dask process spends while no task runs (the workers'
statistical profiler, the event-loop health check, the system monitor), which only a dashboard
shows; the service starts none. None of them changes what a task computes, where it runs or
in what order the partial results are added, so a pass's bits do not depend on them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: The service's Dask configuration file (YAML, Dask's nested keys).
CONFIG_FILE = Path(__file__).with_name("dask.yaml")


def dask_config() -> dict[str, Any]:
    """The settings of :data:`CONFIG_FILE`, read by Dask's own loader (as a scheduler or
    worker reads it from ``{sys.prefix}/etc/dask``), by dotted key: ``dask.config.set``
    replaces a whole subtree given as a nested mapping, and these are leaves on top of the
    rest of Dask's configuration."""
    import dask.config

    (loaded,) = dask.config.collect_yaml([str(CONFIG_FILE)])
    return dict(_leaves(loaded))


def _leaves(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if not isinstance(tree, dict):
        yield prefix, tree
        return
    for key, value in tree.items():
        yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))


@contextlib.contextmanager
def service_config() -> Iterator[None]:
    """The service's Dask settings in force in this process (on top of the environment's)
    while the block runs; a scheduler or nanny built inside keeps them."""
    import dask.config

    with dask.config.set(dask_config()):
        yield


def local_cluster(**options: Any) -> Any:
    """A ``distributed.LocalCluster`` (``options`` as it takes them) whose scheduler, nannies
    and workers run with the service's Dask settings, as a deployment's do."""
    from distributed import LocalCluster

    with service_config():
        return LocalCluster(**options)
