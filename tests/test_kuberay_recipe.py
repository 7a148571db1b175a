"""docs/examples/kuberay_rayjob.yaml is a KubeRay RayJob whose entrypoint is a sweep command the
sweep's parser accepts as written (every flag one of its flags, the whole request checked as a
sweep checks it before Ray starts), on a cluster that has what the command asks for: token
authentication, the GPUs it counts, and the data and storage paths mounted on every pod."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from relif_ray.cli.sweep import DATASETS, NYUV2, sweep_request
from relif_ray.cli.sweep_flags import build_parser

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "docs" / "examples" / "kuberay_rayjob.yaml"
IMAGE_REPOSITORY = "/workspace/relif-ray"
"""Where the manifest's image holds this repository (its pods' working directory)."""


def documents() -> list[dict]:
    return list(yaml.safe_load_all(MANIFEST.read_text()))


def manifest() -> dict:
    """The RayJob (after the claims it mounts)."""
    (job,) = [document for document in documents() if document["kind"] == "RayJob"]
    return job


def entrypoint_argv() -> list[str]:
    words = shlex.split(manifest()["spec"]["entrypoint"])
    assert words[:2] == ["relif", "sweep"]
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
    request = sweep_request(argv, None, tuple(DATASETS), None)
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


def test_the_claims_are_defined_with_their_access_modes_and_mounted_as_such():
    """The data claim is read by every pod (ReadOnlyMany, mounted read-only), the results
    claim written by every pod (ReadWriteMany); both are defined in the file itself."""
    claims = {
        document["metadata"]["name"]: document["spec"]["accessModes"]
        for document in documents()
        if document["kind"] == "PersistentVolumeClaim"
    }
    assert claims == {"nyuv2-data": ["ReadOnlyMany"], "relif-results": ["ReadWriteMany"]}
    for pod, _ in pod_groups():
        volumes = {v["name"]: v["persistentVolumeClaim"] for v in pod["volumes"]}
        assert volumes["nyuv2"] == {"claimName": "nyuv2-data", "readOnly": True}
        assert volumes["results"] == {"claimName": "relif-results"}


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
