"""A real multi-node Ray cluster on this machine, every node bound to 127.0.0.1, run in its own
process so that the test process never connects to it (nor changes its Ray state).

    python -m tests.local_cluster WORKERS

starts a head node without CPUs (the drivers' node, as on a cluster where trials run on workers)
and WORKERS worker nodes with 1 CPU each, all under a private Ray temp dir (RAY_TMPDIR, set by
the caller), so neither `ray.init()` nor `--address auto` elsewhere on the machine finds it.
It prints one JSON line {"address": GCS address, "workers": [node ids]} and then obeys stdin:

    kill-node-of PID
               kill the processes of the worker node that runs process PID (a trial's
               worker), its trials' included, at once (a lost node); prints "killed", or
               "no node runs PID"
    add        start one more worker node; prints its node id
    listening  prints a JSON list of the addresses that the cluster's processes listen on
    (EOF)      shut every node down and exit

RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (set by the caller for this process and the drivers) makes
Ray resolve "this node" to 127.0.0.1 instead of the machine's network address, as it does on
a laptop: without it, `ray.init(address="127.0.0.1:PORT")` rewrites the address to the
machine's IP. The head's GCS notices a lost node after 10 missed 1 s health checks.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys

import psutil
from ray._private.node import Node
from ray.cluster_utils import Cluster

LOCALHOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOCALHOST, 0))
        return probe.getsockname()[1]


def add_worker(cluster: Cluster) -> Node:
    return cluster.add_node(num_cpus=1, node_ip_address=LOCALHOST)


def listening_addresses(root: psutil.Process | None = None) -> list[str]:
    """The IP addresses that `root` (this process by default) and its descendants (every
    node's processes that it started) listen on; IPv4 addresses in IPv6 form as IPv4."""
    root = root or psutil.Process()
    addresses = set()
    for process in [root, *root.children(recursive=True)]:
        try:
            connections = process.net_connections(kind="inet")
        except psutil.Error:
            continue
        listening = [c.laddr.ip for c in connections if c.status == psutil.CONN_LISTEN]
        addresses |= {ip.removeprefix("::ffff:") for ip in listening}
    return sorted(addresses)


def kill_node(cluster: Cluster, node: Node) -> None:
    """Kill every process of `node` at once, as when its machine is lost. Ray's `remove_node`
    kills the node's own processes (raylet, agents); the trial workers, children of the raylet,
    would go on until they notice that the raylet is gone, and under load a trial's last epochs
    could finish first, so the test saw no failure. They are killed with the node."""
    workers = node_processes(node)
    cluster.remove_node(node, allow_graceful=False)
    for worker in workers:
        with contextlib.suppress(psutil.Error):
            worker.kill()


def node_processes(node: Node) -> list[psutil.Process]:
    """The processes `node` started (raylet, agents) and theirs (the trial workers)."""
    processes = []
    for infos in node.all_processes.values():
        for info in infos:
            with contextlib.suppress(psutil.Error):
                started = psutil.Process(info.process.pid)
                processes += [started, *started.children(recursive=True)]
    return processes


def node_running(nodes: list[Node], pid: int) -> Node | None:
    """The node among `nodes` whose processes include `pid`."""
    for node in nodes:
        if any(process.pid == pid for process in node_processes(node)):
            return node
    return None


def main(workers: int) -> None:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "node_ip_address": LOCALHOST,
            "gcs_server_port": free_port(),
            "include_dashboard": False,
            "dashboard_agent_listen_port": free_port(),
            "_system_config": {
                "health_check_period_ms": 1000,
                "health_check_failure_threshold": 10,
            },
        },
    )
    nodes = [add_worker(cluster) for _ in range(workers)]
    try:
        print(json.dumps({"address": cluster.address, "workers": [n.node_id for n in nodes]}))
        sys.stdout.flush()
        for line in sys.stdin:
            command = line.split()
            if command[:1] == ["kill-node-of"]:
                node = node_running(nodes, int(command[1]))
                if node is not None:
                    kill_node(cluster, node)
                print("killed" if node else f"no node runs {command[1]}", flush=True)
            elif command == ["add"]:
                nodes.append(add_worker(cluster))
                print(nodes[-1].node_id, flush=True)
            elif command == ["listening"]:
                print(json.dumps(listening_addresses()), flush=True)
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]))
