#!/bin/bash
# A relif-ray sweep on a Slurm allocation: a Ray head on the first node, a Ray worker on each
# other node, token authentication, the sweep as the driver on the head, Ray stopped at the end.
#
#   sbatch docs/examples/slurm_sweep.sh [MORE SWEEP FLAGS]     (from the repository's folder)
#
# Every node needs the same Python environment (activate it before sbatch: srun passes the
# environment on), the data at DATA_DIR and STORAGE on a shared file system (NFS, Lustre), or
# an s3:// or gs:// URI. The settings below are the only lines a site changes; the flags given
# to sbatch after the script's name are added to the sweep (e.g. --methods erm,relif).
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
GPUS_PER_NODE=${GPUS_PER_NODE:-8}             # as --gpus-per-node above
RAY_PORT=${RAY_PORT:-6379}                    # the head's GCS port, inside the cluster only

# Token authentication: one random token for this job, known to every step through the
# environment that srun passes on; it is never written to disk.
export RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$(python -c "import secrets; print(secrets.token_hex(32))")
export RAY_AUTH_TOKEN

# The allocation: the first node is the head, the others are workers.
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
head_node=${nodes[0]}
head_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address | awk '{print $1}')
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
    --num-cpus="$SLURM_CPUS_PER_TASK" --num-gpus="$GPUS_PER_NODE" &
steps+=($!)
until (exec 3<>"/dev/tcp/$head_ip/$RAY_PORT") 2>/dev/null; do sleep 1; done
if ((workers > 0)); then
    srun --nodes="$workers" --ntasks="$workers" --exclude="$head_node" \
        ray start --block --address="$head_ip:$RAY_PORT" \
        --num-cpus="$SLURM_CPUS_PER_TASK" --num-gpus="$GPUS_PER_NODE" &
    steps+=($!)
fi
wait_for_nodes "$SLURM_JOB_NUM_NODES"

# The sweep, on the head node (the batch script runs there), as the cluster's driver; in a
# requeued job, the same command continues it (--resume-if-present).
python sweeps/nyuv2.py --address "$head_ip:$RAY_PORT" --data-dir "$DATA_DIR" \
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
