"""analysis/notebooks/pareto_fronts.ipynb runs top to bottom on a generated experiment."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import analysis
from analysis.synthetic import write_synthetic_experiment

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "analysis" / "notebooks" / "pareto_fronts.ipynb"


def test_notebook_is_stored_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None


def test_notebook_draws_the_fronts_of_a_generated_experiment(tmp_path, monkeypatch):
    root = write_synthetic_experiment(tmp_path / "exp", labels=("erm", "relif"), seeds=2)
    monkeypatch.setenv("RELIF_EXPERIMENT", str(root))
    monkeypatch.setenv("RELIF_DELTA", "0.25")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=180,
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    outputs = [cell.outputs for cell in notebook.cells if cell.cell_type == "code"]
    assert any("image/png" in out.get("data", {}) for out in outputs[-1])
    expected = analysis.pareto_means(analysis.audit(analysis.load(root), 0.25))
    front = ", ".join(expected.loc[expected["on_front"], "variant"])
    printed = "".join(out.get("text", "") for out in outputs[2])
    assert f"non-dominated methods: {front}\n" == printed
    table = outputs[2][-1]["data"]["text/plain"]
    assert all(variant in table for variant in expected["variant"])
    assert "δ=0.25 = 0.2500" in "".join(out.get("text", "") for out in outputs[1])


@pytest.mark.parametrize("name", ["RELIF_EXPERIMENT", "RELIF_DELTA", "RELIF_SPLIT"])
def test_notebook_parameters_come_from_the_environment(name):
    source = nbformat.read(NOTEBOOK, as_version=4).cells[1].source
    assert name in source
