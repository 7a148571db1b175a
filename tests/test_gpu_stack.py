"""The GPU stack is checked before a sweep launches, and bf16 runs only where the GPU has it
(`relif_ray.gpu_stack`, `relif_ray.tuning.cluster.check_gpu_stack`), on this machine without
GPUs: `nvidia-smi` is a stand-in on PATH, and torch's CUDA queries are monkeypatched."""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path

import pytest
import torch

from relif_ray.cli.sweep import main
from relif_ray.errors import UserError
from relif_ray.gpu_stack import (
    MINIMUM_DRIVER,
    GpuStack,
    check_driver,
    describe,
    forward_precision,
    minimum_driver,
    query_gpu_stack,
)

H200 = "NVIDIA H200, 580.65.06, 9.0"
V100 = "Tesla V100-SXM2-32GB, 535.104.05, 7.0"


def fake_nvidia_smi(folder: Path, monkeypatch, *rows: str, status: int = 0) -> None:
    """An `nvidia-smi` on PATH that answers the query with `rows` (one per GPU), and a torch
    built for CUDA 13.0."""
    folder.mkdir()
    lines = "".join(f"echo '{row}'\n" for row in rows)
    (folder / "nvidia-smi").write_text(
        '#!/bin/bash\n[[ "$*" == "--query-gpu=name,driver_version,compute_cap '
        f'--format=csv,noheader" ]] || exit 9\n{lines}exit {status}\n'
    )
    (folder / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
    monkeypatch.setattr(torch.version, "cuda", "13.0")


def test_the_stack_is_read_from_nvidia_smi_and_torchs_build(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path / "bin", monkeypatch, H200, H200)
    stack = query_gpu_stack()
    assert stack == GpuStack(
        driver="580.65.06",
        cuda_runtime="13.0",
        torch=torch.__version__,
        gpus=(("NVIDIA H200", "9.0"), ("NVIDIA H200", "9.0")),
    )
    assert describe(stack) == (
        f"NVIDIA driver 580.65.06, torch {torch.__version__} (CUDA 13.0), "
        "2 x NVIDIA H200 (compute 9.0, bf16)"
    )


def test_a_machine_without_a_driver_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    stack = query_gpu_stack()
    assert (stack.driver, stack.gpus, stack.problem) == (None, (), "no nvidia-smi on PATH")
    check_driver(stack, "GPU node 127.0.0.1")  # nothing to check
    fake_nvidia_smi(tmp_path / "bin", monkeypatch, status=9)
    assert query_gpu_stack().problem == "nvidia-smi: exit status 9"


def test_a_driver_older_than_the_cuda_runtime_needs_is_one_line():
    old = GpuStack("575.57.08", "13.0", "2.14.1", (("NVIDIA H200", "9.0"),))
    with pytest.raises(UserError) as refused:
        check_driver(old, "GPU node 10.0.0.7")
    assert str(refused.value) == (
        "GPU node 10.0.0.7: NVIDIA driver 575.57.08 is older than 580.65.06, the oldest that "
        "torch 2.14.1's CUDA 13.0 runtime runs on; update the driver there, or install a torch "
        "built for an older CUDA"
    )
    check_driver(GpuStack("580.65.06", "13.0", "2.14.1"), "here")  # exactly the minimum
    check_driver(GpuStack("575.57.08", "12.9", "2.8.0"), "here")
    check_driver(GpuStack("525.60.13", "12.8", "2.7.0"), "here")  # minor version compatibility
    check_driver(GpuStack("470.42.01", None, "2.14.1"), "here")  # a CPU build needs none
    with pytest.raises(UserError, match="older than 525.60.13, "):
        check_driver(GpuStack("520.61.05", "12.8", "2.7.0"), "here")


def test_every_minor_release_of_a_major_needs_that_majors_driver():
    assert minimum_driver("13.0") == minimum_driver("13.2") == (580, 65, 6)
    assert minimum_driver("12.0") == minimum_driver("12.9") == (525, 60, 13)
    assert minimum_driver("11.8") == (450, 80, 2)
    assert minimum_driver("14.0") is None and minimum_driver("10.2") is None
    drivers = [MINIMUM_DRIVER[major] for major in sorted(MINIMUM_DRIVER)]
    assert drivers == sorted(drivers)  # a newer CUDA never needs an older driver


def test_an_old_gpu_is_described_as_running_fp32(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path / "bin", monkeypatch, V100)
    assert describe(query_gpu_stack()).endswith(
        "1 x Tesla V100-SXM2-32GB (compute 7.0, fp32: no native bf16)"
    )


def fake_cuda_gpu(monkeypatch, name: str, capability: tuple[int, int]) -> None:
    """torch's CUDA device queries answering as the GPU `name` of compute `capability`."""
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(
        torch.cuda, "is_bf16_supported", lambda including_emulation=True: capability >= (8, 0)
    )
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)


def test_bf16_falls_back_to_fp32_with_one_line_on_a_gpu_without_it(monkeypatch, caplog):
    fake_cuda_gpu(monkeypatch, "Tesla T4", (7, 5))
    with caplog.at_level(logging.INFO, logger="relif_ray"):
        assert forward_precision("bf16", torch.device("cuda", 0)) == "fp32"
        assert forward_precision("fp32", torch.device("cuda", 0)) == "fp32"
    assert caplog.messages == [
        "train.precision bf16: Tesla T4 (compute capability 7.5) has no native bf16 (compute "
        "capability 8.0 and newer have it); the model forward runs fp32"
    ]


def test_bf16_stays_on_a_gpu_that_has_it_and_on_the_cpu(monkeypatch, caplog):
    fake_cuda_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB", (8, 0))
    with caplog.at_level(logging.INFO, logger="relif_ray"):
        assert forward_precision("bf16", torch.device("cuda", 0)) == "bf16"
        assert forward_precision("bf16", torch.device("cpu")) == "bf16"
    assert caplog.messages == []


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a driver")
def test_every_gpu_node_is_asked_by_a_task_on_it(ray_session):
    """The session's local Ray declares 2 GPUs on a machine without any: the task on its node
    finds no driver, and says so."""
    from relif_ray.tuning.cluster import gpu_node_stacks

    ((address, stack),) = gpu_node_stacks()
    assert address == "127.0.0.1"
    assert stack.driver is None and stack.problem == "no nvidia-smi on PATH"
    assert stack.torch == torch.__version__


@pytest.mark.slow
def test_a_sweep_prints_each_gpu_node_and_refuses_an_old_driver_before_any_trial(
    ray_session, nyuv2_dir, tmp_path, monkeypatch, capsys
):
    """The sweep command on local Ray: one line per GPU node on stdout, then the refusal of
    the node whose driver is too old, one line on stderr, exit 2, nothing written."""
    import relif_ray.tuning.cluster as cluster

    nodes = [
        ("10.0.0.5", GpuStack("580.95.05", "13.0", "2.14.1", (("NVIDIA H200", "9.0"),) * 8)),
        ("10.0.0.6", GpuStack("570.86.15", "13.0", "2.14.1", (("Tesla V100-SXM2-32GB", "7.0"),))),
    ]
    monkeypatch.setattr(cluster, "gpu_node_stacks", lambda: nodes)
    storage = tmp_path / "results"
    argv = ["--data-dir", str(nyuv2_dir), "--storage", str(storage), "--num-gpus", "1"]
    status = main(datasets=("nyuv2",), argv=argv)
    out, err = capsys.readouterr()
    assert status == 2
    assert [line for line in out.splitlines() if line.startswith("GPU node ")] == [
        "GPU node 10.0.0.5: NVIDIA driver 580.95.05, torch 2.14.1 (CUDA 13.0), "
        "8 x NVIDIA H200 (compute 9.0, bf16)",
        "GPU node 10.0.0.6: NVIDIA driver 570.86.15, torch 2.14.1 (CUDA 13.0), "
        "1 x Tesla V100-SXM2-32GB (compute 7.0, fp32: no native bf16)",
    ]
    (refusal,) = err.splitlines()
    assert refusal.split(": error: ", 1)[1] == (
        "GPU node 10.0.0.6: NVIDIA driver 570.86.15 is older than 580.65.06, "
        "the oldest that torch 2.14.1's CUDA 13.0 runtime runs on; update the driver there, or "
        "install a torch built for an older CUDA"
    )
    assert not storage.exists() or not any(storage.iterdir())
