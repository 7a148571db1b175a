#!/bin/bash
# A relif-ray sweep on a Slurm allocation: a Ray head on the first node, a Ray worker on each
# other node, token authentication, the sweep as the driver on the head, Ray stopped at the end.
#
#   sbatch docs/examples/slurm_sweep.sh [SWEEP COMMAND]     (from the repository's folder)
#
# The arguments are the sweep's whole command line, any sweep of sweeps/ or `relif sweep`:
#   sbatch docs/examples/slurm_sweep.sh python sweeps/tabular.py --preset actg175 \
#       --storage /nfs/relif-results
# Without arguments it runs the paper's Table 1 grid on NYUv2 (the command below, `set --`).
# The script adds what the allocation decides: --address (its Ray head), --num-gpus (nodes x
# GPUs per node) and --resume-if-present (a requeued job continues the sweep).
#
# Every node needs the same Python environment (activate it before sbatch: srun passes the
# environment on), the data at the path the command names and its --storage on a shared file
# system (NFS, Lustre), or an s3:// or gs:// URI. With STAGE_DIR set (a node-local folder, at
# the same path on every node), the data set the command names (--data-dir or --data) is first
# copied there on every node, once, and the sweep reads that copy. The #SBATCH lines and the
# settings below are the only lines a site changes (the GPU and CPU counts come from Slurm's
# own variables). The sweep's output is unbuffered, so the job's log follows it.
# Five minutes before the time limit Slurm sends USR1 to this script, which stops the sweep
# gracefully and requeues the job; the requeued job runs the same command, which resumes it.
# docs/cluster.md explains each step; tests/test_slurm_recipe.py runs this script with a
# simulated two-node allocation on 127.0.0.1.
#
# The ports Ray uses between the allocation's nodes (a firewall between them must let them
# through; none of them is for outside the cluster): on the head, the GCS at RAY_PORT (6379),
# the Ray Client server 10001 and the dashboard 8265; on every node, the node manager, the
# object manager, the runtime-env agent, the dashboard agent's gRPC port and the metrics
# export port (each random unless ray start's --node-manager-port, --object-manager-port,
# --runtime-env-agent-port, --dashboard-agent-grpc-port and --metrics-export-port pin it),
# the dashboard agent's HTTP port 52365, and one port per worker process in 10002-19999
# (--min-worker-port, --max-worker-port).
#
#SBATCH --job-name=relif-sweep
#SBATCH --nodes=2
#SBATCH --exclusive
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=32
#SBATCH --gpus-per-node=8
#SBATCH --mem=0                  # all of each node's memory (or a size: --mem=500G)
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@300
#SBATCH --requeue

set -euo pipefail

if (($# == 0)); then  # the paper's Table 1 grid (docs/cluster.md)
    set -- python sweeps/nyuv2.py --data-dir /data/nyuv2 --pretrained imagenet \
        --storage /nfs/relif-results --name nyuv2-table1
fi
STAGE_DIR=${STAGE_DIR:-}                      # a node-local folder to copy the data to; unset: none
RAY_PORT=${RAY_PORT:-6379}                    # the head's GCS port, inside the cluster only
HEAD_WAIT=${HEAD_WAIT:-300}                   # seconds the Ray head may take to listen
JOIN_WAIT=${JOIN_WAIT:-600}                   # seconds every node may take to join the head
# The head's address on the network the nodes share. Unset: the head node's first IPv4
# address; on nodes with several networks (docker0, InfiniBand, a management network) name
# it, or the head's interface on it (e.g. HEAD_INTERFACE=eth0 or ib0).
HEAD_IP=${HEAD_IP:-}
HEAD_INTERFACE=${HEAD_INTERFACE:-}
for wait in HEAD_WAIT JOIN_WAIT; do
    if [[ ! ${!wait} =~ ^[0-9]+$ ]]; then
        echo "slurm_sweep.sh: $wait must be a whole number of seconds, got '${!wait}'" >&2
        exit 1
    fi
done

# The sweep command: a program first; the flags the script sets are not the command's.
if [[ $1 == -* ]]; then
    echo "slurm_sweep.sh: the arguments are the sweep command (python sweeps/NAME.py ...), got '$1' first" >&2
    exit 1
fi
sweep=("$@")
data_at=()  # the positions of the data flag's value in sweep
for i in "${!sweep[@]}"; do
    case ${sweep[i]} in
        --address | --address=* | --num-gpus | --num-gpus=*)
            echo "slurm_sweep.sh: ${sweep[i]%%=*} is set by the script (from the allocation), not by the sweep command" >&2
            exit 1
            ;;
        --data-dir | --data) data_at+=($((i + 1))) ;;
    esac
done

# The resources as Slurm granted them: its variables, not a second copy of #SBATCH's numbers.
GPUS_PER_NODE=${SLURM_GPUS_ON_NODE:-0}
CPUS_PER_NODE=${SLURM_CPUS_PER_TASK}
# Each Ray step asks for its node's CPUs and GPUs itself: srun does not pass on sbatch's
# --cpus-per-task (Slurm 22.05 and newer), and a step that asks for no GPU may see none.
step_resources=(--cpus-per-task="$CPUS_PER_NODE")
if ((GPUS_PER_NODE > 0)); then
    step_resources+=(--gpus-per-node="$GPUS_PER_NODE")
fi
# Ray's sockets and logs in a folder of this job's own (short: Unix socket paths are limited).
export RAY_TMPDIR=${RAY_TMPDIR:-/tmp/ray-$SLURM_JOB_ID}

# Token authentication: one random token for this job, known to every step through the
# environment that srun passes on; it is never written to disk.
export RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$(python -c "import secrets; print(secrets.token_hex(32))")
export RAY_AUTH_TOKEN

# Data staging: the data set copied to STAGE_DIR on every node (one task per node), unless an
# earlier job on that node finished copying the same source (the marker next to the copy); the
# sweep's data flag then names the copy. A resumed sweep's trials read the path they started
# with, so STAGE_DIR must be the same in a requeued job.
if [[ -n $STAGE_DIR ]]; then
    if ((${#data_at[@]} != 1)) || ((data_at[0] >= ${#sweep[@]})); then
        echo "slurm_sweep.sh: STAGE_DIR is set, but the sweep command names no one --data-dir or --data to copy" >&2
        exit 1
    fi
    source=$(realpath -e -- "${sweep[data_at[0]]}" 2>/dev/null) || {
        echo "slurm_sweep.sh: ${sweep[data_at[0] - 1]} ${sweep[data_at[0]]}: no such file or folder to stage" >&2
        exit 1
    }
    copy=$STAGE_DIR/$(basename -- "$source")
    stage='set -euo pipefail; source=$1; copy=$2; marker=$2.relif-staged; if [[ -e $marker && $(<"$marker") == "$source" ]]; then exit 0; fi; rm -rf -- "$copy" "$copy.partial" "$marker"; mkdir -p -- "$(dirname -- "$copy")"; cp -R -- "$source" "$copy.partial"; mv -- "$copy.partial" "$copy"; printf %s "$source" > "$marker"'
    srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 \
        bash -c "$stage" stage "$source" "$copy"
    sweep[data_at[0]]=$copy
    echo "slurm_sweep.sh: staged $source to $copy on every node"
fi

# The allocation: the first node is the head, the others are workers.
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
head_node=${nodes[0]}
# The head's IPv4 address on the cluster's network: HEAD_IP as given; else the address of
# HEAD_INTERFACE on the head node (`ip -4 -o addr show dev IF`); else the first IPv4 address
# `hostname --all-ip-addresses` lists (it leaves out the loopback ones, such as 127.0.1.1 from
# /etc/hosts; IPv6 ones may come first). The workers' Ray finds its own address on the route
# to this one.
ipv4='^[0-9]+(\.[0-9]+){3}$'
if [[ -n $HEAD_IP ]]; then
    head_ip=$HEAD_IP
    found_by="HEAD_IP"
elif [[ -n $HEAD_INTERFACE ]]; then
    head_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" ip -4 -o addr show dev "$HEAD_INTERFACE" \
        | awk '{sub("/.*", "", $4); print $4}' | grep -m1 -E "$ipv4" || true)
    found_by="interface $HEAD_INTERFACE"
else
    head_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --all-ip-addresses \
        | tr ' ' '\n' | grep -m1 -E "$ipv4" || true)
    found_by="hostname --all-ip-addresses"
fi
if [[ ! $head_ip =~ $ipv4 ]]; then
    echo "slurm_sweep.sh: no IPv4 address for the Ray head on $head_node ($found_by)" >&2
    exit 1
fi
echo "slurm_sweep.sh: the Ray head is $head_ip:$RAY_PORT on $head_node ($found_by)"
workers=$((SLURM_JOB_NUM_NODES - 1))

steps=()
stop_ray() {  # SIGTERM to the Ray steps; `ray start --block` stops its node's processes
    if ((${#steps[@]})); then
        kill "${steps[@]}" 2>/dev/null || true
        wait "${steps[@]}" 2>/dev/null || true
    fi
}
trap stop_ray EXIT

wait_for_nodes() {  # until $1 Ray nodes are alive, for at most JOIN_WAIT seconds
    python - "$head_ip:$RAY_PORT" "$1" "$JOIN_WAIT" <<'EOF'
import sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR")
deadline = time.monotonic() + float(sys.argv[3])
while sum(node["Alive"] for node in ray.nodes()) < int(sys.argv[2]):
    if time.monotonic() > deadline:
        alive = sum(node["Alive"] for node in ray.nodes())
        sys.exit(f"slurm_sweep.sh: only {alive} of {sys.argv[2]} Ray nodes joined "
                 f"in JOIN_WAIT={sys.argv[3]}s")
    time.sleep(1)
EOF
}

srun --nodes=1 --ntasks=1 -w "$head_node" "${step_resources[@]}" \
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
    srun --nodes="$workers" --ntasks="$workers" --exclude="$head_node" "${step_resources[@]}" \
        ray start --block --address="$head_ip:$RAY_PORT" \
        --num-cpus="$CPUS_PER_NODE" --num-gpus="$GPUS_PER_NODE" &
    steps+=($!)
fi
wait_for_nodes "$SLURM_JOB_NUM_NODES"

# The sweep, on the head node (the batch script runs there), as the cluster's driver; in a
# requeued job, the same command continues it (--resume-if-present).
export PYTHONUNBUFFERED=1
"${sweep[@]}" --address "$head_ip:$RAY_PORT" \
    --num-gpus $((SLURM_JOB_NUM_NODES * GPUS_PER_NODE)) --resume-if-present &
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
