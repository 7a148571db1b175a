"""The Ray a sweep runs on, and the checks of it before a sweep launches: join a cluster or
start local Ray (`connect`), and refuse a sweep no trial of which could ever be scheduled
(`check_cluster`: too few GPUs or CPUs, or a GPU node whose NVIDIA driver is older than its
torch needs, `check_gpu_stack`) or whose local storage the nodes of a cluster do not share
(`check_storage_visible`). `relif_ray.tuning.driver.check` runs them with the checks that need
no Ray.
"""

from __future__ import annotations

import logging
import socket
import uuid

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from relif_ray.errors import UserError, first_line
from relif_ray.experiment.storage import local_path, storage_problem
from relif_ray.gpu_stack import GpuStack, check_driver, describe, query_gpu_stack
from relif_ray.plugins import worker_env
from relif_ray.sweep.plan import Resources

LOGGER = logging.getLogger(__name__)


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """A `host:port` (or `ray://host:port`) address must accept a TCP connection: Ray itself
    retries an unreachable address for minutes."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and other forms: ray.init reports those itself, and quickly
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UserError(f"--address {address}: no Ray cluster answers there ({reason})") from None


LOCAL_RAY_SYSTEM_CONFIG = {"prestart_worker_first_driver": False}
"""Ray settings of the local Ray a sweep starts. Ray prestarts one idle worker per CPU when the
driver connects, but Tune's trial actors never took one: each idle worker only imported Ray,
held 80 to 190 MB and was killed at the end (measured with `benchmarks/cpu_by_process.py`: a
demo sweep of 4 trials ran 2 trial workers beside 2 idle ones, 0.3 to 1.3 s of CPU each)."""


def connect(resources: Resources) -> None:
    """Start local Ray or join the cluster at `resources.address` (unless already connected); its
    workers get the driver's plug-in paths (`relif_ray.plugins.worker_env`). Local Ray
    binds to 127.0.0.1 when the driver called `relif_ray.tuning.keep_local_ray_on_loopback` before
    importing Ray, as `relif_ray.tuning.run_sweep_request` does."""
    if ray.is_initialized():
        return
    runtime_env = {"env_vars": env} if (env := worker_env()) else None
    if resources.address:
        check_reachable(resources.address)
        try:
            ray.init(address=resources.address, runtime_env=runtime_env)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            reason = first_line(exc)
            raise UserError(f"--address {resources.address}: cannot connect ({reason})") from None
    else:
        ray.init(
            num_cpus=resources.num_cpus,
            include_dashboard=False,
            runtime_env=runtime_env,
            _system_config=LOCAL_RAY_SYSTEM_CONFIG,
        )


def check_cluster(resources: Resources) -> None:
    """Fail before any trial starts when no trial could ever be scheduled (Ray would wait
    forever): too few GPUs in the cluster, or a trial larger than every node; then, for GPU
    trials, the GPU stack of every GPU node (`check_gpu_stack`)."""
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    total = ray.cluster_resources()
    gpus = total.get("GPU", 0.0)
    where = "local Ray" if not resources.address else f"the Ray cluster at {resources.address}"
    if resources.num_gpus > gpus + 1e-9:
        raise UserError(
            f"--num-gpus {resources.num_gpus:g}: {where} has {gpus:g} GPU(s); "
            "no GPU trial could start (use --num-gpus 0 for CPU trials)"
        )
    for kind, asked, flag in (
        ("CPU", resources.cpus_per_trial, "--cpus-per-trial"),
        ("GPU", resources.gpus_per_trial, "--gpus-per-trial"),
    ):
        largest = max((node["Resources"].get(kind, 0.0) for node in nodes), default=0.0)
        if asked > largest + 1e-9:
            raise UserError(
                f"{flag} {asked:g}: the largest node of {where} has {largest:g} {kind}(s); "
                "no trial could start"
            )
    if resources.gpus_per_trial > 0:
        check_gpu_stack()


def gpu_node_stacks() -> list[tuple[str, GpuStack]]:
    """(address, GPU stack) of every live node that offers Ray GPUs, each read on its node by a
    task pinned there (`relif_ray.gpu_stack.query_gpu_stack`: `nvidia-smi` and the node's own
    torch), as a trial on that node would find it."""
    nodes = [
        node for node in ray.nodes() if node.get("Alive") and node["Resources"].get("GPU", 0.0) > 0
    ]
    remote_query = ray.remote(num_cpus=0)(query_gpu_stack)
    pending = [
        (
            node["NodeManagerAddress"],
            remote_query.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            ).remote(),
        )
        for node in nodes
    ]
    return [(address, ray.get(reference, timeout=120)) for address, reference in pending]


def check_gpu_stack() -> None:
    """Log the GPU stack of each GPU node (driver, CUDA runtime, GPU models: one line per
    node), then refuse, in one line, the first node whose driver is older than its torch's
    CUDA runtime needs (`relif_ray.gpu_stack.check_driver`). A node without an NVIDIA driver
    (Ray's GPUs declared with `--num-gpus` on a machine without any) is logged, not refused."""
    stacks = gpu_node_stacks()
    for address, stack in stacks:
        LOGGER.info("GPU node %s: %s", address, describe(stack))
    for address, stack in stacks:
        check_driver(stack, f"GPU node {address}")


def check_storage_visible(storage_path: str) -> None:
    """On a multi-node cluster, a local `--storage` path must be one shared directory (NFS):
    the driver writes a probe file with a random token and a task pinned to each node reads it
    back and writes next to it (`storage_problem`, which lives in the storage module so that
    the task's worker imports no more than it: no torch, no Ray Tune, a fraction of a second of
    CPU on each node instead of 3.5 s). Object storage (s3://, gs://) is left to Ray's storage
    layer."""
    root = local_path(storage_path)
    if root is None:
        return
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    if len(nodes) <= 1:
        return
    root.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    probe = root / f".relif-storage-probe-{token}"
    probe.write_text(token)
    remote_check = ray.remote(num_cpus=0)(storage_problem)
    try:
        pending = {
            node["NodeManagerAddress"]: remote_check.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            ).remote(str(probe), token)
            for node in nodes
        }
        for address, reference in pending.items():
            problem = ray.get(reference, timeout=120)
            if problem:
                raise UserError(
                    f"--storage {storage_path}: {problem} on node {address}; a multi-node sweep "
                    "needs shared storage (an NFS path mounted on every node, or s3://...)"
                )
    finally:
        probe.unlink(missing_ok=True)
