"""CPU of starting ``dpss`` for commands that need little: this tree against a baseline tree.

    python -m bench.bench_cli_startup --baseline /tmp/cli_main [--repeats 7]

Export the baseline first, e.g. ``git -C /work/main archive HEAD | tar -x -C /tmp/cli_main``
(or ``git archive <commit>``). Each case runs as a fresh interpreter of this venv with
``PYTHONPATH`` set to one tree (and its ``clients/python``), the two trees alternating, so both
see the same load; a run's CPU is its user + system time (``os.wait4``), and the median over
``--repeats`` runs of each is kept. The ratio (baseline over this tree) does not depend on how
busy the machine is as long as the load is steady over the rounds; absolute seconds do.

Cases: ``import service.cli``, ``dpss --help``, ``dpss datasets --help`` (a client-side group),
``dpss releases list --help`` (a client-side command), ``dpss serve --help`` (a server command's
help), ``import dpss_client.client`` (what a remote command such as ``dpss datasets list``
imports before it sends its request) and ``from service import metrics``; ``python -c pass``
is the interpreter's own floor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASES: dict[str, list[str]] = {
    "python -c pass (floor)": ["-c", "pass"],
    "import service.cli": ["-c", "import service.cli"],
    "dpss --help": ["-m", "service", "--help"],
    "dpss datasets --help": ["-m", "service", "datasets", "--help"],
    "dpss releases list --help": ["-m", "service", "releases", "list", "--help"],
    "dpss serve --help": ["-m", "service", "serve", "--help"],
    "import dpss_client.client": ["-c", "import dpss_client.client"],
    "from service import metrics": ["-c", "from service import metrics"],
}


def environment(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{tree}{os.pathsep}{tree / 'clients' / 'python'}"
    env["COLUMNS"] = "100"  # the help's width: the same text in both trees
    return env


def check_tree(tree: Path) -> None:
    """The tree's own ``service`` is the one imported (not an installed copy)."""
    found = subprocess.run(
        [sys.executable, "-c", "import service.cli as c; print(c.__file__)"],
        env=environment(tree),
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(found).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"{tree}: imports service from {found}")


def cpu_seconds(tree: Path, args: list[str]) -> tuple[float, bytes]:
    """User + system CPU of one run, and its stdout."""
    process = subprocess.Popen(
        [sys.executable, *args],
        env=environment(tree),
        cwd=tree,  # `-c` and `-m` put the working directory first on sys.path
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert process.stdout is not None
    out = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{tree}: {' '.join(args)} exited {process.returncode}")
    return usage.ru_utime + usage.ru_stime, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="The tree to compare with.")
    parser.add_argument("--repeats", type=int, default=7)
    options = parser.parse_args()
    trees = {"baseline": options.baseline, "this tree": ROOT}
    for tree in trees.values():
        check_tree(tree)
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    print(f"{'case':30s} {'baseline s':>10s} {'this s':>8s} {'ratio':>6s}  same output")
    for name, args in CASES.items():
        runs: dict[str, list[float]] = {label: [] for label in trees}
        outputs: dict[str, bytes] = {}
        for _ in range(options.repeats):
            for label, tree in trees.items():
                seconds, outputs[label] = cpu_seconds(tree, args)
                runs[label].append(seconds)
        old = statistics.median(runs["baseline"])
        new = statistics.median(runs["this tree"])
        same = "yes" if outputs["baseline"] == outputs["this tree"] else "NO"
        print(f"{name:30s} {old:10.3f} {new:8.3f} {old / new:5.1f}x  {same}")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
