"""docs/notebooks/digits_pca.ipynb: its cells, a runner for them without Jupyter, and its writer.

The notebook is the issue's "done when" task: private PCA of scikit-learn's digits with the slim
client (``dpss-client``) in about a dozen lines. ``tests/client/test_digits_notebook.py`` runs
the code cells of the committed file against a live service, so the notebook cannot rot; this
script rewrites the file, outputs included, from a real run:

    DPSS_URL=http://127.0.0.1:8000 DPSS_OWNER_KEY=... DPSS_ANALYST_KEY=... \\
        python -m scripts.digits_notebook docs/notebooks/digits_pca.ipynb
    python -m scripts.digits_notebook --record    # starts its own dpss serve and keys

The service must run with the product's defaults (no ``DPSS_DEFAULT_ACCOUNTING``; the test
suite's is ``basic``): the test compares every recorded output with a run up to ids and noise
(``scripts.docs_sessions.normalise``), and ``scripts.docs_sessions.serve`` starts such a service.

The runner executes code cells in order in one namespace, as a kernel would: what a cell prints
is a ``stream`` output, and the value of a final expression (if not ``None``) an
``execute_result``, as in Jupyter.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

NOTEBOOK = Path(__file__).resolve().parents[1] / "docs" / "notebooks" / "digits_pca.ipynb"

#: (cell type, source) in order.
CELLS: list[tuple[str, str]] = [
    (
        "markdown",
        """# Private PCA of the digits with the slim client

Needs only `pip install ./clients/python scikit-learn` (the client package `dpss-client`, and
scikit-learn for its bundled digits): no server code. The service's URL and two API keys come
from the environment: `DPSS_URL`, `DPSS_OWNER_KEY` (the data owner) and `DPSS_ANALYST_KEY`.

The first cell is the data owner's, done once: upload the 1,797 digits (8 x 8 pixels), each row
divided by its own norm. That map looks at one row at a time (neighbouring datasets stay
neighbours), and every row then has norm 1, the public `row_norm_bound` the mechanisms clip to.""",
    ),
    (
        "code",
        """import os
import numpy as np
from sklearn.datasets import load_digits
from api_schemas.figures import shown
from dpss_client import Client, PrivatePCA

X = load_digits().data
X = X / np.linalg.norm(X, axis=1, keepdims=True)
owner = Client(os.environ["DPSS_URL"], os.environ["DPSS_OWNER_KEY"])
owner.upload(X, name="digits", epsilon_budget="3", delta_budget="1e-5", row_norm_bound=1.0).id""",
    ),
    (
        "markdown",
        """The analyst's side: find the dataset, preview what a release would buy (charged nothing),
then release 10 components of the **centred** data at epsilon 2 (a private mean takes 20% of
it), and project rows the analyst holds (here the public copy of the digits).""",
    ),
    (
        "code",
        """dpss = Client(os.environ["DPSS_URL"], os.environ["DPSS_ANALYST_KEY"])
digits = next(d for d in dpss.datasets() if d.name == "digits")
print(digits.id, digits.n_rows, "x", digits.n_cols, shown(digits.budget.epsilon_total))""",
    ),
    (
        "code",
        """preview = dpss.preview_release(digits.id, "analyze_gauss", 10, "2", "1e-6",
                               center="private")
print(f"affordable: {preview.affordable}", *preview.meaning, sep="\\n")""",
    ),
    (
        "code",
        """pca = PrivatePCA(dpss, digits.id, n_components=10, epsilon="2", delta="1e-6",
                 center="private", timeout=300).fit()
Z = pca.transform(X)
print(Z.shape, "explained variance ratio", pca.explained_variance_ratio_.round(3))""",
    ),
    (
        "markdown",
        """The ratios come from a fresh private estimate, made after the components were chosen, of
the variance each released component captures (part of the same release and its budget): each
is in [0, 1], they sum to at most 1, and `pca.explained_variance_ratio_interval_` is a 90%
interval for their sum. They stay noisy, and a component buried in the noise reads 0. How good
is the private subspace? On the analyst's public copy (an evaluation only public data allows):
the share of the centred digits' variance it keeps, against 0.745 for exact (non-private) PCA
with 10 components.""",
    ),
    (
        "code",
        """Xc, V = X - X.mean(axis=0), pca.components_.T
print("variance kept", round(np.linalg.norm(Xc @ V) ** 2 / np.linalg.norm(Xc) ** 2, 3))""",
    ),
    (
        "markdown",
        """The release, found again in the analyst's history, and the budget it spent: stated in
epsilon at the dataset's delta, 4 significant digits rounded up (`shown`; the exact decimal is
`dpss.budget(digits.id).epsilon_spent`). The dataset has the default accounting, `hybrid`,
whose Gaussian-DP filter charges the release its mu (`dpss.budget(digits.id).mu_spent`): one
release of epsilon 2 amounts to a little less than 2 at the dataset's delta (docs/mechanisms.md,
"Reading a budget").""",
    ),
    (
        "code",
        """r = next(r for r in dpss.list_releases(dataset_id=digits.id) if r.id == pca.release_id_)
print(r.mechanism, r.status, "spent", shown(dpss.budget(digits.id).epsilon_spent, up=True))""",
    ),
]


def code_cells(path: Path = NOTEBOOK) -> list[str]:
    """The source of every code cell of the notebook file, in order."""
    notebook = json.loads(path.read_text())
    return ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]


def run_cell(source: str, namespace: dict[str, Any]) -> list[dict[str, Any]]:
    """Execute one cell in ``namespace``; its outputs in nbformat 4 form (exceptions propagate)."""
    tree = ast.parse(source)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    printed = io.StringIO()
    value = None
    with contextlib.redirect_stdout(printed):
        exec(compile(tree, "<cell>", "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
    outputs: list[dict[str, Any]] = []
    if printed.getvalue():
        outputs.append({"output_type": "stream", "name": "stdout", "text": printed.getvalue()})
    if value is not None:
        outputs.append(
            {
                "output_type": "execute_result",
                "data": {"text/plain": repr(value)},
                "metadata": {},
                "execution_count": None,
            }
        )
    return outputs


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def build() -> dict[str, Any]:
    """Run the cells against the service named by the environment; the notebook, with outputs."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    cells: list[dict[str, Any]] = []
    count = 0
    for index, (kind, source) in enumerate(CELLS):
        # nbformat 4.5 cell ids: stable, so that a rewrite changes only what ran differently.
        cell_id = f"cell-{index}"
        if kind == "markdown":
            cells.append(
                {"cell_type": "markdown", "id": cell_id, "metadata": {}, "source": _lines(source)}
            )
            continue
        count += 1
        outputs = run_cell(source, namespace)
        for output in outputs:
            if output["output_type"] == "stream":
                output["text"] = _lines(output["text"])
            else:
                output["execution_count"] = count
        cells.append(
            {
                "cell_type": "code",
                "id": cell_id,
                "execution_count": count,
                "metadata": {},
                "outputs": outputs,
                "source": _lines(source),
            }
        )
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python", "version": "3.11"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def record(target: Path) -> None:
    """Write the notebook from a run against a fresh ``dpss serve`` with the product's defaults
    (:func:`scripts.docs_sessions.serve`), with an owner and an analyst key made for it."""
    import os
    import shutil
    import tempfile

    import httpx

    from scripts.docs_sessions import ADMIN, serve

    workdir = Path(tempfile.mkdtemp(prefix="dpss-notebook-"))
    server, url = serve(workdir)
    try:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        for role in ("owner", "analyst"):
            made = httpx.post(f"{url}/v1/keys", json={"role": role, "name": role}, headers=admin)
            made.raise_for_status()
            os.environ[f"DPSS_{role.upper()}_KEY"] = made.json()["key"]
        os.environ["DPSS_URL"] = url
        target.write_text(json.dumps(build(), indent=1, ensure_ascii=False) + "\n")
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"wrote {target}")


def main() -> None:
    """``python -m scripts.digits_notebook [path]`` (the service named by ``DPSS_URL`` and the
    keys) or ``python -m scripts.digits_notebook --record [path]`` (a fresh service of its own)."""
    arguments = sys.argv[1:]
    if arguments[:1] == ["--record"]:
        record(Path(arguments[1]) if len(arguments) > 1 else NOTEBOOK)
        return
    target = Path(arguments[0]) if arguments else NOTEBOOK
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(build(), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
