"""Shared fixtures: tiny NYUv2-format data, tiny configs, one Ray session per test session,
an S3 server (moto) on 127.0.0.1; and a scratch folder for everything the tests start."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest
import torch

from relif_ray.experiment import storage
from relif_ray.sweep.request import SweepRequest
from relif_ray.tuning import keep_local_ray_on_loopback

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# No process of the tests (Ray workers included) asks the cloud's metadata address for
# credentials.
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
# Every local Ray of the tests (the session's and those of the CLI subprocesses, which inherit
# the environment) binds to 127.0.0.1; this must happen before anything imports Ray.
keep_local_ray_on_loopback()
# One thread, as in a 1-CPU Ray trial: the same float reductions, and no oversubscription
# of a 2-core machine while Ray workers run beside the test process.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest modules first. Under `--dist loadscope --no-loadscope-reorder` (pyproject.toml)
    each module goes whole to the next free worker in this order, so a long module of sweeps
    started last would keep one worker busy after the other has finished (xdist's own order,
    most tests first, put them last). A module's length is guessed from its number of `slow`
    (end-to-end) tests, then its number of tests; the sort is stable, so each module stays in
    one piece and in its own order. With pytest-randomly active (`pip install pytest-randomly`:
    a shuffled run, to find tests that depend on their order) its order stands."""
    if config.pluginmanager.has_plugin("randomly"):
        return
    slow, tests = Counter(), Counter()
    for item in items:
        tests[item.module] += 1
        slow[item.module] += item.get_closest_marker("slow") is not None
    items.sort(key=lambda item: (-slow[item.module], -tests[item.module]))


SCRATCH = pytest.StashKey[str]()
"""The stash key of the session's scratch folder (`pytest_configure`)."""


def pytest_configure(config: pytest.Config) -> None:
    """Give every process the tests start, and this process's Ray, a scratch temporary folder:
    Ray's session folders (logs, spilled objects), the temporary checkpoint folders of trials
    that a test kills mid-save and W&B's offline staging all land there, and it is removed when
    the session ends (`pytest_unconfigure`), so that a run leaves nothing behind in /tmp; with
    `tmp_path_retention_policy = "failed"` (pyproject.toml) only failed tests' folders stay.

    A short path under /tmp, as Ray's socket paths need. This process keeps its own temporary
    folder (`gettempdir` caches it first): pytest's basetemp is there."""
    tempfile.gettempdir()
    scratch = tempfile.mkdtemp(prefix="relif-tests-", dir="/tmp")
    config.stash[SCRATCH] = scratch
    os.environ["RAY_TMPDIR"] = os.environ["TMPDIR"] = scratch


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's last hook: every Ray of the tests has stopped."""
    shutil.rmtree(config.stash[SCRATCH], ignore_errors=True)


BUCKET = "relif"
"""The bucket of the moto S3 server of `s3_server`."""
MOTO_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
"""Credentials for the moto S3 servers of the tests (moto takes any signed request)."""

TINY_DATA = {"train": 24, "val": 12, "height": 32, "width": 40}
TINY_ERM_SQUASH = {"depth": [4.8131, 4.9289], "normal": [3.9598, 4.0494]}
"""q10/q90 (rounded) of the validation depth/normal scores of the ERM run of `tiny_config` on
the tiny data (seed 0, 2 epochs): the paper's squash constants for ReLiF runs in tests."""


HANG_GUARD_S = 1800
"""How long a test waits for a process or a condition before it calls it hung. A guard against
hangs, never a speed check: with two busy processes beside the suite on 2 cores, its sweeps ran
7 to 10 times slower than on the idle machine (a 40-s fixture took 370 s), so every wait of the
suite is this long, and a wait on a process also ends when the process does."""


ONE_TRIAL_AT_A_TIME = ("--max-concurrent-trials", "1")
"""For a test sweep whose trials need not overlap: trials of a second or two each run in turn
on one trial worker, which Tune reuses. A second worker would spend longer starting (Python,
torch, torchvision and Ray Tune: about 4.5 s of CPU) than the trials it could take over, on a
machine whose 2 cores the tests already keep busy."""


def needs_cuda(test: Callable) -> Callable:
    """A CUDA-only test: marked `cuda` (the GPU check runs `pytest -m cuda`), skipped without
    a CUDA device."""
    skip = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
    return pytest.mark.cuda(skip(test))


def tiny_config(root: str | Path, **train: object) -> dict:
    """An ExperimentConfig dict for fast CPU runs on the tiny synthetic data."""
    return {
        "seed": 0,
        "data": {"dataset": "nyuv2", "root": str(root)},
        "model": {"backbone": "resnet18", "head_channels": 16},
        "train": {"epochs": 2, "batch_size": 6, "eval_batch_size": 12, "lr": 1e-3, **train},
        "relif": {"squash_constants": TINY_ERM_SQUASH},
    }


def tiny_resnet(name: str, pretrained: str = "none") -> tuple[torch.nn.Sequential, int]:
    """A ResNet-18 layout (stem, four layers of two basic blocks, output stride 8) at widths
    4, 4, 8, 8, 8 (30k parameters): what `relif_ray.models.dense.resnet_encoder` returns,
    small."""
    from torch import nn
    from torchvision.models.resnet import BasicBlock

    def layer(in_channels: int, width: int, stride: int) -> nn.Sequential:
        shortcut = nn.Sequential(
            nn.Conv2d(in_channels, width, 1, stride=stride, bias=False), nn.BatchNorm2d(width)
        )
        return nn.Sequential(
            BasicBlock(in_channels, width, stride=stride, downsample=shortcut),
            BasicBlock(width, width),
        )

    stem = [
        nn.Conv2d(3, 4, 7, stride=2, padding=3, bias=False),
        nn.BatchNorm2d(4),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1),
    ]
    layers = [layer(4, 4, 1), layer(4, 8, 2), layer(8, 8, 1), layer(8, 8, 1)]
    return nn.Sequential(*stem, *layers), 8


@contextlib.contextmanager
def tiny_resnets() -> Iterator[None]:
    """Every NYUv2 model built inside (hard sharing and every architecture's experts) on
    `tiny_resnet`: for tests whose claim holds for any ResNet of torchvision's blocks (a
    method's or an architecture's plumbing, exact equality, what a step does) and whose time
    would go to ResNet-18's 11M parameters (their gradients, Adam's step)."""
    from relif_ray.models import dense, experts

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dense, "resnet_encoder", tiny_resnet)
        patch.setattr(experts, "resnet_encoder", tiny_resnet)
        yield


@pytest.fixture
def tiny_encoders() -> Iterator[None]:
    """The test's models are built on `tiny_resnet` (`tiny_resnets`)."""
    with tiny_resnets():
        yield


@pytest.fixture(scope="session")
def nyuv2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny synthetic NYUv2 data set in the real on-disk layout, written once per session."""
    from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2

    root = tmp_path_factory.mktemp("nyuv2") / "data"
    return write_synthetic_nyuv2(root, seed=0, **TINY_DATA)


@pytest.fixture(scope="module")
def sweep_folder(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Path]:
    """A folder for one module's sweeps, removed when the module's tests end unless one of them
    failed: a ResNet-18 trial's checkpoint is 150 MB (weights and Adam's two moments), so the
    sweeps of all modules kept to the session's end would hold gigabytes at once."""
    failed_before = request.session.testsfailed
    folder = tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2])
    yield folder
    if request.session.testsfailed == failed_before:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_session():
    """Local Ray with 2 CPUs and 2 logical GPUs (for fractional-GPU packing; trials still run
    on the CPU), no dashboard, bound to 127.0.0.1, with the settings of the local Ray a sweep
    starts, started once for all sweep tests. Its workers read the tests' S3 stores (moto) with
    credentials of their own (`MOTO_CREDENTIALS`), as a cluster's nodes do: a sweep that joins
    it never hands its workers the driver's."""
    import ray

    from relif_ray.tuning.cluster import LOCAL_RAY_SYSTEM_CONFIG

    with pytest.MonkeyPatch.context() as patch:  # the Ray processes inherit them, not this one
        for name, value in MOTO_CREDENTIALS.items():
            patch.setenv(name, value)
        ray.init(
            num_cpus=2,
            num_gpus=2,
            include_dashboard=False,
            ignore_reinit_error=True,
            _system_config=LOCAL_RAY_SYSTEM_CONFIG,
        )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def small_data(tmp_path_factory) -> Path:
    """12 train / 6 val images of 32x40 and a test split (a copy of val), so outputs cover val
    AND test; with batch 6 an epoch is 2 steps."""
    from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2

    sizes = {**TINY_DATA, "train": 12, "val": 6}
    root = write_synthetic_nyuv2(tmp_path_factory.mktemp("small") / "data", seed=0, **sizes)
    shutil.copytree(root / "val", root / "test")
    return root


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> dict:
    """A moto S3 server on 127.0.0.1 holding a generated experiment and a score file under
    s3://relif/results/; yields the endpoint and the local copies."""
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    from relif_ray.testing.synthetic_experiment import write_synthetic_experiment

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    local = tmp_path_factory.mktemp("local")
    experiment = write_synthetic_experiment(
        local / "nyuv2",
        labels=("erm", "pcgrad", "relif"),
        seeds=2,
        n_examples=24,
        splits=("val", "test"),
        errored=1,
        incomplete=1,
    )
    scores = local / "scores"
    scores.mkdir()
    frame = pd.read_parquet(next(experiment.glob("*/checkpoint_000000/outputs/scores.parquet")))
    frame[frame["task"] == "seg"].assign(task="a").pipe(
        lambda seg: pd.concat([seg, seg.assign(task="b", score=1 - seg["score"])])
    ).to_parquet(scores / "scores.parquet")
    pd.read_parquet(scores / "scores.parquet").to_csv(scores / "scores.csv", index=False)
    upload = pafs.S3FileSystem(
        endpoint_override=f"{host}:{port}",
        scheme="http",
        region="us-east-1",
        access_key="testing",
        secret_key="testing",
        allow_bucket_creation=True,
    )
    upload.create_dir(BUCKET)
    pafs.copy_files(str(local), f"{BUCKET}/results", destination_filesystem=upload)
    yield {"endpoint": f"http://{host}:{port}", "host": f"{host}:{port}", "local": local}
    server.stop()


@pytest.fixture
def s3(s3_server: dict, monkeypatch) -> dict:
    """Credentials and the endpoint the way a user sets them (environment variables)."""
    for name, value in {
        **MOTO_CREDENTIALS,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_ENDPOINT_URL": s3_server["endpoint"],
    }.items():
        monkeypatch.setenv(name, value)
    storage._bucket_filesystem.cache_clear()
    yield s3_server
    storage._bucket_filesystem.cache_clear()


@pytest.fixture
def no_sweep(monkeypatch):
    """A flag set that passes every check must fail the test, not start a sweep."""
    import relif_ray.tuning.launch

    def refuse(*args, **kwargs):
        raise AssertionError("the flags were accepted and a sweep would start")

    monkeypatch.setattr(relif_ray.tuning.launch, "run_sweep", refuse)


@pytest.fixture
def isolated_registry(monkeypatch):
    """Plug-ins imported by a test register into a copy of the method registry, and their
    folders join copies of the method and benchmark packages' paths, all restored afterwards;
    their modules are forgotten, so the next test's folder is imported afresh and no plug-in
    of one test is seen by another."""
    import relif_ray.methods as methods_package
    import relif_ray.problems as problems_package
    from relif_ray.methods import registry

    monkeypatch.setattr(registry, "METHODS", dict(registry.METHODS))
    for package in (methods_package, problems_package):
        monkeypatch.setattr(package, "__path__", list(package.__path__))
    before = set(sys.modules)
    yield registry
    for name in set(sys.modules) - before:
        if name.startswith((f"{methods_package.__name__}.", f"{problems_package.__name__}.")):
            del sys.modules[name]


def in_code(space, name: str, storage: str | Path, **fields) -> SweepRequest:  # noqa: ANN001
    """A sweep's request built in code, as the tests launch it with
    `relif_ray.tuning.launch.run_sweep` (`space` None: a resume): a checkpoint after every
    epoch, without the command's floor of seconds between two."""
    return SweepRequest(
        name=name, storage=str(storage), space=space, checkpoint_interval_s=0.0, **fields
    )
