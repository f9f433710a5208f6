"""docs/notebooks/digits_pca.ipynb, the issue's done-when task, runs against a live service: its
code cells are read from the committed JSON and executed in order, as a kernel would (no
Jupyter needed), so the notebook cannot rot."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from scripts.digits_notebook import CELLS, NOTEBOOK, code_cells, run_cell
from scripts.docs_sessions import normalise
from service.config import Settings
from tests.client.conftest import LiveService


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The product's default accounting (the test suite's is basic), as the notebook was
    recorded with: its printed budget is compared with the recorded one."""
    default = Settings.model_fields["default_accounting"].default
    return settings.model_copy(update={"default_accounting": default})


def test_the_committed_notebook_is_the_generators_with_outputs_of_a_run() -> None:
    notebook = json.loads(NOTEBOOK.read_text())
    assert notebook["nbformat"] == 4
    assert code_cells() == [source for kind, source in CELLS if kind == "code"]
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert all(cell["outputs"] for cell in code), "a code cell without the output of a real run"
    assert [cell["execution_count"] for cell in code] == list(range(1, len(code) + 1))
    # About a dozen lines for the analyst (the first cell is the owner's upload).
    assert sum(len(source.splitlines()) for source in code_cells()[1:]) <= 14


@pytest.mark.parametrize("backend", ["sqlite"])  # the client's flow, not the database's
def test_the_notebook_runs_against_a_live_service(
    live_service: LiveService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPSS_URL", live_service.url)
    monkeypatch.setenv("DPSS_OWNER_KEY", live_service.owner_key)
    monkeypatch.setenv("DPSS_ANALYST_KEY", live_service.analyst_key)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    printed = []
    for source in code_cells():
        outputs = run_cell(source, namespace)
        printed.append("".join(o.get("text", "") for o in outputs))

    pca, digits, preview = namespace["pca"], namespace["digits"], namespace["preview"]
    assert (digits.n_rows, digits.n_cols) == (1797, 64)
    assert preview.affordable and preview.meaning
    assert pca.components_.shape == (10, 64) and namespace["Z"].shape == (1797, 10)
    assert pca.explained_variance_ratio_ is not None
    assert "(1797, 10) explained variance ratio" in printed[3]
    # The centred private subspace keeps about half of the variance (0.51 in the committed run,
    # 0.745 for exact PCA); far below would mean the centring or the release went wrong.
    assert float(printed[4].split()[-1]) > 0.35
    assert np.allclose(pca.mean_, namespace["X"].mean(axis=0), atol=0.1)
    # Found again in the history, and charged once.
    assert namespace["r"].id == pca.release_id_
    # PrivatePCA asks for `auto`, which runs analyze_gauss at d = 64 (below n^(2/3)).
    assert "auto succeeded" in printed[5]
    budget = namespace["dpss"].budget(digits.id)
    product_default = Settings.model_fields["default_accounting"].default
    # Two releases of epsilon 1 each: charged both, composed at most as a sum would (under
    # hybrid's Gaussian-DP filter, 1.76 at the dataset's delta).
    assert budget.accounting == product_default and 1.5 < float(budget.epsilon_spent) <= 2
    # Every recorded output is what this run printed, up to ids and noise (the one rule of
    # scripts/docs_sessions.py): a change to what the service prints fails here.
    notebook = json.loads(NOTEBOOK.read_text())
    recorded = [
        "".join("".join(o["text"]) for o in cell["outputs"] if o["output_type"] == "stream")
        for cell in notebook["cells"]
        if cell["cell_type"] == "code"
    ]
    assert [normalise(text) for text in recorded] == [normalise(text) for text in printed]
