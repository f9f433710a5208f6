"""docs/cli.md's recorded sessions are what the service prints (issue 31, item 4): the page's
commands run again against a fresh ``dpss serve`` (``scripts.docs_sessions``) and every output
must match the recorded one up to ids and noise, normalised by the one rule stated in
``scripts/docs_sessions.py``. A change that alters what a command prints fails here until the
page is re-recorded (``python -m scripts.docs_sessions docs/cli.md --write``)."""

from __future__ import annotations

import os
import shutil

import pytest

from scripts.docs_sessions import CLI_DOC, differences, normalise, parse, record


def test_the_normalisation_masks_ids_and_noise_but_not_budgets():
    recorded = (
        "│ id │ 931225ee-12d3-48bc-88e2-af6363a35507 │\n"
        "│ created_at │ 2026-11-22T06:23:24+00:00 │\n"
        "│ eigenvalues │ [1533.75, 1488.45] │\n"
        "│ epsilon │ 1 │ 0.4864 │ 0.5136 │"
    )
    printed = (
        "│ id   │ 0b7d2f1c-3b7a-4c51-9a0e-6f1d0c8e4e55 │\n"
        "│ created_at │ 2026-11-28T22:31:34+00:00 │\n"
        "│ eigenvalues │ [1096.83, 766.243] │\n"
        "│ epsilon │ 1 │ 0.4864 │ 0.5136 │"
    )
    assert normalise(recorded) == normalise(printed)
    assert normalise(recorded) != normalise(printed.replace("0.5136", "0.4"))


@pytest.mark.parametrize(
    ("recorded_id", "printed_id"),
    [("3f0c9a1e", "62774309"), ("62774309", "0b7d2f1c"), ("12345678", "87654321")],
)
def test_a_short_id_is_masked_wherever_it_stands_even_when_all_digits(recorded_id, printed_id):
    template = (
        '8 <time> dataset_created {} {{"n_cols": 10}}\n'
        "key alice ({})\n"
        "│ {}-12d3-48bc │ 0.02839670322092541043506047 │"
    )
    recorded = template.format(recorded_id, recorded_id, recorded_id)
    printed = template.format(printed_id, printed_id, printed_id)
    assert normalise(recorded) == normalise(printed)
    # a decimal's digits and short integers are kept
    assert normalise(recorded) != normalise(recorded.replace("0.0283967", "0.0283968"))
    assert normalise("n_rows 5000") != normalise("n_rows 5001")


def test_numpy_padding_inside_brackets_is_not_a_difference():
    # NumPy pads every element to one width: whether the last is padded depends on the noise.
    recorded = "explained variance ratio [0.137 0.13  0.102 0.02 ]"
    printed = "explained variance ratio [ 0.144 0.134 0.107 0.023]"
    assert normalise(recorded) == normalise(printed)


def test_the_page_has_sessions_to_check():
    page = parse(CLI_DOC.read_text())
    assert len(page.commands) > 30
    assert any("budget_exceeded" in command.recorded for command in page.commands)
    assert page.python_code


@pytest.mark.skipif(
    shutil.which("jq") is None and not os.environ.get("CI"),
    reason="the page's commands use jq (.ci/run installs it; CI never skips this)",
)
def test_every_recorded_output_of_the_cli_page_is_what_the_service_prints():
    page, python_output = record()
    found = differences(page, python_output)
    assert not found, "\n\n".join(found) + "\n\nre-record: python -m scripts.docs_sessions --write"


def test_every_print_of_the_python_flow_is_in_its_recorded_output():
    """Each ``print`` of the flow runs once and prints one line: a print that never ran (an
    ``except`` the request did not reach) shows a branch the reader will not see. The flow's
    ``except BudgetExceededError`` printed nothing: hybrid admitted the request, and spent it."""
    page = parse(CLI_DOC.read_text())
    start, end = page.python_output
    recorded = [line for line in page.text[start:end].splitlines() if line.strip()]
    assert page.python_code.count("print(") == len(recorded), recorded
