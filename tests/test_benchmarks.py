"""The benchmarks' own logic: the timer's interval, the targets' verdicts, the audit's reference
loop, the suites' rows at toy size (no timing is asserted), the GPU check's orchestration in a
dry run, and the benchmark document against the committed results."""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys
import threading
import time
import zipfile

import numpy as np
import pytest
import torch

from relif_ray.experiment.record import TrialRecord, record_text


def timed_trial(started_at: float, finished_at: float, steps: int = 16) -> TrialRecord:
    """A CPU trial's record with its wall-clock span: what the packing rows read of it."""
    return TrialRecord(
        trial_id="t", label="erm", method="erm", relif=False, seed=0, steps=steps, config={},
        device="cpu", started_at=started_at, finished_at=finished_at,
    )  # fmt: skip


@pytest.fixture
def load():
    """Import a module of the `benchmarks` package by its name."""
    return lambda name: importlib.import_module(f"benchmarks.{name}")


@pytest.fixture
def toy(load, tmp_path):
    """A suite's context at toy size on the CPU."""
    return load("harness").Context("toy", torch.device("cpu"), tmp_path)


def test_ratio_interval_is_the_sign_test_interval_and_targets_judge_with_it(load) -> None:
    harness, targets = load("harness"), load("targets")
    # per-round ratios 0.5, 0.6, ..., 1.4 (n = 10): k = floor(5 - 0.98 sqrt(10)) = 1
    times = {"a": [0.5 + 0.1 * i for i in range(10)], "b": [1.0] * 10}
    median, lower, upper = harness.ratio_with_interval(times, "a", "b")
    assert median == pytest.approx(0.95)
    assert (lower, upper) == (pytest.approx(0.6), pytest.approx(1.3))
    at_most, at_least = targets.Target("x", "<=", 1.0), targets.Target("x", ">=", 1.0)
    assert at_most.judge(0.95, (0.6, 1.3)) == "pass" and at_most.text == "<= 1"
    assert at_most.judge(1.1, (0.9, 1.2)) == "within noise"
    assert at_most.judge(1.1, (1.05, 1.2)) == at_most.judge(1.1) == "FAIL"
    assert at_least.judge(0.9, (0.8, 1.1)) == "within noise" and at_least.judge(0.9) == "FAIL"
    before = targets.Target("x", ">", "before")
    assert before.judge(0.8, reference=0.7) == "pass" and before.judge(0.7, reference=0.7) == "FAIL"


def test_every_target_names_a_suite_of_the_table_and_a_device_and_size(load) -> None:
    suites = {suite.name for suite in load("run").SUITES}
    for name, target in load("targets").TARGETS.items():
        assert target.suite in suites, name
        assert target.device in ("cpu", "cuda", "any") and target.size in (
            "toy",
            "demo",
            "real",
            "any",
        )


def test_interleaved_times_runs_every_variant_each_round(load) -> None:
    harness = load("harness")
    calls: list[str] = []
    steps = {name: (lambda name=name: calls.append(name)) for name in ("x", "y", "z")}
    times = harness.interleaved_times(steps, rounds=4, warmup=1, cuda=False)
    assert {name: len(values) for name, values in times.items()} == {"x": 4, "y": 4, "z": 4}
    assert all(sorted(calls[3 * r : 3 * r + 3]) == ["x", "y", "z"] for r in range(5))
    assert calls[:3] != calls[3:6] or calls[3:6] != calls[6:9]  # the order is shuffled


def test_relif_regularizer_stays_within_its_aten_call_and_kernel_budgets(load, toy) -> None:
    """The regularizer's ATen calls and device kernel launches per forward + backward
    (deterministic for one torch version) stay within the targets' bounds, below the counts
    before the rewrite; the suite's rows say so."""
    relif, targets = load("relif"), load("targets").TARGETS
    for setting in relif.OP_SETTINGS:
        calls, kernels = relif.aten_calls(setting), relif.device_kernels(setting)
        assert calls <= targets[f"ReLiF ATen calls, {setting.name}"].bound
        assert targets[f"ReLiF ATen calls, {setting.name}"].bound < 0.65 * setting.calls_before
        assert kernels <= targets[f"ReLiF kernel launches, {setting.name}"].bound
        assert targets[f"ReLiF kernel launches, {setting.name}"].bound < setting.kernels_before
    relif.relif_ops_suite(toy)
    assert [row.result for row in toy.rows] == ["pass"] * 4
    assert toy.rows[0].name == "ReLiF regularizer ATen calls per step, NYUv2"


def test_batch_host_time_times_both_paths_on_nyuv2_shaped_data(load) -> None:
    """NYUv2's shapes and label dtype; both paths timed, the ratio with its interval."""
    host = load("host_data")
    split = host.nyuv2_shaped_split(16)
    assert split.tensors["image"].shape == (16, 3, 288, 384)
    assert split.tensors["seg"].dtype == torch.int8
    result = host.measure_batch(examples=16, rounds=2)
    assert set(result) == {"host_s", "device_s", "ratio", "ratio_low", "ratio_high"}
    assert result["host_s"] > 0 and result["device_s"] > 0


def test_python_reference_loop_matches_the_closed_form(load) -> None:
    audit = load("audit")
    scores = [0.1, 0.5, 0.95]
    # gaps |0.1-0.5| = 0.4, |0.5-0.95| = 0.45, |0.1-0.1| = 0 at delta 0.2
    bias, vr = audit.python_loop_audit(scores, [0, 1, 0], [1, 2, 0], 0.2)
    assert bias == pytest.approx((0.2 + 0.25) / 3) and vr == pytest.approx(2 / 3)
    result = audit.measure_audit(pairs=2**12, repeats=1)  # raises if the loop disagrees
    assert result["pairs"] == 3 * 2**12
    assert np.isfinite([result["pairs_per_s"], result["loop_pairs_per_s"]]).all()


def test_analysis_suite_generates_trials_in_the_output_format_and_times_them(load, toy) -> None:
    audit = load("audit")
    root = toy.workdir / "bench"
    assert audit.generate(root, trials=5, examples=12) > 0
    assert audit.generate(root, trials=5, examples=12) == 0.0  # reused
    result = audit.measure_analysis(root, induced=True)
    assert result["trials"] == 5
    assert result["total_s"] == pytest.approx(result["load_s"] + result["audit_s"])
    assert set(result) == {"trials", "load_s", "audit_s", "total_s", "induced_s"}


def test_run_writes_one_record_with_the_machine_and_rows(load, tmp_path, capsys) -> None:
    """Without a GPU the packing suite's rows say so; the record names the machine, the
    software and the commit, and its Markdown is what the document shows."""
    run = load("run")
    assert run.main(["--quick", "--device", "cpu", "--json", "--only", "packing",
                     "--out", str(tmp_path)]) == 0  # fmt: skip
    payload = json.loads(capsys.readouterr().out)
    assert payload == json.loads((tmp_path / "benchmarks.json").read_text())
    assert payload["size"] == "demo" and payload["machine"]["cores"] >= 1
    assert {"cpu_flags", "torch", "ray", "commit", "load_average_end"} <= set(payload["machine"])
    names = [load("real_size").ISOLATED]
    names += [f"{what}, {k} trial(s) per GPU" for k in (1, 2, 3, 4)
              for what in ("sweep aggregate images/s", "GPU utilisation")]  # fmt: skip
    assert [row["name"] for row in payload["rows"]] == names
    assert all(
        row["result"] == "needs a GPU" and row["group"] == "packing" for row in payload["rows"]
    )
    assert (
        "| GPU utilisation, 3 trial(s) per GPU | - | - | needs a GPU |"
        in (tmp_path / "benchmarks.md").read_text()
    )


@pytest.mark.slow
def test_trial_worker_reports_throughput_and_its_own_peak_memory(load, toy) -> None:
    workers = load("workers")
    toy_images = workers.data_root(toy, gpu=True)  # 32x40: the GPU rows' images at toy size
    config = workers.trial_config(toy, toy_images, "relif", gpu=False)
    config["model"] = {"backbone": "resnet18", "head_channels": 8}
    result = workers.run_worker(config, warmup=1, steps=2)
    assert result["steps"] == 2 and result["images_per_s"] > 0
    assert 0 < result["rss_imports_mb"] <= result["peak_rss_mb"]
    assert result["cuda_peak_mb"] is None and result["device"] == "cpu"


def test_a_gpu_row_whose_trials_trained_on_the_cpu_is_an_error_not_a_figure(load, tmp_path):
    """Each GPU row says the device its trials reported training on; on CUDA a trial that
    trained on the CPU makes the row a FAIL without a value. The dry run's rows (toy size on
    the CPU) record the CPU; the trials take the sweep's device rule ("auto" on CUDA)."""
    harness, workers = load("harness"), load("workers")
    gpu = harness.Context("real", torch.device("cuda"), tmp_path)
    toy = harness.Context("toy", torch.device("cpu"), tmp_path)
    assert harness.trained_on(gpu, ["cuda:0", "cuda:0"], "x") == "trained on cuda:0"
    assert harness.trained_on(toy, ["cpu"], "x") == "trained on cpu"
    message = r"^packing: its trials trained on cpu, cuda:0, not on the GPU: not a GPU figure$"
    with pytest.raises(harness.NotOnTheGpu, match=message):
        harness.trained_on(gpu, ["cuda:0", "cpu"], "packing")
    result = {"device": "cpu", "cuda_peak_mb": None, "peak_rss_mb": 900.0, "images_per_s": 40.0,
              "steps": 10, "step_s": 0.2, "steps_as": "graphed"}  # fmt: skip
    with gpu.step("training images/s, erm (graphed)"):
        workers.worker_rows(gpu, "erm (graphed)", result, "resnet50 288x384")
    (row,) = gpu.rows
    assert (row.value, row.result) == (None, "FAIL")
    assert row.detail == "NotOnTheGpu: erm (graphed): its trials trained on cpu, not on the GPU: "\
        "not a GPU figure"  # fmt: skip
    workers.worker_rows(toy, "erm (graphed)", result, "resnet18 32x40")
    assert len(toy.rows) == 2 and all(
        "resnet18 32x40, trained on cpu" in r.detail for r in toy.rows
    )
    root = workers.data_root(toy, gpu=True)
    assert workers.trial_config(gpu, root, "erm", gpu=True)["device"] == "auto"
    assert workers.trial_config(toy, root, "erm", gpu=True)["device"] == "cpu"


def test_trial_worker_times_whole_chunks_of_steps(load, toy) -> None:
    """Steps run in chunks (a device sync between chunks only); the last chunk is cut short."""
    from relif_ray.config import ExperimentConfig
    from relif_ray.engine import TrainingRun

    workers = load("workers")
    toy_images = workers.data_root(toy, gpu=True)  # 32x40: the GPU rows' images at toy size
    config = workers.trial_config(toy, toy_images, "erm", gpu=False)
    config["model"] = {"backbone": "resnet18", "head_channels": 8}
    training = TrainingRun(ExperimentConfig.from_dict(config))
    chunks = workers.timed_chunks(training, steps=5, chunk=2)
    assert [count for count, _ in chunks] == [2, 2, 1] and training.step == 5
    assert len(training.trace) == 5 and all(seconds > 0 for _, seconds in chunks)


@pytest.mark.slow
def test_a_host_solving_methods_worker_is_judged_against_graphed_erm(
    load, toy, monkeypatch
) -> None:
    """A method that solves on the host (PCGrad) gets its worker's images/s over the graphed
    ERM row of the run (target >= 0.5), saying how its steps ran (eager on the CPU, with the
    engine's reason); a loss weighting (DWA) gets no such row. In fp32: bf16 autocast on a CPU
    without native bf16 takes ~25x as long a step."""
    methods, harness, workers = load("methods"), load("harness"), load("workers")
    monkeypatch.setattr(workers, "GPU_FAST_PATH", {**workers.GPU_FAST_PATH, "precision": "fp32"})
    toy.earlier = [harness.Row(methods.GRAPHED, 400.0, "img/s")]
    methods.method_throughput(toy, "pcgrad")
    methods.method_throughput(toy, "dwa")
    ratios = [row for row in toy.rows if "graphed ERM" in row.name]
    assert [row.name for row in ratios] == ["pcgrad images/s / graphed ERM images/s"]
    (ratio,) = ratios
    assert ratio.target == ">= 0.5" and ratio.result in {"pass", "FAIL"} and ratio.value > 0
    assert "steps eager: a CUDA graph needs a CUDA device" in ratio.detail


@pytest.mark.slow
def test_methods_rows_judge_the_representation_mode_and_report_its_cosine(load, toy) -> None:
    """The representation-mode rows: a step-time ratio judged against 1.3 and the update
    cosine with the exact mode; the rows against TorchJD and LibMTL 1.1.5 (toy size, a few
    methods)."""
    load("methods").step_time_rows(toy, ["gradnorm", "pcgrad", "dwa", "famo", "nashmtl"])
    by_name = {row.name: row for row in toy.rows}
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
        assert compared.target == "<= 1" and compared.value > 0
    assert "famo / ERM step time" in by_name and not any(
        n.startswith("famo /") and "libmtl" in n for n in by_name
    )


@pytest.mark.slow
def test_architecture_rows_compare_with_libmtl_and_report_peak_memory(
    load, toy, monkeypatch
) -> None:
    """One architecture at toy size: its step time over LibMTL's same architecture (target
    <= 1.0) and its peak memory per trial, from its own worker process (in fp32: bf16
    autocast on a CPU without native bf16 takes ~25x as long a step)."""
    workers = load("workers")
    monkeypatch.setattr(workers, "GPU_FAST_PATH", {**workers.GPU_FAST_PATH, "precision": "fp32"})
    load("architectures").architectures_suite(toy, names=("mmoe",))
    timed, memory = toy.rows
    assert timed.name == "mmoe / LibMTL MMoE step time" and timed.target == "<= 1"
    assert timed.value > 0 and timed.result in {"pass", "within noise", "FAIL"}
    assert memory.name == "peak RSS per trial, architecture mmoe" and memory.value > 100


@pytest.mark.slow
def test_the_fused_gpu_rows_dry_run_on_the_cpu(load, toy, monkeypatch) -> None:
    """The GPU check's fused rows at toy size: an isolated worker, then workers of 2, 4 and 8
    fused seeds, each counting every seed's images; the ratios are not judged off the GPU.
    In fp32 here: bf16 autocast on a CPU without native bf16 takes ~25x as long a step."""
    workers = load("workers")
    monkeypatch.setattr(workers, "GPU_FAST_PATH", {**workers.GPU_FAST_PATH, "precision": "fp32"})
    load("fused").fused_gpu_suite(toy)
    rows = {row.name: row for row in toy.rows}
    isolated = rows["training images/s, erm, isolated trial"].value
    assert isolated > 0
    for seeds in (2, 4, 8):
        rate = rows[f"training images/s, erm, {seeds} seeds fused"].value
        ratio = rows[f"images/s per GPU, {seeds} seeds fused / isolated"]
        assert rate > 0 and ratio.value == pytest.approx(rate / isolated)
        assert (ratio.target, ratio.result) == (">= 2", "info")
        assert f"{seeds} seeds looped, each eager" in ratio.detail
        assert rows[f"peak GPU memory per seed, erm, {seeds} seeds fused"].result == "needs a GPU"


def test_the_gpu_check_runs_the_suites_with_a_cap_in_their_priority_order(load) -> None:
    check = load("gpu_check")
    assert [suite.name for suite in check.CHECKED] == [
        "breakdown", "packing", "fused-gpu", "fidelity", "graph", "profile", "methods",
        "default", "compile", "cuda", "repeatability",
    ]  # fmt: skip
    # the first five fill the budget: the later suites run when earlier ones end early, or with
    # --only
    assert sum(suite.gpu[0] for suite in check.CHECKED[:5]) >= check.BUDGET_S
    assert all(least <= cap for cap, least in (suite.gpu for suite in check.CHECKED))


def test_gpu_check_drift_names_the_largest_difference_and_its_place(load) -> None:
    drift = load("cuda_checks").drift
    nan = float("nan")
    pinned = {"trace": [{"a": 1.0, "b": nan}, {"a": -2.0, "b": 0.0}], "n": 4}
    computed = {"trace": [{"a": 1.5, "b": nan}, {"a": -2.0, "b": 0.25}], "n": 4}
    assert {path: (diff, rel) for path, diff, rel in drift(pinned, computed)} == {
        "/trace[0]/a": (0.5, 0.5),
        "/trace[0]/b": (0.0, 0.0),  # NaN against NaN: no drift
        "/trace[1]/a": (0.0, 0.0),
        "/trace[1]/b": (0.25, 0.25),  # relative to a pinned 0: the absolute difference
        "/n": (0.0, 0.0),
    }
    assert list(drift({"x": nan}, {"x": 1.0})) == [("/x", math.inf, math.inf)]
    with pytest.raises(ValueError, match=r"^/trace: 1 entries, 2 pinned$"):
        list(drift(pinned, {"trace": computed["trace"][:1], "n": 4}))
    with pytest.raises(ValueError, match=r"keys \['m'\] differ"):
        list(drift({"m": 1.0}, {}))


def test_gpu_check_reports_each_pytest_case(load, tmp_path) -> None:
    cuda = load("cuda_checks")
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


def test_the_packing_rows_split_each_trials_span_from_what_the_trials_reported(load, toy):
    """Two trials of 2 epochs: the epochs' timed parts, the rest of the epochs and the time
    outside them (set-up, checkpoints) are means per trial; the value is the train share."""
    epoch = {
        "time_train_s": 2.0,
        "time_evaluate_s": 1.0,
        "time_audit_s": 0.5,
        "time_this_iter_s": 4.0,
    }
    trials = [timed_trial(100.0, 110.0), timed_trial(0.0, 14.0)]
    load("real_size").time_split_row(toy, 2, trials, [[epoch, epoch], [epoch, epoch]])
    (row,) = toy.rows
    assert row.name == "train share of a trial's span, 2 trial(s) per GPU"
    assert row.value == pytest.approx(4.0 / 12.0)
    assert row.detail == (
        "mean seconds per trial over 2 trial(s) of 2 epochs: train 4.00, evaluate 2.00, "
        "audit 1.00, rest of the epochs 1.00, outside the epochs 4.00"
    )


def test_packing_measures_its_reference_then_one_to_four_trials_per_gpu(load, toy, monkeypatch):
    """The packing rows in the order the check writes them: the isolated graphed ERM rate
    first, then for 1, 2, 3 and 4 trials per GPU (sweeps of 8 real-size epochs) the aggregate
    over it; the best packing is judged against the raised target."""
    real_size = load("real_size")
    assert real_size.PACKINGS == (1, 2, 3, 4) and real_size.PACKING_EPOCHS >= 8
    monkeypatch.setattr(real_size, "isolated_rate", lambda ctx: ctx.row(real_size.ISOLATED, 100.0))
    aggregate = {1: 80.0, 2: 120.0, 3: 150.0, 4: 140.0}

    def sweep_throughput(ctx, per_gpu, name):
        ctx.row(name, aggregate[per_gpu], "img/s")
        return aggregate[per_gpu]

    monkeypatch.setattr(real_size, "sweep_throughput", sweep_throughput)
    real_size.packing_suite(toy)
    names = [row.name for row in toy.rows]
    assert names[0] == real_size.ISOLATED
    for per_gpu in (1, 2, 3, 4):
        ratio = f"sweep aggregate / isolated graphed ERM, {per_gpu} trial(s) per GPU"
        assert names.index(f"sweep aggregate images/s, {per_gpu} trial(s) per GPU") + 1 == (
            names.index(ratio)
        )
        assert toy.rows[names.index(ratio)].value == pytest.approx(aggregate[per_gpu] / 100.0)
    judged = toy.rows[-1]
    assert judged.name == "sweep aggregate images/s per GPU / isolated graphed ERM"
    assert (judged.value, judged.target, judged.result) == (1.5, ">= 1", "pass")
    assert judged.detail.startswith("3 trial(s) per GPU, the best of 1, 2, 3, 4")


class NoSampler:
    """A GPU utilisation sampler without readings, for a CUDA context on a CPU machine."""

    def __init__(self, device: torch.device, period: float) -> None:
        self.stopped, self.samples = threading.Event(), []

    def start(self) -> None:
        pass

    def mean(self, start: float, end: float) -> None:
        return None


def test_a_packing_whose_trials_trained_on_the_cpu_is_no_gpu_figure(load, tmp_path, monkeypatch):
    """A packing sweep's rows read each trial's own record (trial.json's device, result.json's
    peak memory and epochs): on CUDA trials that report the CPU make the row a FAIL; on the
    dry run the rows say the CPU."""
    harness, real_size = load("harness"), load("real_size")
    experiment = tmp_path / "results" / "packing-2"
    for index in range(2):
        trial = experiment / f"trial{index}"
        outputs = trial / "checkpoint_000001" / "outputs"
        outputs.mkdir(parents=True)
        (outputs / "trial.json").write_text(record_text(timed_trial(10.0, 18.0 + index)))
        epoch = {"time_train_s": 3.0, "time_evaluate_s": 0.5, "time_audit_s": 0.1,
                 "time_this_iter_s": 4.0}  # fmt: skip
        (trial / "result.json").write_text((json.dumps(epoch) + "\n") * 2)
    monkeypatch.setattr(real_size, "sweep_command", lambda *args: ["true"])
    gpu = harness.Context("real", torch.device("cuda"), tmp_path)
    monkeypatch.setattr(gpu, "run", lambda command: 0)
    monkeypatch.setattr(real_size, "UtilisationSampler", NoSampler)
    name = "sweep aggregate images/s, 2 trial(s) per GPU"
    with gpu.step(name):
        real_size.sweep_throughput(gpu, 2, name)
    (row,) = gpu.rows
    assert (row.name, row.value, row.result) == (name, None, "FAIL")
    assert "its trials trained on cpu, not on the GPU: not a GPU figure" in row.detail
    toy = harness.Context("toy", torch.device("cpu"), tmp_path)
    monkeypatch.setattr(toy, "run", lambda command: 0)
    assert real_size.sweep_throughput(toy, 2, name) == pytest.approx(32 * 8 / 9.0)
    rows = {row.name: row for row in toy.rows}
    assert rows[name].detail.endswith("trained on cpu")
    assert "(2 epochs)" in rows[name].detail
    assert rows["peak GPU memory per trial, 2 trial(s) per GPU"].value is None


def test_the_cuda_suite_collects_only_the_modules_with_cuda_tests(load) -> None:
    """On the GPU machine a module that cannot import (the notebook's tests need nbformat)
    must not become a failed CUDA row: only modules with `@needs_cuda` tests are collected."""
    modules = load("cuda_checks").cuda_test_modules()
    assert {"tests/test_fast_path.py", "tests/test_cuda_graph.py"} <= set(modules)
    assert "tests/test_analysis_notebook.py" not in modules and "tests/conftest.py" not in modules


def test_gpu_check_out_of_budget_skips_every_suite_and_still_reports(load, tmp_path) -> None:
    check = load("gpu_check")
    assert check.main(["--dry-run", "--out", str(tmp_path), "--budget-s", "0"]) == 0
    payload = json.loads((tmp_path / "gpu_check.json").read_text())
    assert payload["dry_run"] and payload["rows"] == [] and payload["size"] == "toy"
    assert [(s["name"], s["status"]) for s in payload["sections"]] == [
        (suite.name, "skipped: time budget") for suite in check.CHECKED
    ]
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert "| fidelity | skipped: time budget | 0.0 |" in markdown


def test_gpu_check_time_needs_do_not_follow_the_budget(load, tmp_path) -> None:
    """A part's time on the H100 is the same whatever the budget: a suite starts a part only
    when that time is left. The budget sets the caps: one shorter than the chosen suites need
    shrinks them in proportion, a longer one leaves them, so its extra time reaches the last
    suites. Suites chosen with --only whose caps fit the budget keep their caps (the CUDA-only
    tests were once killed at a third of theirs under a 200-s budget)."""
    check, harness = load("gpu_check"), load("harness")
    every = sum(suite.gpu[0] for suite in check.CHECKED)
    assert check.cap_scale(270.0, dry_run=False, caps_s=every) == 0.5
    assert check.cap_scale(810.0, dry_run=False, caps_s=every) == 1.0
    last_two = sum(check.BY_NAME[name].gpu[0] for name in ("cuda", "repeatability"))
    assert check.cap_scale(200.0, dry_run=False, caps_s=last_two) == 1.0
    assert check.cap_scale(last_two / 2, dry_run=False, caps_s=last_two) == 0.5
    assert check.cap_scale(1800.0, dry_run=True, caps_s=every) == 1800.0 / check.BUDGET_S
    gpu = harness.Context("real", torch.device("cpu"), tmp_path, time.time() + 100.0)
    assert gpu.has_time(90.0) and not gpu.has_time(110.0)
    toy = harness.Context("toy", torch.device("cpu"), tmp_path, time.time() + 1.0)
    assert toy.has_time(1e6)


@pytest.mark.slow
def test_gpu_check_dry_run_finds_cpu_runs_repeatable(load, tmp_path) -> None:
    """The repeatability suite of the dry run end to end: its process, two trial workers and
    the JSON and Markdown it writes. On a CPU the same seed gives the same numbers
    (deterministic algorithms), so the row must say identical; the cuDNN setting that only
    CUDA has is recorded as skipped."""
    check = load("gpu_check")
    assert check.main(["--dry-run", "--out", str(tmp_path), "--only", "repeatability"]) == 0
    payload = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [(s["name"], s["status"]) for s in payload["sections"]] == [("repeatability", "done")]
    rows = {row["name"]: row for row in payload["rows"]}
    name = "same seed twice, cudnn_benchmark on (default)"
    assert (rows[name]["value"], rows[name]["result"]) == (0.0, "identical")
    assert rows["same seed twice, cudnn_benchmark off"]["result"] == load("harness").NEEDS_CUDA
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
        (".venv/bin/python -m benchmarks.gpu_check --out o", "driver benchmarks.gpu_check"),
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


def test_trial_breakdown_attributes_each_epochs_span_to_its_parts(load, tmp_path) -> None:
    """Two epochs: the second followed by the final save. The Trainable's reported parts,
    the save between two steps and the rest (the span less the parts) add up to the span;
    the final epoch ends with the final save; the before share swaps in the host evaluation
    and a checkpoint after every epoch."""
    breakdown = load("sweep")
    trial, timing = tmp_path / "trial", tmp_path / "timing"
    trial.mkdir(), timing.mkdir()
    results = [
        {"time_train_s": 3.0, "time_evaluate_s": 1.0, "time_audit_s": 0.5, "device": "cpu"},
        {"time_train_s": 4.0, "time_evaluate_s": 1.0, "time_audit_s": 0.5, "device": "cpu"},
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


def test_the_benchmark_document_agrees_with_the_committed_results(load) -> None:
    """docs/benchmarks.md is what `benchmarks/document.py` makes of docs/results/: every
    record it shows, with its command, date, machine, commit and load, and every row."""
    document = load("document")
    text = document.DOCUMENT.read_text()
    assert document.render(text) == text, "run: python benchmarks/document.py"
    shown = {match[1] for match in document.BLOCK.findall(text)}
    records = {f"results/{path.name}" for path in document.RESULTS.glob("*.json")}
    assert records <= {spec.split()[0] for spec in shown}, "a committed record is not shown"
    assert {"suites", "targets"} <= shown
    for path in document.RESULTS.glob("*.json"):
        machine = json.loads(path.read_text())["machine"]
        assert {"date", "cpu", "cores", "gpu", "torch", "commit", "load_average"} <= set(machine)


def test_gpu_bundle_covers_every_project_dependency(load) -> None:
    """Every runtime dependency of pyproject.toml (and the mtl extra) is a bundled wheel or in
    the GPU image's list, so the lent machine imports the whole package; a requirement neither
    holds is named."""
    bundle = load("gpu_bundle")
    requirements = bundle.project_requirements()
    assert "fairlearn>=0.13" in requirements
    assert bundle.uncovered(requirements) == []
    assert bundle.uncovered(["Some_Package[extra]>=1; python_version>'3'", "torch>=2"]) == [
        "Some_Package[extra]>=1; python_version>'3'"
    ]
    assert bundle.requirement_name("torchjd[quadprog-projector,cagrad]>=0.18,<0.19") == "torchjd"


def test_the_fidelity_suite_compares_precisions_recorded_at_its_steps(load, tmp_path) -> None:
    """A precision an earlier record of the same GPU model holds at the suite's steps is not
    run again: its rows enter the bf16 - fp32 comparison (here both, so nothing trains). A
    record at other steps, or of another GPU model, is not used."""
    harness, real_size, check = load("harness"), load("real_size"), load("gpu_check")

    def recorded(precision: str, steps: int, relif: tuple, relif_st: tuple) -> list:
        setting = harness.Row(f"setting, {precision}", None, detail=f"resnet50, {steps} steps, "
                              "eta 0.0132, 2 seed(s)")  # fmt: skip
        rows = [setting]
        for label, (a, b) in (("relif", relif), ("relif-st", relif_st)):
            name = f"Bias@delta_p75 {label} / ERM (a) q10-q90, {precision}"
            rows.append(harness.Row(name, (a + b) / 2, "x", per_seed={0: a, 1: b}))
            worst = f"Worst {label} - ERM, {precision}"
            rows.append(harness.Row(worst, -0.01, per_seed={0: -0.02, 1: 0.0}))
        return rows

    earlier = recorded("bf16", 4, (0.8, 0.2), (0.10, 0.08))
    earlier += recorded("fp32", 4, (0.7, 0.3), (0.30, 0.28))
    ctx = harness.Context("toy", torch.device("cpu"), tmp_path, earlier=earlier)
    real_size.fidelity_suite(ctx)
    rows = {row.name: row for row in ctx.rows}
    assert rows["ReLiF at real size, bf16, 4 steps"].detail.startswith("not run")
    relif, relif_st = (rows[f"{label}: bf16 - fp32 Bias ratio, against the seed spread"]
                       for label in ("relif", "relif-st"))  # fmt: skip
    assert relif.value == pytest.approx(0.0) and relif.result == "agree"
    spread = float(np.std([0.30, 0.28], ddof=1))
    assert relif_st.value == pytest.approx(0.2) and relif_st.result == "disagree"
    assert f"seed-to-seed spread {spread:.3f}" in relif_st.detail
    worst = rows["relif-st: bf16 - fp32 Worst - ERM, against the seed spread"]
    assert worst.value == pytest.approx(0.0) and worst.result == "agree"
    assert real_size.recorded_rows(ctx, "bf16", 1500) == {}
    record = tmp_path / "run.json"
    record.write_text(json.dumps({"machine": {"gpu": "NVIDIA H200"}, "rows": []}))
    assert check.earlier_record(record, "NVIDIA H200") == record
    assert check.earlier_record(record, "NVIDIA H100 80GB HBM3") is None
    assert check.record_problem(record) is None
    assert check.record_problem(tmp_path / "none.json") == "no such file"
