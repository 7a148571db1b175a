"""docs/examples/kuberay_rayjob.yaml is a KubeRay RayJob whose entrypoint is a sweep command the
sweep's parser accepts as written (every flag one of its flags, the whole request checked as a
sweep checks it before Ray starts), on a cluster that has what the command asks for: token
authentication, the GPUs it counts, the data and storage paths mounted on every pod (claims of
the storage class it is applied with, the data loaded by a step of its own), a memory-backed
/dev/shm, and limits that end a stuck job. Its image (docs/examples/Dockerfile) leaves what
.dockerignore lists out, and says which NVIDIA driver its torch needs."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from relif_ray.cli.sweep import DATASETS, NYUV2, sweep_request
from relif_ray.cli.sweep_flags import build_parser
from relif_ray.problems import benchmark
from tests.conftest import TINY_DATA

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "docs" / "examples" / "kuberay_rayjob.yaml"
DOCKERFILE = REPO / "docs" / "examples" / "Dockerfile"
IMAGE_REPOSITORY = "/workspace/relif-ray"
"""Where the manifest's image holds this repository (its pods' working directory)."""
PARAMETERS = {"STORAGE_CLASS": "nfs-client", "DATA_URI": "s3://my-bucket/nyuv2"}
"""The manifest's placeholders, filled in by envsubst as it is applied (its header)."""
DRIVER_FOR_CUDA = {12: 525, 13: 580}
"""The oldest NVIDIA Linux driver each CUDA major version runs on (NVIDIA's CUDA Compatibility
guide, "Minor Version Compatibility")."""


def filled(text: str, values: dict[str, str]) -> str:
    """`text` as `envsubst '$A $B'` makes it: each ${NAME} of `values` replaced."""
    return re.sub(r"\$\{(\w+)\}", lambda m: values.get(m[1], m[0]), text)


def documents() -> list[dict]:
    return list(yaml.safe_load_all(filled(MANIFEST.read_text(), PARAMETERS)))


def manifest() -> dict:
    """The RayJob (after the claims it mounts)."""
    (job,) = [document for document in documents() if document["kind"] == "RayJob"]
    return job


def entrypoint_argv() -> list[str]:
    words = shlex.split(manifest()["spec"]["entrypoint"])
    assert words[:2] == ["python", "sweeps/nyuv2.py"]
    return words[2:]


def pod_groups() -> list[tuple[dict, int]]:
    """(pod spec, replicas) of the head group and of every worker group."""
    cluster = manifest()["spec"]["rayClusterSpec"]
    groups = [(cluster["headGroupSpec"]["template"]["spec"], 1)]
    groups += [(g["template"]["spec"], g["replicas"]) for g in cluster["workerGroupSpecs"]]
    return groups


def flag_values(argv: list[str]) -> dict[str, str]:
    return {flag: value for flag, value in zip(argv, argv[1:], strict=False) if flag[:2] == "--"}


def test_the_manifest_is_a_rayjob_with_token_authentication():
    document = manifest()
    assert (document["apiVersion"], document["kind"]) == ("ray.io/v1", "RayJob")
    spec = document["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["rayClusterSpec"]["authOptions"] == {"mode": "token"}
    head = spec["rayClusterSpec"]["headGroupSpec"]
    assert head.get("serviceType", "ClusterIP") == "ClusterIP"  # nothing exposed outside


def test_every_flag_of_the_entrypoint_is_one_of_the_sweeps():
    argv = entrypoint_argv()
    known = {
        option
        for action in build_parser(NYUV2, tuple(DATASETS))._actions
        for option in action.option_strings
    }
    flags = [word for word in argv if word.startswith("--")]
    assert len(flags) >= 8 and set(flags) <= known, set(flags) - known


def test_the_entrypoint_passes_the_sweeps_own_checks(tmp_path):
    """The whole command through the sweep's parser and request checks (config composition
    and the preflight's model included), with the pod paths mapped to this checkout and a
    temporary folder, and random weights for the ImageNet ones (tests download nothing)."""
    argv = entrypoint_argv()
    local = {"/data/nyuv2": str(tmp_path), "/results": str(tmp_path / "results")}
    argv = [local.get(word, word) for word in argv] + ["--pretrained", "none"]
    request = sweep_request(argv, None, ("nyuv2",), False)  # as sweeps/nyuv2.py
    assert request.name == "nyuv2-table1"
    assert request.resources.num_gpus == 16 and request.resources.gpus_per_trial == 0.5
    assert request.resources.address == "auto"


def test_the_cluster_has_the_gpus_and_the_paths_the_entrypoint_names():
    values = flag_values(entrypoint_argv())
    gpus = sum(
        int(container["resources"]["limits"].get("nvidia.com/gpu", 0)) * replicas
        for pod, replicas in pod_groups()
        for container in pod["containers"]
    )
    assert gpus == int(values["--num-gpus"])
    for pod, _ in pod_groups():
        (container,) = pod["containers"]
        mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
        assert {values["--data-dir"], values["--storage"]} <= mounts
        assert container["workingDir"] == IMAGE_REPOSITORY
    assert "--config" not in values  # the paper's Table 1 grid, as the README's 8-GPU command


def test_the_placeholders_are_the_ones_the_apply_command_fills_in():
    """The header's command fills in exactly the manifest's placeholders; with them filled in,
    both claims are of the storage class given."""
    text = MANIFEST.read_text()
    assert set(re.findall(r"\$\{(\w+)\}", text)) == set(PARAMETERS)
    assert "envsubst '$STORAGE_CLASS $DATA_URI' < docs/examples/kuberay_rayjob.yaml" in text
    classes = {
        document["metadata"]["name"]: document["spec"]["storageClassName"]
        for document in documents()
        if document["kind"] == "PersistentVolumeClaim"
    }
    assert classes == {"nyuv2-data": "nfs-client", "relif-results": "nfs-client"}


def test_the_claims_are_defined_with_their_access_modes_and_mounted_as_such():
    """Both claims are shared by every pod (ReadWriteMany) and defined in the file itself; the
    sweep's containers mount the data read-only (the workers' pods claim it read-only), the
    results writable."""
    claims = {
        document["metadata"]["name"]: document["spec"]["accessModes"]
        for document in documents()
        if document["kind"] == "PersistentVolumeClaim"
    }
    assert claims == {"nyuv2-data": ["ReadWriteMany"], "relif-results": ["ReadWriteMany"]}
    values = flag_values(entrypoint_argv())
    for index, (pod, _) in enumerate(pod_groups()):
        volumes = {v["name"]: v.get("persistentVolumeClaim") for v in pod["volumes"]}
        assert volumes["nyuv2"]["claimName"] == "nyuv2-data"
        assert volumes["results"] == {"claimName": "relif-results"}
        for container in pod["containers"]:
            mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
            assert mounts[values["--data-dir"]].get("readOnly") is True
            # the head reads the claim, a worker its node-local copy (`staging_step`)
            assert mounts[values["--data-dir"]]["name"] == ("nyuv2" if index == 0 else "staged")
            assert not mounts[values["--storage"]].get("readOnly", False)
    for pod, _ in pod_groups()[1:]:  # the workers' pods: only the head's load step writes
        (data,) = [v for v in pod["volumes"] if v["name"] == "nyuv2"]
        assert data["persistentVolumeClaim"]["readOnly"] is True


def staging_step(pod: dict) -> dict:
    (step,) = pod["initContainers"]
    return step


def test_every_worker_stages_the_data_to_its_node_local_disk_before_it_starts(tmp_path):
    """Each worker pod's init container (before its Ray node, and so its trials, start) mounts
    the claim read-only and a node-local emptyDir at the data path, and copies the one into the
    other, whole: run here on a folder of NYUv2 files, the sweep's own data check passes on the
    copy."""
    from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2

    data_dir = flag_values(entrypoint_argv())["--data-dir"]
    for pod, _ in pod_groups()[1:]:
        step = staging_step(pod)
        mounts = {mount["name"]: mount["mountPath"] for mount in step["volumeMounts"]}
        assert mounts["staged"] == data_dir
        assert [m.get("readOnly") for m in step["volumeMounts"]] == [True, None]  # the claim
        (staged,) = [v for v in pod["volumes"] if v["name"] == "staged"]
        assert "emptyDir" in staged and "medium" not in staged["emptyDir"]  # disk, not memory
        claim = write_synthetic_nyuv2(tmp_path / "claim", seed=0, **TINY_DATA)
        local = tmp_path / "local"
        local.mkdir()
        script = step["args"][0].replace(mounts["nyuv2"], str(claim)).replace(data_dir, str(local))
        done = subprocess.run([*step["command"], script], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        copied = sorted(p.relative_to(local) for p in local.rglob("*") if p.is_file())
        assert copied == sorted(p.relative_to(claim) for p in claim.rglob("*") if p.is_file())
        benchmark("nyuv2").check(str(local))


def load_data_step() -> dict:
    head = manifest()["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    (step,) = head["initContainers"]
    return step


def test_the_head_loads_the_data_into_its_claim_before_it_starts():
    """An init container of the head (so before Ray and the sweep start) mounts the data claim
    writable at the data path, the only mount of it that is, and copies DATA_URI there."""
    step = load_data_step()
    data_dir = flag_values(entrypoint_argv())["--data-dir"]
    assert step["volumeMounts"] == [{"name": "nyuv2", "mountPath": data_dir}]
    assert {"name": "SOURCE", "value": PARAMETERS["DATA_URI"]} in step["env"]
    (image,) = {container["image"] for container in pod_groups()[0][0]["containers"]}
    assert step["image"] == image


def run_load_step(source: str, target: Path) -> subprocess.CompletedProcess:
    """The load step's script as the pod runs it, on this machine's `target`."""
    step = load_data_step()
    script = step["args"][0].replace(flag_values(entrypoint_argv())["--data-dir"], str(target))
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # the image's python: ours
    return subprocess.run(
        [*step["command"], script], env={**os.environ, "SOURCE": source, "PATH": path}, cwd=REPO,
        capture_output=True, text=True,
    )  # fmt: skip


def test_the_load_step_copies_a_data_set_the_reader_accepts_once(tmp_path):
    """Run on a folder of NYUv2 files, the step copies it whole (the sweep's own data check
    passes on the copy) and marks it done; run again, it copies nothing (a restarted head does
    not load the data again), so a source that is gone by then does not matter."""
    from relif_ray.data.synthetic_nyuv2 import write_synthetic_nyuv2

    source = write_synthetic_nyuv2(tmp_path / "source", seed=0, **TINY_DATA)
    target = tmp_path / "claim" / "nyuv2"
    target.mkdir(parents=True)
    done = run_load_step(str(source), target)
    assert done.returncode == 0, done.stderr
    copied = sorted(p.relative_to(target) for p in target.rglob("*") if p.is_file())
    original = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
    assert copied == sorted([*original, Path(".relif-loaded")]) and len(original) > 8
    benchmark("nyuv2").check(str(target))
    again = run_load_step(str(tmp_path / "gone"), target)
    assert again.returncode == 0, again.stderr
    failed = run_load_step(str(tmp_path / "gone"), tmp_path / "empty")
    assert failed.returncode != 0  # nothing loaded yet, and nothing to load: the step fails


def test_every_pod_has_a_memory_backed_dev_shm():
    for pod, _ in pod_groups():
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            (shm,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
            assert volumes[shm["name"]]["emptyDir"]["medium"] == "Memory"


def test_a_stuck_job_ends_and_a_failed_one_is_retried_where_it_stopped():
    """activeDeadlineSeconds ends a job that runs too long; backoffLimit retries a failed one
    on a new cluster, whose sweep continues the experiment (--resume-if-present)."""
    spec = manifest()["spec"]
    assert isinstance(spec["activeDeadlineSeconds"], int) and spec["activeDeadlineSeconds"] > 0
    assert isinstance(spec["backoffLimit"], int) and spec["backoffLimit"] >= 1
    assert "--resume-if-present" in entrypoint_argv()


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker's build context leaves `path` (relative to the root) out: a pattern
    matches the path or one of its parent folders."""
    parts = path.split("/")
    for depth, name in enumerate(parts):
        prefix = "/".join(parts[: depth + 1])
        for pattern in patterns:
            anywhere = pattern.startswith("**/")
            if fnmatch.fnmatch(name if anywhere else prefix, pattern.removeprefix("**/")):
                return True
    return False


def test_the_image_leaves_the_environment_history_data_and_results_out():
    """`COPY . .` of the Dockerfile copies the build context less .dockerignore: never the
    virtual environment, the git history, data or results, always what the install needs."""
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    for path in (".venv/bin/python", ".git/HEAD", "data/nyuv2/train/image/0.npy",
                 "results/x", "relif-results/nyuv2-demo/x", "relif-data/x"):  # fmt: skip
        assert ignored(path, patterns), path
    for path in ("pyproject.toml", "README.md", "LICENSE", "relif_ray/data/nyuv2.py",
                 "relif_ray/audit.py", "analysis/__init__.py", "sweeps/nyuv2.py"):  # fmt: skip
        assert (REPO / path).exists() and not ignored(path, patterns), path
    assert "COPY --chown=ray:users . ." in DOCKERFILE.read_text()


def test_the_dockerfile_states_the_driver_its_torch_needs():
    """The Dockerfile's torch, where it is the one installed here as a CUDA build, needs the
    driver of its CUDA major version (from the wheel's own requirements), and says so."""
    text = DOCKERFILE.read_text()
    (pinned,) = re.findall(r"torch==([\d.]+)", text)
    driver = re.search(r"driver >= (\d+)", text)
    assert driver, "the Dockerfile names no driver version"
    installed = importlib.metadata.version("torch").split("+")[0]
    toolkits = [
        re.search(r"==(\d+)\.", requirement)
        for requirement in importlib.metadata.requires("torch") or []
        if requirement.startswith("cuda-toolkit")
    ]
    if installed != pinned or not toolkits:
        pytest.skip(f"torch {installed} here, not the Dockerfile's CUDA build of {pinned}")
    assert int(driver[1]) == DRIVER_FOR_CUDA[int(toolkits[0][1])]


def test_the_image_is_pinned_and_built_on_rays_image_of_the_clusters_version():
    """Every pod runs one pinned tag (never :latest); docs/examples/Dockerfile builds it on
    Ray's own image at the cluster's rayVersion, which has the bash and wget of KubeRay's
    probes; the head advertises no CPUs, so that trials run on the workers."""
    cluster = manifest()["spec"]["rayClusterSpec"]
    images = {container["image"] for pod, _ in pod_groups() for container in pod["containers"]}
    (image,) = images
    tag = image.rsplit(":", 1)[1]
    assert tag != "latest" and tag.endswith(f"ray{cluster['rayVersion']}")
    dockerfile = (REPO / "docs" / "examples" / "Dockerfile").read_text()
    (base,) = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("FROM ")]
    assert base.startswith(f"rayproject/ray:{cluster['rayVersion']}-")
    assert f"-t {image}" in dockerfile  # its build command makes the manifest's tag
    assert cluster["headGroupSpec"]["rayStartParams"] == {"num-cpus": "0"}
