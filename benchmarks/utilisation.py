"""The GPU's utilisation, sampled while workers train (NVML, else nvidia-smi), and a warm-up
that brings the GPU to its working clocks before anything is timed."""

from __future__ import annotations

import statistics
import subprocess
import threading
import time

import torch


def warm_up_gpu(device: torch.device, seconds: float = 3.0) -> None:
    """Keep the GPU busy with matrix products for `seconds`, so that the first worker timed
    after an idle spell does not meet it at idle clocks."""
    a = torch.randn(4096, 4096, device=device)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(10):
            a = torch.tanh(a @ a)
        torch.cuda.synchronize(device)
    del a
    torch.cuda.empty_cache()


class UtilisationSampler(threading.Thread):
    """GPU utilisation (%) every `period` s inside [start_at, start_at + seconds] (NVML through
    torch.cuda.utilization, else nvidia-smi), as (time.time(), percent) samples; `mean()` is
    None without any reading."""

    def __init__(
        self, device: torch.device, start_at: float, seconds: float, period: float = 0.5
    ) -> None:
        super().__init__(daemon=True)
        self.index = device.index or 0
        self.start_at, self.seconds, self.period = start_at, seconds, period
        self.samples: list[tuple[float, float]] = []
        self.stopped = threading.Event()

    def read(self) -> float | None:
        try:
            return float(torch.cuda.utilization(self.index))
        except Exception:  # no NVML bindings (pynvml), or NVML failed: ask nvidia-smi
            query = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
            try:
                lines = subprocess.run(
                    [*query, "-i", str(self.index)], capture_output=True, text=True, check=True
                ).stdout.split()
            except (OSError, subprocess.CalledProcessError):
                return None
            return float(lines[0]) if lines else None

    def run(self) -> None:
        time.sleep(max(0.0, self.start_at - time.time()))
        while time.time() < self.start_at + self.seconds and not self.stopped.is_set():
            value = self.read()
            if value is not None:
                self.samples.append((time.time(), value))
            self.stopped.wait(self.period)

    def mean(self, start: float = 0.0, end: float = float("inf")) -> float | None:
        """Mean utilisation of the samples taken in [start, end]."""
        values = [value for at, value in self.samples if start <= at <= end]
        return statistics.mean(values) if values else None
