#!/bin/bash
# A relif-ray sweep on a Slurm allocation: a Ray head on the first node, a Ray worker on each
# other node, token authentication, the sweep as the driver on the head, Ray stopped at the end.
#
#   sbatch docs/examples/slurm_sweep.sh [MORE SWEEP FLAGS]     (from the repository's folder)
#
# Every node needs the same Python environment (activate it before sbatch: srun passes the
# environment on), the data at DATA_DIR and STORAGE on a shared file system (NFS, Lustre), or
# an s3:// or gs:// URI. The #SBATCH lines and the settings below are the only lines a site
# changes (the GPU and CPU counts come from Slurm's own variables); the flags given to sbatch
# after the script's name are added to the sweep (e.g. --methods erm,relif). The sweep's
# output is unbuffered, so the job's log follows it.
# Five minutes before the time limit Slurm sends USR1 to this script, which stops the sweep
# gracefully and requeues the job; the requeued job runs the same command, which resumes it.
# docs/cluster.md explains each step; tests/test_slurm_recipe.py runs this script with a
# simulated two-node allocation on 127.0.0.1.
#
#SBATCH --job-name=relif-nyuv2
#SBATCH --nodes=2
#SBATCH --exclusive
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=32
#SBATCH --gpus-per-node=8
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@300
#SBATCH --requeue

set -euo pipefail

DATA_DIR=${DATA_DIR:-/data/nyuv2}             # the same path on every node
STORAGE=${STORAGE:-/nfs/relif-results}        # seen by every node
NAME=${NAME:-nyuv2-table1}
RAY_PORT=${RAY_PORT:-6379}                    # the head's GCS port, inside the cluster only
HEAD_WAIT=${HEAD_WAIT:-300}                   # seconds the Ray head may take to listen

# The resources as Slurm granted them: its variables, not a second copy of #SBATCH's numbers.
GPUS_PER_NODE=${SLURM_GPUS_ON_NODE:-0}
CPUS_PER_NODE=${SLURM_CPUS_PER_TASK}
# Ray's sockets and logs in a folder of this job's own (short: Unix socket paths are limited).
export RAY_TMPDIR=${RAY_TMPDIR:-/tmp/ray-$SLURM_JOB_ID}

# Token authentication: one random token for this job, known to every step through the
# environment that srun passes on; it is never written to disk.
export RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$(python -c "import secrets; print(secrets.token_hex(32))")
export RAY_AUTH_TOKEN

# The allocation: the first node is the head, the others are workers.
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
head_node=${nodes[0]}
# The head's IPv4 address on the cluster's network: `hostname --all-ip-addresses` lists the
# node's addresses without the loopback ones (127.0.1.1 from /etc/hosts), IPv6 ones may come
# first, and Ray's --node-ip-address takes the first IPv4 one here.
head_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --all-ip-addresses \
    | tr ' ' '\n' | grep -m1 -E '^[0-9]+(\.[0-9]+){3}$' || true)
if [[ -z $head_ip ]]; then
    echo "slurm_sweep.sh: $head_node has no IPv4 address (hostname --all-ip-addresses)" >&2
    exit 1
fi
workers=$((SLURM_JOB_NUM_NODES - 1))

steps=()
stop_ray() {  # SIGTERM to the Ray steps; `ray start --block` stops its node's processes
    if ((${#steps[@]})); then
        kill "${steps[@]}" 2>/dev/null || true
        wait "${steps[@]}" 2>/dev/null || true
    fi
}
trap stop_ray EXIT

wait_for_nodes() {  # until $1 Ray nodes are alive (a worker needs a few seconds to join)
    python - "$head_ip:$RAY_PORT" "$1" <<'EOF'
import sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR")
deadline = time.monotonic() + 300
while sum(node["Alive"] for node in ray.nodes()) < int(sys.argv[2]):
    if time.monotonic() > deadline:
        sys.exit(f"only {sum(n['Alive'] for n in ray.nodes())} of {sys.argv[2]} Ray nodes joined")
    time.sleep(1)
EOF
}

srun --nodes=1 --ntasks=1 -w "$head_node" \
    ray start --head --block --node-ip-address="$head_ip" --port="$RAY_PORT" \
    --num-cpus="$CPUS_PER_NODE" --num-gpus="$GPUS_PER_NODE" &
steps+=($!)
# The head's port, while its step lives and for at most HEAD_WAIT seconds: a head that
# failed to start ends the job now, not at its time limit.
deadline=$((SECONDS + HEAD_WAIT))
until (exec 3<>"/dev/tcp/$head_ip/$RAY_PORT") 2>/dev/null; do
    if ! kill -0 "${steps[0]}" 2>/dev/null; then
        echo "slurm_sweep.sh: the Ray head on $head_node exited before listening" >&2
        exit 1
    fi
    if ((SECONDS > deadline)); then
        echo "slurm_sweep.sh: no Ray head on $head_ip:$RAY_PORT after ${HEAD_WAIT}s" >&2
        exit 1
    fi
    sleep 1
done
if ((workers > 0)); then
    srun --nodes="$workers" --ntasks="$workers" --exclude="$head_node" \
        ray start --block --address="$head_ip:$RAY_PORT" \
        --num-cpus="$CPUS_PER_NODE" --num-gpus="$GPUS_PER_NODE" &
    steps+=($!)
fi
wait_for_nodes "$SLURM_JOB_NUM_NODES"

# The sweep, on the head node (the batch script runs there), as the cluster's driver; in a
# requeued job, the same command continues it (--resume-if-present).
python -u sweeps/nyuv2.py --address "$head_ip:$RAY_PORT" --data-dir "$DATA_DIR" \
    --storage "$STORAGE" --name "$NAME" --num-gpus $((SLURM_JOB_NUM_NODES * GPUS_PER_NODE)) \
    --resume-if-present "$@" &
driver=$!
requeue=0
stop_sweep() {  # the signal to the sweep: a graceful stop, exit status 75, while Ray still runs
    if [[ $1 == USR1 ]]; then requeue=1; fi  # the time limit's warning: continue in a new job
    kill "-$1" "$driver" 2>/dev/null || true
}
trap 'stop_sweep USR1' USR1
trap 'stop_sweep TERM' TERM
while kill -0 "$driver" 2>/dev/null; do wait "$driver" || true; done  # a signal ends a wait
status=0
wait "$driver" || status=$?
if ((status == 75 && requeue)); then
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
