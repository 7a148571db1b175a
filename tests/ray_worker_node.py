"""Stands in for a worker node's `ray start --block --address=HEAD:PORT --num-cpus=N --num-gpus=G`
in the simulated Slurm allocation of tests/test_slurm_recipe.py: it starts the node that this
command starts (`ray._private.node.Node`, as `ray start` and `ray.cluster_utils` do), bound to
127.0.0.1, and stops the node's processes on SIGTERM, as `ray start --block` does.

    python -m tests.ray_worker_node --block --address=127.0.0.1:PORT --num-cpus=1 --num-gpus=0

Why a stand-in: on one machine, the second node of a cluster bound to 127.0.0.1 needs
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (else Ray replaces 127.0.0.1 by the machine's network
address, `tests/local_cluster.py`), and with it Ray's command line refuses to start a worker
node ("Multi-node Ray clusters are not supported"); the head's `ray start` runs as written.
"""

from __future__ import annotations

import argparse
import time

from ray._private.node import Node
from ray._private.parameter import RayParams

LOCALHOST = "127.0.0.1"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="ray start (worker node stand-in)")
    parser.add_argument("--block", action="store_true", required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--num-cpus", type=int, required=True)
    parser.add_argument("--num-gpus", type=int, required=True)
    args = parser.parse_args(argv)
    params = RayParams(
        gcs_address=args.address,
        node_ip_address=LOCALHOST,
        num_cpus=args.num_cpus,
        num_gpus=args.num_gpus,
        object_store_memory=150 * 1024**2,
        include_log_monitor=False,
        node_manager_port=0,
        min_worker_port=0,
        max_worker_port=0,
    )
    Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)
    while True:  # SIGTERM: the node's handler drains it, kills its processes and exits
        time.sleep(1)


if __name__ == "__main__":
    main()
