"""The benchmark suite's own logic: interval arithmetic, verdicts, the audit reference loop and
the rows `benchmarks/run.py` prints on a machine without a GPU (no timings are asserted), and the
fidelity benchmark's rows against the report's per-trial numbers."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

import analysis

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def load(monkeypatch: pytest.MonkeyPatch):
    """Import a benchmarks/ module by file name, with benchmarks/ on sys.path (as a script)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))

    def importer(name: str):  # noqa: ANN202
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look it up there
        spec.loader.exec_module(module)
        return module

    return importer


def test_ratio_interval_is_the_sign_test_interval(load) -> None:
    timing = load("timing")
    # per-round ratios 0.5, 0.6, ..., 1.4 (n = 10): k = floor(5 - 0.98 sqrt(10)) = 1
    times = {"a": [0.5 + 0.1 * i for i in range(10)], "b": [1.0] * 10}
    median, lower, upper = timing.ratio_with_interval(times, "a", "b")
    assert median == pytest.approx(0.95)
    assert (lower, upper) == (pytest.approx(0.6), pytest.approx(1.3))
    assert timing.verdict_at_most(0.95, 0.6, 1.0) == "pass"
    assert timing.verdict_at_most(1.1, 0.9, 1.0) == "within noise"
    assert timing.verdict_at_most(1.1, 1.05, 1.0) == "FAIL"


def test_interleaved_times_runs_every_variant_each_round(load) -> None:
    timing = load("timing")
    calls: list[str] = []
    steps = {name: (lambda name=name: calls.append(name)) for name in ("x", "y", "z")}
    times = timing.interleaved_times(steps, rounds=4, warmup=1, cuda=False)
    assert {name: len(values) for name, values in times.items()} == {"x": 4, "y": 4, "z": 4}
    assert all(sorted(calls[3 * r : 3 * r + 3]) == ["x", "y", "z"] for r in range(5))
    assert calls[:3] != calls[3:6] or calls[3:6] != calls[6:9]  # the order is shuffled


def test_relif_regularizer_stays_within_its_aten_call_and_kernel_budgets(load) -> None:
    """The regularizer's ATen calls and device kernel launches per forward + backward
    (deterministic for one torch version) stay within the bounds the benchmark states, below
    the counts before the rewrite; the benchmark's rows say so."""
    op_count = load("relif_op_count")
    calls = {setting.name: op_count.aten_calls(setting) for setting in op_count.SETTINGS}
    kernels = {setting.name: op_count.device_kernels(setting) for setting in op_count.SETTINGS}
    for name in ("NYUv2", "clinical"):
        assert calls[name] <= op_count.LIMIT[name] < 0.65 * op_count.BEFORE[name], calls
        assert kernels[name] <= op_count.KERNEL_LIMIT[name] < op_count.KERNELS_BEFORE[name]
    rows = load("relif_op_count_rows").relif_op_count_rows(None)
    assert [(row.value, row.result) for row in rows] == [
        (calls["NYUv2"], "pass"),
        (kernels["NYUv2"], "pass"),
        (calls["clinical"], "pass"),
        (kernels["clinical"], "pass"),
    ]


def test_batch_host_time_times_both_paths_on_nyuv2_shaped_data(load) -> None:
    """NYUv2's shapes and label dtype; both paths timed, the ratio with its interval (no
    timing is asserted)."""
    bench = load("batch_host_time")
    split = bench.nyuv2_shaped_split(16)
    assert split.tensors["image"].shape == (16, 3, 288, 384)
    assert split.tensors["seg"].dtype == torch.int8
    result = bench.measure(examples=16, rounds=2)
    assert set(result) == {"host_s", "device_s", "ratio", "ratio_low", "ratio_high"}
    assert result["host_s"] > 0 and result["device_s"] > 0


def test_python_reference_loop_matches_the_closed_form(load) -> None:
    audit = load("audit_throughput")
    scores = [0.1, 0.5, 0.95]
    # gaps |0.1-0.5| = 0.4, |0.5-0.95| = 0.45, |0.1-0.1| = 0 at delta 0.2
    bias, vr = audit.python_loop_audit(scores, [0, 1, 0], [1, 2, 0], 0.2)
    assert bias == pytest.approx((0.2 + 0.25) / 3) and vr == pytest.approx(2 / 3)
    result = audit.measure(pairs=2**12, repeats=1)  # raises if the loop disagrees
    assert result["pairs"] == 3 * 2**12
    assert np.isfinite([result["pairs_per_s"], result["loop_pairs_per_s"]]).all()


def test_run_prints_rows_with_target_and_result(load, capsys) -> None:
    run = load("run")
    assert run.main(["--quick", "--device", "cpu", "--json", "--only", "packing"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["quick"] and payload["machine"]["cores"] >= 1
    assert [row["name"] for row in payload["rows"]] == [
        f"GPU utilisation, {k} ERM trial(s) packed" for k in (1, 2, 4)
    ]
    assert all(row["result"] == "needs a GPU" and row["value"] is None for row in payload["rows"])


def test_sweep_row_uses_the_module_when_present(load, tmp_path, monkeypatch) -> None:
    sweep = load("sweep_rows")
    context = sweep.Context(quick=True, device=torch.device("cpu"), workdir=tmp_path)
    monkeypatch.setattr(sweep, "SWEEP_EFFICIENCY_MODULE", "no_such_benchmark_module")
    (absent,) = sweep.sweep_rows(context)
    assert (absent.value, absent.result) == (None, "not available")
    (tmp_path / "fake_sweep_efficiency.py").write_text(
        "TARGET = 0.97\n"
        "def measure(trial_seconds):\n"
        "    return {'ratio': 0.85, 'trials': 8, 'mean_trial_s': trial_seconds, 'slots': 2,\n"
        "            'wall_s': 40.0, 'idle_start_s': 6.0, 'idle_between_s': 1.0,\n"
        "            'idle_end_s': 5.0}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sweep, "SWEEP_EFFICIENCY_MODULE", "fake_sweep_efficiency")
    (present,) = sweep.sweep_rows(context)
    assert (present.value, present.target, present.result) == (0.85, ">= 0.97", "FAIL")
    assert "8 trials of 8.0 s on 2 slots" in present.detail
    assert "6.0 before the first trial" in present.detail and "5.0 after the last" in present.detail


def test_trial_worker_reports_throughput_and_its_own_peak_memory(load, tmp_path) -> None:
    workers = load("workers")
    context = workers.Context(quick=True, device=torch.device("cpu"), workdir=tmp_path)
    root = workers.data_root(context, gpu=False)
    config = workers.trial_config(context, root, "relif", gpu=False)
    config["model"] = {"backbone": "resnet18", "head_channels": 8}
    result = workers.run_worker(config, warmup=1, steps=2)
    assert result["steps"] == 2 and result["images_per_s"] > 0
    assert 0 < result["rss_imports_mb"] <= result["peak_rss_mb"]
    assert result["cuda_peak_mb"] is None


def test_trial_worker_times_whole_chunks_of_steps(load, tmp_path) -> None:
    """Steps run in chunks (a device sync between chunks only); the last chunk is cut short."""
    worker = load("trial_worker")
    workers = load("workers")
    context = workers.Context(quick=True, device=torch.device("cpu"), workdir=tmp_path)
    config = workers.trial_config(context, workers.data_root(context, gpu=False), "erm", gpu=False)
    config["model"] = {"backbone": "resnet18", "head_channels": 8}
    training = worker.TrainingRun(worker.ExperimentConfig.from_dict(config))
    chunks = worker.timed_chunks(training, steps=5, seconds=None, chunk=2)
    assert [count for count, _ in chunks] == [2, 2, 1] and training.step == 5
    assert len(training.trace) == 5 and all(seconds > 0 for _, seconds in chunks)


def test_methods_rows_judge_the_representation_mode_and_report_its_cosine(
    load, tmp_path, monkeypatch
) -> None:
    """The representation-mode rows of `run.py`: a step-time ratio judged against 1.3 and the
    update cosine with the exact mode; the rows against TorchJD and LibMTL 1.1.5 (tiny sizes,
    a few methods; no timing is asserted)."""
    methods = load("methods_step_time")
    measure = methods.measure

    def tiny(device: str, quick: bool = False, **_: object):  # noqa: ANN202
        picked = ["gradnorm", "pcgrad", "dwa", "famo", "nashmtl"]
        return measure(device, quick, rounds=2, cosine_steps=3, methods=picked)

    monkeypatch.setattr(methods, "measure", tiny)
    monkeypatch.setitem(sys.modules, "methods_step_time", methods)
    section = load("methods_rows")
    context = section.Context(quick=True, device=torch.device("cpu"), workdir=tmp_path)
    rows = section.methods_rows(context)
    by_name = {row.name: row for row in rows}
    for name in ("gradnorm", "pcgrad"):
        timed = by_name[f"{name}-representation / ERM step time"]
        assert timed.target == "<= 1.3" and timed.result in {"pass", "within noise", "FAIL"}
        assert timed.value > 0
        cosine = by_name[f"{name}-representation update cosine with exact"]
        assert -1.0 <= cosine.value <= 1.0 + 1e-6
    # GradNorm's first step is exact in both modes (w = 1): the cosine is 1
    assert "first 1.0000" in by_name["gradnorm-representation update cosine with exact"].detail
    for name, package in [("dwa", "libmtl-dwa"), ("nashmtl", "torchjd-nashmtl")]:
        compared = by_name[f"{name} / {package} step time"]
        assert compared.target == "<= 1.0" and compared.value > 0
    assert "famo / ERM step time" in by_name and not any(
        n.startswith("famo /") and "libmtl" in n for n in by_name
    )


def test_fidelity_compares_each_label_with_the_same_seed_erm_trial(load) -> None:
    fidelity = load("fidelity")
    trials = pd.DataFrame(
        {
            "label": ["erm", "erm", "relif", "relif"],
            "seed": [0, 1, 1, 0],
            "bias_p75": [0.4, 0.2, 0.05, 0.1],
            "worst": [0.3, 0.5, 0.48, 0.31],
        }
    )
    assert fidelity.compare(trials, "relif", "bias_p75", ratio=True) == pytest.approx(
        {0: 0.25, 1: 0.25}
    )
    assert fidelity.compare(trials, "relif", "worst", ratio=False) == pytest.approx(
        {0: 0.01, 1: -0.02}
    )


def test_run_reaches_fidelity_only_when_named(load, monkeypatch, capsys) -> None:
    run = load("run")
    assert "fidelity" in run.SECTIONS and "fidelity" not in run.DEFAULT_SECTIONS
    sizes = []

    def rows(size, workdir):  # noqa: ANN001, ANN202
        sizes.append(size)
        return [run.Row("fidelity", "stub", 0.25, "x", "<= 0.5", "pass", "", {0: 0.25})]

    stub = SimpleNamespace(QUICK="quick size", FULL="full size", fidelity_rows=rows)
    monkeypatch.setitem(sys.modules, "fidelity", stub)
    assert run.main(["--quick", "--device", "cpu", "--json", "--only", "fidelity"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert sizes == ["quick size"]
    assert payload["rows"][0]["per_seed"] == {"0": 0.25}


@pytest.mark.slow
def test_fidelity_quick_rows_recompute_from_the_reports_per_trial_csv(
    load, ray_session, tmp_path
) -> None:
    """The --quick size end to end through the real sweep and report: every row recomputed
    from the report's per_trial.csv and interface_per_trial.csv, every target applied."""
    fidelity = load("fidelity")
    size = fidelity.QUICK
    rows = fidelity.fidelity_rows(size, tmp_path)
    trials = pd.read_csv(tmp_path / "report" / "per_trial.csv")
    interfaces = pd.read_csv(tmp_path / "report" / "interface_per_trial.csv")
    assert sorted(trials["label"]) == ["erm", "relif", "relif-st"] == sorted(size.labels + ("erm",))
    erm = trials[trials["label"] == "erm"].set_index("seed")
    by_name = {row.name: row for row in rows}
    assert len(rows) == 1 + 8 * len(size.labels)
    traces = analysis.load(tmp_path / "results" / "fidelity").traces
    clip_columns = ["clip0_depth", "clip0_normal", "clip1_depth", "clip1_normal"]
    for label in size.labels:
        trial = trials[trials["label"] == label].set_index("seed")
        paper = by_name[f"Bias@delta_p75 {label} / ERM (a) q10-q90"]
        assert paper.per_seed == pytest.approx((trial["bias_p75"] / erm["bias_p75"]).to_dict())
        for interface, letter in (("q1-q99", "(b)"), ("ecdf", "(c)")):
            rows_of = interfaces[interfaces["interface"] == interface].set_index("trial")
            mine = rows_of.loc[trial["trial"], "bias"].to_numpy()
            reference = rows_of.loc[erm.loc[trial.index, "trial"], "bias"].to_numpy()
            bias = by_name[f"Bias@delta_p75 {label} / ERM {letter} {interface}"]
            assert list(bias.per_seed.values()) == pytest.approx(list(mine / reference))
            assert bias.value == pytest.approx(np.mean(list(bias.per_seed.values())))
        vr = by_name[f"VR@delta_p75 {label} / ERM"]
        assert vr.per_seed == pytest.approx((trial["vr_p75"] / erm["vr_p75"]).to_dict())
        worst = by_name[f"Worst {label} - ERM"]
        assert worst.per_seed == pytest.approx((trial["worst"] - erm["worst"]).to_dict())
        macro = by_name[f"Macro {label} - ERM"]
        assert macro.per_seed == pytest.approx((trial["macro"] - erm["macro"]).to_dict())
        # each row ends with the report's verdict over seeds: with one seed, nothing is shown
        assert paper.detail.endswith("over seeds: not shown with 1 seed")
        assert "; over seeds: not shown with 1 seed, " in vr.detail
        for row in (worst, macro):
            assert "; over seeds: not shown either way with 1 seed, " in row.detail
        at_bound = by_name[f"share of {label} steps with lambda at a bound"]
        lam = traces[traces["trial"].isin(trial["trial"])]["lambda"]
        assert at_bound.value == pytest.approx(float(((lam <= 0.01) | (lam >= 1.0)).mean()))
        clipped = by_name[f"clipped shares {label} - ERM (largest)"]
        difference = trial[clip_columns] - erm.loc[trial.index, clip_columns]
        assert clipped.per_seed == pytest.approx(difference.max(axis=1).to_dict())
        assert clipped.value == pytest.approx(difference.mean().max())
    judged = {row.name: row for row in rows if row.result in ("pass", "FAIL")}
    bounds = {
        "Bias@delta_p75 relif / ERM (a) q10-q90": ("<=", 0.5),
        "Worst relif - ERM": (">=", -0.02),
        "Macro relif - ERM": (">=", -0.02),
        "Bias@delta_p75 relif-st / ERM (a) q10-q90": ("<=", 0.35),
        "Bias@delta_p75 relif-st / ERM (c) ecdf": ("<=", 0.35),
        "clipped shares relif-st - ERM (largest)": ("<=", 0.05),
        "Worst relif-st - ERM": (">=", -0.02),
    }
    assert set(judged) == set(bounds)
    for name, (comparison, bound) in bounds.items():
        value = judged[name].value
        passed = value <= bound if comparison == "<=" else value >= bound
        assert judged[name].result == ("pass" if passed else "FAIL"), name
    report = (tmp_path / "report" / "report.md").read_text()
    section = report[report.index("## Audit-interface sensitivity") :]
    assert "| ReLiF-ST | (c) ecdf |" in section and "Skipped" not in section.split("## ")[1]


def test_gpu_check_drift_names_the_largest_difference_and_its_place(load) -> None:
    common = load("gpu_common")
    nan = float("nan")
    pinned = {"trace": [{"a": 1.0, "b": nan}, {"a": -2.0, "b": 0.0}], "n": 4}
    computed = {"trace": [{"a": 1.5, "b": nan}, {"a": -2.0, "b": 0.25}], "n": 4}
    assert {path: (diff, rel) for path, diff, rel in common.drift(pinned, computed)} == {
        "/trace[0]/a": (0.5, 0.5),
        "/trace[0]/b": (0.0, 0.0),  # NaN against NaN: no drift
        "/trace[1]/a": (0.0, 0.0),
        "/trace[1]/b": (0.25, 0.25),  # relative to a pinned 0: the absolute difference
        "/n": (0.0, 0.0),
    }
    assert list(common.drift({"x": nan}, {"x": 1.0})) == [("/x", math.inf, math.inf)]
    with pytest.raises(ValueError, match=r"^/trace: 1 entries, 2 pinned$"):
        list(common.drift(pinned, {"trace": computed["trace"][:1], "n": 4}))
    with pytest.raises(ValueError, match=r"keys \['m'\] differ"):
        list(common.drift({"m": 1.0}, {}))


def test_gpu_check_reports_each_pytest_case(load, tmp_path) -> None:
    cuda = load("gpu_cuda")
    junit = tmp_path / "report.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase name="test_ok" time="0.5"/>'
        '<testcase name="test_bad"><failure message="assert 1 == 2&#10;more">trace</failure>'
        "</testcase>"
        '<testcase name="test_gpu"><skipped message="needs a CUDA device"/></testcase>'
        "</testsuite></testsuites>"
    )
    rows = cuda.pytest_case_rows(junit)
    assert [(row.name, row.result, row.detail) for row in rows] == [
        ("test test_ok", "pass", "0.5 s"),
        ("test test_bad", "FAIL", "assert 1 == 2"),
        ("test test_gpu", "skipped", "needs a CUDA device"),
    ]
    assert [row.result for row in cuda.pytest_case_rows(tmp_path / "none.xml")] == ["FAIL"]


def test_gpu_check_out_of_budget_skips_every_section_and_still_reports(load, tmp_path) -> None:
    check = load("gpu_check")
    assert check.main(["--dry-run", "--out", str(tmp_path), "--budget-s", "0"]) == 0
    payload = json.loads((tmp_path / "gpu_check.json").read_text())
    assert payload["dry_run"] and payload["rows"] == []
    assert [(s["name"], s["status"]) for s in payload["sections"]] == [
        (section.name, "skipped: time budget") for section in check.SECTIONS
    ]
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert "| fidelity | skipped: time budget | 0.0 |" in markdown


def test_gpu_check_time_needs_do_not_follow_the_budget(load, tmp_path) -> None:
    """A step's time on the H100 is the same whatever the budget: a section starts a step only
    when that time is left. The budget sets the caps: a shorter one shrinks them in proportion,
    a longer one leaves them, so its extra time reaches the last sections."""
    check = load("gpu_check")
    assert check.cap_scale(270.0, dry_run=False) == 0.5
    assert check.cap_scale(810.0, dry_run=False) == 1.0
    assert check.cap_scale(1800.0, dry_run=True) == 1800.0 / check.BUDGET_S
    common = load("gpu_common")
    gpu = common.Check(tmp_path, tmp_path, False, time.time() + 100.0, tmp_path / "rows")
    assert gpu.has_time(90.0) and not gpu.has_time(110.0)
    toy = common.Check(tmp_path, tmp_path, True, time.time() + 1.0, tmp_path / "rows")
    assert toy.has_time(1e6)


def test_gpu_check_dry_run_finds_cpu_runs_repeatable(load, tmp_path) -> None:
    """The repeatability section of the dry run end to end: its section process, two trial
    workers and the JSON and Markdown it writes. On a CPU the same seed gives the same numbers
    (deterministic algorithms), so the row must say identical; the cuDNN setting that only
    CUDA has is recorded as skipped."""
    check = load("gpu_check")
    assert check.main(["--dry-run", "--out", str(tmp_path), "--only", "repeatability"]) == 0
    payload = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [(s["name"], s["status"]) for s in payload["sections"]] == [("repeatability", "done")]
    rows = {row["name"]: row for row in payload["rows"]}
    name = "same seed twice, cudnn_benchmark on (default)"
    assert (rows[name]["value"], rows[name]["result"]) == (0.0, "identical")
    assert rows["same seed twice, cudnn_benchmark off"]["result"] == load("gpu_common").NEEDS_CUDA
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert f"| {name} | 0 max \\|diff\\| | - | identical |" in markdown


def test_gpu_bundle_slims_a_wheel_that_pip_still_installs(load, tmp_path) -> None:
    """The slim wheel keeps every other file byte for byte, drops the unused folders and
    source maps, and its RECORD lists exactly what it holds with the right hashes and sizes
    (pip installs it)."""
    bundle = load("gpu_bundle")
    wheel = tmp_path / "ray-0.0.1-py3-none-any.whl"
    files = {
        "ray/__init__.py": b"VERSION = 1\n",
        "ray/core/gcs_server": b"\x7fELF binary",
        "ray/jars/ray_dist.jar": b"java" * 100,
        "ray/dashboard/client/build/main.js": b"ui",
        "ray/dashboard/agent.py": b"AGENT = 1\n",
        "ray/_private/x.js.map": b"map",
        "ray-0.0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: ray\nVersion: 0.0.1\n",
        "ray-0.0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr("ray-0.0.1.dist-info/RECORD", "stale\n")
    before, after = bundle.slim_wheel(wheel, bundle.RAY_UNUSED)
    assert after < before
    kept = ["ray/__init__.py", "ray/core/gcs_server", "ray/dashboard/agent.py"]
    kept += ["ray-0.0.1.dist-info/METADATA", "ray-0.0.1.dist-info/WHEEL"]
    with zipfile.ZipFile(wheel) as archive:
        assert sorted(archive.namelist()) == sorted([*kept, "ray-0.0.1.dist-info/RECORD"])
        assert all(archive.read(name) == files[name] for name in kept)
        record = archive.read("ray-0.0.1.dist-info/RECORD").decode().splitlines()
    assert sorted(record) == sorted(
        [bundle.record_line(name, files[name]) for name in kept] + ["ray-0.0.1.dist-info/RECORD,,"]
    )
    assert bundle.record_line("a", b"") == "a,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0"
    target = tmp_path / "site"
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    subprocess.run([*command, "--target", str(target), str(wheel)], check=True)
    assert (target / "ray" / "dashboard" / "agent.py").read_text() == "AGENT = 1\n"
    assert not (target / "ray" / "jars").exists()


@pytest.mark.parametrize(
    ("command", "kind"),
    [
        ("ray::IDLE", "Ray worker without an actor"),
        ("python /venv/ray/_private/workers/default_worker.py --node-ip-address=127.0.0.1",
         "Ray worker without an actor"),
        ("ray::ResourceTrainable.train", "Ray worker with an actor (trials)"),
        ("ray::DashboardAgent", "Ray services"),
        ("/venv/ray/core/src/ray/raylet/raylet --raylet_socket_name=/tmp/ray/x", "Ray services"),
        (".venv/bin/python sweeps/nyuv2.py --storage /tmp/pytest-of-u/pytest-3", "driver nyuv2.py"),
        ("/v/bin/python /v/bin/relif report exp --out r", "driver relif"),
        (".venv/bin/python -m relif_ray.cli report exp --out r", "driver relif_ray.cli"),
        (".venv/bin/python -m pytest -q", "pytest and its workers"),
        ("/usr/bin/git status", "other"),
    ],
)  # fmt: skip
def test_cpu_by_process_names_the_kind_of_each_process(load, command: str, kind: str) -> None:
    assert load("cpu_by_process").process_kind(command) == kind


def test_cpu_by_process_charges_a_grandchilds_cpu_time(load) -> None:
    """The command's own process and the process it starts are both counted, with at least
    the CPU time the grandchild burns, and the machine was at least that busy."""
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass\n"
    burn += "time.sleep(0.3)"  # outlive one more sample
    child = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}])"
    kinds, wall, busy = load("cpu_by_process").measure([sys.executable, "-c", child], 0.05)
    processes, cpu = kinds["other"]
    assert processes >= 2 and cpu >= 1.0
    assert busy >= 1.0 and wall >= 1.0


def test_architecture_rows_compare_with_libmtl_and_report_peak_memory(load, tmp_path) -> None:
    """`run.py`'s architectures section (`architecture_rows.py`) for one architecture at tiny
    size: its step time over LibMTL's same architecture (target <= 1.0) and its peak memory
    per trial, from its own worker process (no timing is asserted)."""
    load("architectures_step_time")
    section, rows_module = load("architecture_rows"), load("rows")
    context = rows_module.Context(quick=True, device=torch.device("cpu"), workdir=tmp_path)
    rows = section.architecture_rows(context, names=("mmoe",), rounds=1)
    timed, memory = rows
    assert timed.name == "mmoe / LibMTL MMoE step time" and timed.target == "<= 1.0"
    assert timed.value > 0 and timed.result in {"pass", "within noise", "FAIL"}
    assert memory.name == "peak RSS per trial, architecture mmoe" and memory.value > 100


def test_trial_breakdown_attributes_each_epochs_span_to_its_parts(load, tmp_path) -> None:
    """Two epochs: the second followed by the final save. The Trainable's reported parts,
    the save between two steps and the rest (the span less the parts) add up to the span;
    the final epoch ends with the final save; the before share swaps in the host evaluation
    and a checkpoint after every epoch."""
    breakdown = load("trial_breakdown")
    trial, timing = tmp_path / "trial", tmp_path / "timing"
    trial.mkdir(), timing.mkdir()
    results = [
        {"time_train_s": 3.0, "time_evaluate_s": 1.0, "time_audit_s": 0.5},
        {"time_train_s": 4.0, "time_evaluate_s": 1.0, "time_audit_s": 0.5},
    ]
    (trial / "result.json").write_text("".join(json.dumps(r) + "\n" for r in results))
    records = [  # phase, seconds, end (wall clock)
        ("setup", 2.0, 12.0), ("step", 4.5, 16.5), ("save", 2.0, 19.0),
        ("step", 5.5, 25.0), ("save", 3.0, 28.5),
    ]  # fmt: skip
    (timing / "1.jsonl").write_text(
        "".join(json.dumps({"phase": p, "seconds": s, "end": e}) + "\n" for p, s, e in records)
    )
    first, second = breakdown.epoch_parts(trial, timing)
    assert first["span"] == pytest.approx(19.5 - 12.0)  # to the next step's start
    assert first["checkpoint"] == pytest.approx(2.0)
    assert first["rest"] == pytest.approx(7.5 - 3.0 - 1.0 - 0.5 - 2.0)
    assert second["span"] == pytest.approx(28.5 - 19.5)  # to the final save's end
    assert second["checkpoint"] == pytest.approx(3.0)
    assert second["train_share"] == pytest.approx(4.0 / 9.0)
    measured = {
        "epochs": [first, second],
        "evaluate_host_s": 2.0,
        "checkpoint_write_s": 2.5,
    }
    totals = breakdown.summary(measured)
    assert totals["train_share"] == pytest.approx(3.5 / 8.25)
    without = 8.25 - 1.0 - 2.5  # train, audit and rest per epoch
    assert totals["train_share_before"] == pytest.approx(3.5 / (without + 2.0 + 2.5))
    assert totals["checkpoint_share_every_epoch"] == pytest.approx(2.5 / (without + 1.0 + 2.5))
