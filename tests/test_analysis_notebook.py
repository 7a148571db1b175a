"""analysis/notebooks/explore_experiment.ipynb runs top to bottom from its own folder (as
Jupyter starts it) on a generated experiment and shows every view it promises."""

from __future__ import annotations

import json
import re
import runpy
import tempfile
from pathlib import Path
from types import SimpleNamespace

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

from relif_ray import analysis
from relif_ray.analysis.breakdown import OVERALL, by_pair
from relif_ray.analysis.figures import (
    controller_grid,
    controller_grid_figure,
    controller_variants,
)
from relif_ray.analysis.fronts import hypervolume_table
from relif_ray.analysis.groups import GroupOptions
from relif_ray.analysis.interfaces import interface_table
from relif_ray.analysis.tables import CISettings
from relif_ray.data.synthetic_eicu import write_synthetic_eicu
from relif_ray.testing.synthetic_experiment import (
    DEMO_EXPERIMENT,
    example_experiment,
    write_synthetic_experiment,
)
from tests.conftest import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "analysis" / "notebooks" / "explore_experiment.ipynb"


BANNER = "RELIF_EXPERIMENT is not set: this notebook shows "
"""The start of the banner the notebook shows when it falls back to another experiment."""


def run_notebook(
    environment: dict[str, str],
    monkeypatch,
    code_cells: int | None = None,
    only: list[int] | None = None,
) -> list[list[dict]]:
    """Execute the notebook (its first `code_cells` code cells, or the code cells numbered in
    `only`; all by default) with its own folder as the working folder; the outputs of each
    code cell run."""
    for name in (
        "RELIF_EXPERIMENT", "RELIF_DELTA", "RELIF_SPLIT", "RELIF_ATTRIBUTES",
        "RELIF_CONTROLLER_GRID",
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [i for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"]
    if code_cells is not None:
        notebook.cells = notebook.cells[: code[code_cells - 1] + 1]
    if only is not None:
        notebook.cells = [notebook.cells[code[number]] for number in only]
    NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=HANG_GUARD_S,
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    ).execute()
    return [cell.outputs for cell in notebook.cells if cell.cell_type == "code"]


def images(outputs: list[dict]) -> int:
    return sum("image/png" in out.get("data", {}) for out in outputs)


def text(outputs: list[dict]) -> str:
    return "".join(out.get("text", "") for out in outputs)


def shown(outputs: list[dict]) -> str:
    """Everything a cell shows: printed text and displayed Markdown or plain text."""
    data = [out.get("data", {}) for out in outputs]
    return text(outputs) + "".join(d.get("text/markdown", d.get("text/plain", "")) for d in data)


def test_notebook_is_stored_with_the_demos_outputs():
    """It opens with its tables and figures shown: docs/figures/make_figures.py executed every
    code cell, top to bottom, on the demo's experiment (no banner, no error), after its last
    edit (the outputs belong to the cells as they are: one execution per cell, in order)."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
    assert text(code[0].outputs).startswith("experiment: ")
    assert text(code[0].outputs).rstrip().endswith("nyuv2-demo")
    assert BANNER not in shown(code[0].outputs)
    assert not any(out.get("output_type") == "error" for cell in code for out in cell.outputs)
    assert sum(images(cell.outputs) for cell in code) >= 8  # the figures are shown
    stored = json.dumps([cell.outputs for cell in code])
    assert "/tmp/" not in stored and tempfile.gettempdir() + "/" not in stored


def test_the_stored_outputs_name_the_demos_folder_in_the_repository(tmp_path):
    """docs/figures/make_figures.py runs the demo and the controller grid in a temporary
    folder; the outputs it stores show each experiment where its sweep writes it in the
    repository, in every text output."""
    make_figures = runpy.run_path(str(REPO / "docs" / "figures" / "make_figures.py"))
    experiment = tmp_path / "results" / "nyuv2-demo"
    grid = tmp_path / "results" / "nyuv2-controller-grid"
    notebook = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print(EXPERIMENT)")
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text=f"experiment: {experiment}\n"),
        nbformat.v4.new_output("display_data", data={"text/plain": f"{experiment}/a",
                                                     "text/markdown": f"`{experiment}` {grid}"}),
    ]  # fmt: skip
    notebook.cells = [cell]
    where = {experiment: DEMO_EXPERIMENT, grid: make_figures["GRID_EXPERIMENT"]}
    shown = make_figures["shown_as_in_the_repository"](notebook, where)
    outputs = shown.cells[0].outputs
    assert outputs[0]["text"] == f"experiment: {DEMO_EXPERIMENT}\n"
    assert outputs[1]["data"] == {
        "text/plain": f"{DEMO_EXPERIMENT}/a",
        "text/markdown": f"`{DEMO_EXPERIMENT}` relif-results/nyuv2-controller-grid",
    }


def heatmap_cells(outputs: list[dict]) -> dict[tuple[str, float, float], tuple[float, ...]]:
    """The heatmaps' cells the notebook's section 5 shows as a table under its figure (the
    DataFrame's plain text): (label, r*, eta) -> (mean Bias, mean Worst, seeds)."""
    lines = outputs[-1]["data"]["text/plain"].splitlines()
    assert lines[0].split() == ["label", "r_star", "eta", "bias", "worst", "n_seeds"]
    rows = [line.split()[1:] for line in lines[1:]]
    return {
        (label, float(r_star), float(eta)): (float(bias), float(worst), int(seeds))
        for label, r_star, eta, bias, worst, seeds in rows
    }


def means_over_seeds(rows: list[tuple[tuple, float, float]]) -> dict[tuple, tuple[float, ...]]:
    """Per setting, the mean Bias, mean Worst and number of (setting, Bias, Worst) rows."""
    settings: dict[tuple, list[tuple[float, float]]] = {}
    for setting, bias, worst in rows:
        settings.setdefault(setting, []).append((bias, worst))
    return {
        setting: (
            sum(bias for bias, _ in values) / len(values),
            sum(worst for _, worst in values) / len(values),
            len(values),
        )
        for setting, values in settings.items()
    }


def test_the_stored_heatmaps_are_the_controller_grids_means_over_seeds():
    """The stored section 5 shows the controller grid's experiment (docs/figures/
    controller_grid.json, which make_figures.py wrote from the same run), not the demo's single
    setting: a cell per (r*, eta) of its grid, each the mean over its seeds of the per-trial
    Bias@delta_p75 and Worst that the record holds (averaged here), at the grid's delta_ref."""
    record = json.loads((REPO / "docs" / "figures" / "controller_grid.json").read_text())
    grid = record["grid"]
    assert len(grid["r_star"]) >= 3 and len(grid["eta"]) >= 3 and grid["seeds"] >= 2
    rows = [
        (("relif", trial["r_star"], trial["eta"]), trial["bias"], trial["worst"])
        for trial in record["trials"]
        if trial["label"] == "relif"
    ]
    expected = means_over_seeds(rows)
    assert {(f"{r:g}", f"{eta:g}") for _, r, eta in expected} == {
        (f"{r:g}", f"{eta:g}") for r in grid["r_star"] for eta in grid["eta"]
    }
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    section = code[8].outputs
    delta = record["delta_ref"]
    assert text(section) == (
        f"controller grid: relif-results/nyuv2-controller-grid "
        f"({delta['symbol']} = {delta['value']:.4f})\n"
    )
    assert images(section) == 1
    shown = heatmap_cells(section)
    assert shown.keys() == expected.keys() and len(shown) >= 9
    for setting, (bias, worst, seeds) in expected.items():
        assert shown[setting][2] == seeds == grid["seeds"]
        assert shown[setting][:2] == pytest.approx((bias, worst), abs=1e-6)


GRID_SETTINGS = [(r_star, eta) for r_star in (0.2, 0.24, 0.28) for eta in (1e-4, 1e-3, 1e-2)]
"""The (r*, eta) grid of the controller-grid experiment, in the order its writer writes it."""


@pytest.fixture(scope="module")
def grid_and_groups(tmp_path_factory) -> SimpleNamespace:
    """One execution of the notebook's first two code cells, section 5 and section 6 on a
    generated eICU experiment (RELIF_EXPERIMENT) with its patient attributes
    (RELIF_ATTRIBUTES) and a generated NYUv2 controller grid (RELIF_CONTROLLER_GRID): the
    heatmaps' test and the group tables' test read its outputs (`cells`: section 5's, then
    section 6's)."""
    tmp_path = tmp_path_factory.mktemp("grid_and_groups")
    experiment = write_synthetic_experiment(
        tmp_path / "exp", labels=("erm", "relif"), seeds=2, dataset="eicu", n_examples=120
    )
    grid = write_synthetic_experiment(
        tmp_path / "grid", labels=("erm", "relif"), seeds=2, controller_grid=GRID_SETTINGS
    )
    attributes = write_synthetic_eicu(tmp_path / "eicu", patients=120, seed=0)
    environment = {
        "RELIF_EXPERIMENT": str(experiment),
        "RELIF_ATTRIBUTES": str(attributes),
        "RELIF_CONTROLLER_GRID": str(grid),
    }
    cells = nbformat.read(NOTEBOOK, as_version=4).cells
    group_cell = sum(cell.cell_type == "code" for cell in cells) - 1
    with pytest.MonkeyPatch.context() as monkeypatch:
        outputs = run_notebook(environment, monkeypatch, only=[0, 1, 8, group_cell])
    return SimpleNamespace(
        experiment=experiment, grid=grid, attributes=attributes, cells=outputs[2:]
    )


@pytest.mark.slow
def test_the_heatmaps_show_the_named_controller_grid_experiment(grid_and_groups):
    """With RELIF_CONTROLLER_GRID set, section 5 audits that experiment (here a NYUv2 grid
    beside an eICU RELIF_EXPERIMENT): its heatmaps' cells (the figure's images and the table
    under it) are, per (r*, eta), the means over seeds of the grid's per-trial Bias@delta_p75
    and Worst, each trial's setting known from the order the writer writes them in (ERM's
    seeds first, then each setting's seeds)."""
    settings, root = GRID_SETTINGS, grid_and_groups.grid
    outputs = grid_and_groups.cells[0]
    results = analysis.audit(analysis.load(root))
    rows = []
    for row in results.per_trial.itertuples():
        index = int(row.trial.rsplit("_", 1)[1])
        if row.label == "relif":
            setting = ("relif", *settings[(index - 2) // 2])
            rows.append((setting, row.bias_p75, row.worst))
    expected = means_over_seeds(rows)
    assert len(expected) == 9
    assert text(outputs) == f"controller grid: {root} (δ_p75 = {results.primary.value:.4f})\n"
    shown = heatmap_cells(outputs)
    assert shown.keys() == expected.keys()
    for setting, (bias, worst, seeds) in expected.items():
        assert shown[setting][2] == seeds == 2
        assert shown[setting][:2] == pytest.approx((bias, worst), abs=1e-6)
    bias_image, worst_image = (ax.images[0].get_array() for ax in
                               controller_grid_figure(results).axes if ax.images)  # fmt: skip
    r_stars, etas = sorted({r for r, _ in settings}), sorted({eta for _, eta in settings})
    for i, j in np.ndindex(3, 3):
        bias, worst, _ = expected[("relif", r_stars[i], etas[j])]
        assert bias_image[i, j] == pytest.approx(bias) and worst_image[i, j] == pytest.approx(worst)


@pytest.mark.slow
def test_notebook_shows_every_view_of_a_generated_experiment(tmp_path, monkeypatch):
    root = write_synthetic_experiment(
        tmp_path / "exp",
        labels=("erm", "relif", "pcgrad+relif"),
        seeds=2,
        splits=("val", "test"),
        controller_grid=((0.2, 1e-3), (0.28, 1e-3)),
    )
    outputs = run_notebook({"RELIF_EXPERIMENT": str(root), "RELIF_DELTA": "0.25"}, monkeypatch)
    experiment = analysis.load(root)
    results = analysis.audit(experiment, 0.25)
    assert text(outputs[0]) == f"experiment: {root}\n" and BANNER not in shown(outputs[0])
    assert "δ=0.25 = 0.2500" in text(outputs[1])
    expected = analysis.pareto_means(results)
    front = ", ".join(expected.loc[expected["on_front"], "variant"])
    assert text(outputs[2]) == f"non-dominated methods: {front}\n"
    assert all(variant in outputs[2][-1]["data"]["text/plain"] for variant in expected["variant"])
    assert images(outputs[3]) == 1  # Pareto front
    beside = outputs[4][-1]["data"]["text/html"]  # the front beside the verdicts over seeds
    front = analysis.front_with_verdicts(results)
    assert list(front.columns)[-3:] == ["front_share", "bias_vs_erm", "worst_vs_erm"]
    for row in front.itertuples():
        assert f"<td>{row.bias_vs_erm}</td>" in beside and f"{row.front_share:.3f}" in beside
    assert "not shown with 2 seeds" in beside and "reference" in beside
    assert images(outputs[5]) == 2  # delta sensitivity and the rank shift
    interfaces = interface_table(results, CISettings(n_boot=0)).markdown()
    assert shown(outputs[6]) == interfaces  # the audit-interface check, cut over seeds
    hypervolume = hypervolume_table(results).markdown()
    assert hypervolume in shown(outputs[7])  # hypervolume, then Delta-M% with its verdict
    delta_m = results.per_trial.groupby("variant", sort=False)["delta_m"].mean()
    assert all(f"{value:.6f}" in outputs[7][-1]["data"]["text/html"] for value in delta_m)
    assert images(outputs[8]) == 1  # controller sensitivity heatmaps over (r*, eta)
    grid = controller_grid(results)
    assert set(grid.index.get_level_values("label")) == {"relif", "pcgrad+relif"}
    assert len(grid) == 4 and (grid["n_seeds"] == 2).all()
    assert images(outputs[9]) == 1  # learning curves
    assert images(outputs[10]) == len(controller_variants(experiment)) == 4
    table = outputs[11][-1]["data"]["text/html"]
    pairs = by_pair(results)
    assert all(f"<th>{pair}</th>" in table for pair in pairs.index)
    assert f"{pairs.loc[OVERALL].iloc[0]:.6f}" in table
    assert images(outputs[12]) == 1  # Bias per task pair
    assert images(outputs[13]) == 1  # score distributions
    assert shown(outputs[14]) == "Group fairness skipped: nyuv2: no patient attributes to audit."


def test_the_notebook_shows_the_group_tables_of_the_api(grid_and_groups):
    """Section 6 on a generated eICU experiment shows the tables `relif_ray.analysis.group_tables`
    gives (what the report writes), adjusted over the report's family (`analysis.report_family`);
    without an attribute folder the audit says in one line that the
    trials' data folder is not here."""
    root, attributes = grid_and_groups.experiment, grid_and_groups.attributes
    experiment = analysis.load(root)
    groups = analysis.group_audit(experiment, "val", GroupOptions(str(attributes)))
    settings = analysis.AuditSettings(pool_size=256, pairs=4096, pair_seed=42)  # the notebook's
    adjusted = analysis.report_family(analysis.audit(experiment, settings=settings), groups)
    tables = analysis.group_tables(adjusted.groups, adjusted.family)
    assert [table.name for table in tables] == [
        "groups_mortality", "groups_length_of_stay", "group_disparities",
    ]  # fmt: skip
    assert groups.per_trial["compared"].max() >= 2  # some disparities are numbers
    assert analysis.group_audit(experiment).skipped.startswith(
        "eicu: the trials' data folder is not readable here (/synthetic/all_data.csv: not found"
    )
    outputs = grid_and_groups.cells[1]
    displayed = [out["data"]["text/markdown"] for out in outputs]
    assert displayed == [f"**{table.title}**\n\n{table.markdown()}" for table in tables]


@pytest.mark.slow
def test_without_an_experiment_the_notebook_says_what_it_shows_instead(monkeypatch):
    """Without RELIF_EXPERIMENT the first code cell falls back to the demo sweep's experiment
    or a generated one, and a banner in its output says so."""
    first = run_notebook({}, monkeypatch, code_cells=1)[0]
    banner = shown(first)
    assert f"**{BANNER}" in banner, banner
    assert "the demo sweep's experiment" in banner or "a GENERATED experiment" in banner
    assert "RELIF_EXPERIMENT=/path/to/experiment" in banner


def test_the_notebook_has_an_install_extra_and_a_documented_launch_command():
    extra = re.search(r"^notebook = \[(.*)\]$", (REPO / "pyproject.toml").read_text(), re.M)
    assert '"jupyterlab>=' in extra.group(1) and '"ipykernel>=' in extra.group(1)
    launch = f"jupyter lab {NOTEBOOK.relative_to(REPO)}"
    assert "RELIF_EXPERIMENT=$PWD/relif-results/nyuv2-demo " + launch in (
        (REPO / "docs" / "analysis.md").read_text()
    )


def test_without_an_experiment_the_notebook_uses_a_generated_one(tmp_path):
    generated = Path(example_experiment(repository=tmp_path, scratch=tmp_path))
    assert generated.name == "nyuv2-generated" and not (tmp_path / DEMO_EXPERIMENT).exists()
    assert len(analysis.load(generated).trials) == 12
    (tmp_path / DEMO_EXPERIMENT).mkdir(parents=True)
    assert example_experiment(tmp_path, tmp_path) == str(tmp_path / DEMO_EXPERIMENT)


@pytest.mark.parametrize(
    "name", ["RELIF_EXPERIMENT", "RELIF_DELTA", "RELIF_SPLIT", "RELIF_CONTROLLER_GRID"]
)
def test_notebook_parameters_come_from_the_environment(name):
    source = nbformat.read(NOTEBOOK, as_version=4).cells[1].source
    assert name in source


def test_the_docs_say_what_the_stored_heatmaps_show():
    """docs/analysis.md names the stored heatmaps' grid, seeds, steps, trials and the time,
    machine and load of their run as docs/figures/controller_grid.json records them."""
    record = json.loads((REPO / "docs" / "figures" / "controller_grid.json").read_text())
    grid = record["grid"]
    docs = " ".join((REPO / "docs" / "analysis.md").read_text().split())
    r_stars, etas = (", ".join(f"{value:g}" for value in grid[key]) for key in ("r_star", "eta"))
    assert f"ReLiF at r* in {{{r_stars}}} x eta in {{{etas}}}" in docs
    assert f"{grid['seeds']} seeds of {grid['steps']} steps per setting" in docs
    assert (
        f"{len(record['trials'])} trials in {record['sweep_s']} s on {record['machine']} (load "
        f"average {record['load_average_start']} before, {record['load_average_end']} after; "
        f"commit {record['commit']}, {record['date']})" in docs
    )
    cells: dict[tuple, list[dict]] = {}
    for trial in record["trials"]:
        if trial["label"] == "relif":
            cells.setdefault((trial["r_star"], trial["eta"]), []).append(trial)

    def spread(metric: str) -> str:
        apart = [max(t[metric] for t in c) - min(t[metric] for t in c) for c in cells.values()]
        means = [sum(t[metric] for t in c) / len(c) for c in cells.values()]
        return (
            f"seeds {min(apart):.2f} to {max(apart):.2f} apart, {len(cells)} cell means "
            f"{min(means):.2f} to {max(means):.2f}"
        )

    assert f"Bias: {spread('bias')}; Worst: {spread('worst')}" in docs
    erm = " and ".join(f"{t['bias']:.2f}" for t in record["trials"] if t["label"] == "erm")
    assert f"ERM's two seeds have Bias {erm}" in docs
    assert f"Its delta_p75 ({record['delta_ref']['value']:.4f})" in docs
