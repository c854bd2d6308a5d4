#!/usr/bin/env bash
# A real multi-node Ray cluster on one machine, over emulated slow links (see links.sh for the network).
#
#   netem.sh up   [--nodes 4] [--rate 1gbit] [--delay 100us]   network + Ray head (csnh) + one Ray node per csnI
#   netem.sh down                                               stop every process in the namespaces, remove them
#   netem.sh run  [--nodes 4] [--rate 1gbit] [--delay 100us] [--job bench|tta] [-- ARGS]
#                 up, check the links with an actor-to-actor transfer, run
#                 benchmarks/compare_strategies.py --netem ARGS inside csnh (--job tta: `casync tta --netem ARGS`,
#                 the time-to-accuracy mode, its gloo rank r in csn{r+1}), and always down (trap)
#   netem.sh exec CMD...                                        run CMD in csnh with the cluster's address/token
#
# The head runs in csnh (10.77.0.1, no CPUs: the GCS, the driver and its object store); node I runs in
# csnI (10.77.0.1I) with 1 CPU, its own object store and a custom resource casync_node_I, so that each
# casync worker actor and each gloo/DDP baseline rank lands on its own node and every payload between
# workers crosses two shaped veth ends.  Ray uses token auth with a token made for this cluster
# (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN), kept in /run/casync-netem/ray.env (mode 600) while it is up.
#
# Needs root, iproute2 (ip, tc) and the ray CLI; exits 77 (skipped) with a message where they are missing.
# Never runs `ray stop` (it would stop every Ray on the machine): teardown ends exactly the processes inside
# this cluster's namespaces.
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
STATE_DIR=${CASYNC_NETEM_STATE:-/run/casync-netem}
export CASYNC_NETEM_STATE=$STATE_DIR
HEAD_IP=10.77.0.1
GCS_PORT=6379
OM_PORT=8076   # links.sh gives this port's traffic into/out of the head (the driver's result fetch) 10x the rate
NODE_STORE_BYTES=${CASYNC_NETEM_STORE_BYTES:-1500000000}
HEAD_STORE_BYTES=${CASYNC_NETEM_HEAD_STORE_BYTES:-2000000000}
TEMP_ROOT=/tmp/casync-netem

log() { echo "netem.sh: $*" >&2; }

require() {
    if [ "$(id -u)" != 0 ]; then log "SKIP: needs root (network namespaces and tc)"; exit 77; fi
    local tool
    for tool in ip tc; do
        command -v "$tool" >/dev/null 2>&1 || { log "SKIP: \`$tool\` (iproute2) is not installed"; exit 77; }
    done
    RAY=$(command -v ray) || { log "SKIP: the \`ray\` CLI is not installed (pip install 'ray[default]')"; exit 77; }
    PY=$(command -v python3 || command -v python)
}

ray_env() {  # the environment every process of the cluster (daemons, driver, baseline ranks) runs with
    # shellcheck disable=SC1091
    . "$STATE_DIR/ray.env"
    export RAY_AUTH_MODE RAY_AUTH_TOKEN RAY_ADDRESS RAY_USAGE_STATS_ENABLED=0
    export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
}

cmd_up() {
    local nodes=4 args=("$@")
    while [ $# -gt 0 ]; do
        case "$1" in --nodes) nodes=$2; shift 2 ;; *) shift ;; esac
    done
    "$HERE/links.sh" up "${args[@]}" || return $?
    mkdir -p "$STATE_DIR" "$TEMP_ROOT"
    umask 077
    printf 'RAY_AUTH_MODE=token\nRAY_AUTH_TOKEN=%s\nRAY_ADDRESS=%s\nNETEM_NODES=%s\n' \
        "$("$PY" -c 'import secrets; print(secrets.token_hex(32))')" "$HEAD_IP:$GCS_PORT" "$nodes" > "$STATE_DIR/ray.env"
    umask 022
    ray_env
    log "starting the Ray head in csnh ($HEAD_IP:$GCS_PORT)"
    ip netns exec csnh "$RAY" start --head --node-ip-address=$HEAD_IP --port=$GCS_PORT --num-cpus=0 \
        --object-manager-port=$OM_PORT \
        --object-store-memory="$HEAD_STORE_BYTES" --include-dashboard=false --disable-usage-stats \
        --temp-dir="$TEMP_ROOT/head" >"$TEMP_ROOT/head.log" 2>&1 \
        || { cat "$TEMP_ROOT/head.log" >&2; log "ray start --head failed"; return 1; }
    local i
    for i in $(seq 1 "$nodes"); do
        log "starting Ray node $i in csn$i (10.77.0.$((10 + i)))"
        ip netns exec "csn$i" "$RAY" start --address="$HEAD_IP:$GCS_PORT" --node-ip-address="10.77.0.$((10 + i))" \
            --num-cpus=1 --resources="{\"casync_node_$i\": 1}" --object-store-memory="$NODE_STORE_BYTES" \
            --object-manager-port=$OM_PORT \
            --disable-usage-stats --temp-dir="$TEMP_ROOT/node$i" >"$TEMP_ROOT/node$i.log" 2>&1 \
            || { cat "$TEMP_ROOT/node$i.log" >&2; log "ray start on csn$i failed"; return 1; }
    done
    ip netns exec csnh "$PY" - "$nodes" <<'EOF' || return 1
import sys, time, ray
want = int(sys.argv[1]) + 1
ray.init(address="auto", log_to_driver=False, configure_logging=False)
deadline = time.monotonic() + 60
while len([n for n in ray.nodes() if n["Alive"]]) < want and time.monotonic() < deadline:
    time.sleep(0.5)
alive = [n for n in ray.nodes() if n["Alive"]]
print(f"netem.sh: Ray cluster up: {len(alive)} nodes: " + ", ".join(sorted(n["NodeManagerAddress"] for n in alive)),
      file=sys.stderr)
sys.exit(0 if len(alive) >= want else 1)
EOF
    log "up. Run commands in the cluster with: $0 exec CMD..."
}

cmd_down() {
    "$HERE/links.sh" down   # ends every process inside csnh/csnI (our Ray daemons, drivers, ranks) first
    rm -f "$STATE_DIR/ray.env"
    rm -rf "$TEMP_ROOT"
}

cmd_exec() {
    [ -f "$STATE_DIR/ray.env" ] || { log "no cluster is up (netem.sh up first)"; exit 1; }
    ray_env
    cd "$REPO" && exec ip netns exec csnh "$@"
}

cmd_run() {
    local up_args=() bench_args=() job=bench
    while [ $# -gt 0 ]; do
        case "$1" in
            --) shift; bench_args=("$@"); break ;;
            --job) job=${2:-}; shift 2 || shift ;;
            *) up_args+=("$1"); shift ;;
        esac
    done
    case "$job" in
        bench) local job_cmd=(benchmarks/compare_strategies.py) job_flag="" ;;
        tta) local job_cmd=(-m casync tta) job_flag=" --job tta" ;;
        *) log "unknown --job '$job' (bench: benchmarks/compare_strategies.py; tta: casync tta)"; exit 2 ;;
    esac
    if [ -f "$STATE_DIR/ray.env" ] || ip netns list 2>/dev/null | grep -qE '^csn'; then
        log "an emulated cluster is already up (someone else's run, or a leftover: netem.sh down)"; exit 1
    fi
    trap 'cmd_down' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    cmd_up "${up_args[@]}" || exit 1
    ray_env
    cd "$REPO" || exit 1
    ip netns exec csnh "$PY" benchmarks/netem/check_links.py --nodes "$NETEM_NODES" --out-env "$STATE_DIR/links.env" || exit 1
    CASYNC_BENCH_LAUNCH="benchmarks/netem/netem.sh run ${up_args[*]}$job_flag -- ${bench_args[*]}" \
        ip netns exec csnh "$PY" "${job_cmd[@]}" --netem "$STATE_DIR/links.env" "${bench_args[@]}"
}

main() {
    local cmd=${1:-}
    shift || true
    case "$cmd" in
        up) require; cmd_up "$@" || { cmd_down; exit 1; } ;;
        down) require; cmd_down ;;
        run) require; cmd_run "$@" ;;
        exec) require; cmd_exec "$@" ;;
        *) echo "usage: $0 up [--nodes N] [--rate 1gbit] [--delay 100us] | down | run [...] [--job bench|tta] [-- ARGS] | exec CMD..." >&2
           exit 2 ;;
    esac
}

main "$@"
