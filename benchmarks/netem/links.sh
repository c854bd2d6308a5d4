#!/usr/bin/env bash
# Emulated cluster network on one machine: network namespaces on a bridge, every link shaped with tc.
#
#   links.sh up [--nodes 4] [--rate 1gbit] [--delay 100us]   create csnh (head/driver) and csn1..csnN
#   links.sh down                                              remove everything links.sh up made (idempotent)
#   links.sh status                                            namespaces, addresses and qdiscs
#
# Layout: bridge csbr0 in the host namespace; namespace csnh (the Ray head and the benchmark driver,
# 10.77.0.1) and csn1..csnN (one Ray worker node each, 10.77.0.11...), each joined to the bridge by a
# veth pair (csvX inside the namespace, csvXb on the bridge).  Both ends of every worker veth get
# `tc tbf rate RATE`, so each node has a full-duplex NIC of RATE (egress shaped in the namespace,
# ingress shaped on the bridge port); with --delay a netem child qdisc adds one-way delay on each end
# (half the delay per end).  The kernel must have sch_netem for that; without it the delay is skipped
# with a warning and the links keep their rate limit.
#
# The head's link is shaped to RATE too (the driver is a machine with the same NIC: Ray relays task
# arguments and results under 100 KiB through it), except traffic to or from Ray's object-manager
# port OM_PORT (8076), which gets 10x RATE: that is the driver fetching every worker's results after
# each iteration, an artefact of measuring from a driver that a training job does not have.  An htb
# qdisc with two classes does this split; `tc -s class show dev csvhb` counts the bytes of each.
# Needs root, `ip` and `tc`; exits 77 (skipped) with a message where they are missing.
# Every name starts with "cs" and the subnet is 10.77.0.0/24, to stay clear of other users of the machine.
set -u

BRIDGE=csbr0
HEAD_NS=csnh
PREFIX=10.77.0
STATE_DIR=${CASYNC_NETEM_STATE:-/run/casync-netem}

UP_STARTED=0
die() {
    echo "links.sh: $*" >&2
    [ "$UP_STARTED" = 1 ] && cmd_down   # a half-built network is removed, never left behind
    exit 1
}

require_tools() {
    if [ "$(id -u)" != 0 ]; then
        echo "links.sh: SKIP: needs root (network namespaces, veth pairs and tc qdiscs)" >&2
        exit 77
    fi
    for tool in ip tc; do
        command -v "$tool" >/dev/null 2>&1 || { echo "links.sh: SKIP: \`$tool\` (iproute2) is not installed" >&2; exit 77; }
    done
}

# namespace names: head first, then the worker nodes that exist now (or the ones asked for)
worker_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^csn[0-9]+$' | sort -V; }

# tbf needs a bucket of at least rate/HZ bytes; a few milliseconds of line rate keeps TCP bursts intact
burst_for() {
    local rate=$1 num unit bits
    num=$(echo "$rate" | sed -E 's/^([0-9.]+).*/\1/')
    unit=$(echo "$rate" | sed -E 's/^[0-9.]+//' | tr 'A-Z' 'a-z')
    case "$unit" in
        gbit) bits=$(awk -v n="$num" 'BEGIN{printf "%d", n*1e9}') ;;
        mbit) bits=$(awk -v n="$num" 'BEGIN{printf "%d", n*1e6}') ;;
        kbit) bits=$(awk -v n="$num" 'BEGIN{printf "%d", n*1e3}') ;;
        *) die "--rate must look like 1gbit, 500mbit or 10gbit, got $rate" ;;
    esac
    # 2 ms of traffic, at least 64 KiB (one GSO segment)
    awk -v b="$bits" 'BEGIN{v=b/8*0.002; if (v < 65536) v = 65536; printf "%d", v}'
}

half_delay() {  # "100us" -> "50us"; "2ms" -> "1000us"
    local d=$1 num unit
    num=$(echo "$d" | sed -E 's/^([0-9.]+).*/\1/')
    unit=$(echo "$d" | sed -E 's/^[0-9.]+//')
    case "$unit" in
        us) awk -v n="$num" 'BEGIN{printf "%dus", n/2}' ;;
        ms) awk -v n="$num" 'BEGIN{printf "%dus", n*500}' ;;
        *) die "--delay must look like 100us or 1ms, got $d" ;;
    esac
}

shape() {  # shape <netns or ""> <dev> <rate> <delay or "">
    local ns=$1 dev=$2 rate=$3 delay=$4 burst tcn
    tcn=(tc); [ -n "$ns" ] && tcn=(tc -n "$ns")
    burst=$(burst_for "$rate")
    "${tcn[@]}" qdisc replace dev "$dev" root handle 1: tbf rate "$rate" burst "$burst" latency 50ms \
        || die "tc tbf on $dev failed"
    if [ -n "$delay" ] && [ "$DELAY_OK" = 1 ]; then
        if ! err=$("${tcn[@]}" qdisc add dev "$dev" parent 1:1 handle 10: netem delay "$(half_delay "$delay")" limit 100000 2>&1); then
            echo "links.sh: WARNING: netem delay not applied ($err): this kernel has no sch_netem; links keep the rate limit only" >&2
            DELAY_OK=0
        fi
    fi
}

OM_PORT=8076

shape_head() {  # shape_head <netns or ""> <dev> <rate>: htb, class 1:10 at rate (default), 1:20 object manager
    local ns=$1 dev=$2 rate=$3 tcn fast
    tcn=(tc); [ -n "$ns" ] && tcn=(tc -n "$ns")
    fast=$(echo "$rate" | awk '{n=$0+0; u=$0; sub(/^[0-9.]+/, "", u); printf "%g%s", n*10, u}')
    "${tcn[@]}" qdisc replace dev "$dev" root handle 1: htb default 10 || die "tc htb on $dev failed"
    local b
    b=$(burst_for "$rate")
    "${tcn[@]}" class add dev "$dev" parent 1: classid 1:10 htb rate "$rate" burst "$b" cburst "$b" quantum 60000 \
        || die "tc htb class on $dev failed"
    b=$(burst_for "$fast")
    "${tcn[@]}" class add dev "$dev" parent 1: classid 1:20 htb rate "$fast" burst "$b" cburst "$b" quantum 60000 \
        || die "tc htb class on $dev failed"
    local dir
    for dir in sport dport; do
        "${tcn[@]}" filter add dev "$dev" parent 1: protocol ip prio 1 u32 match ip "$dir" "$OM_PORT" 0xffff \
            flowid 1:20 || die "tc filter on $dev failed"
    done
}

cmd_up() {
    local nodes=4 rate=1gbit delay=""
    while [ $# -gt 0 ]; do
        case "$1" in
            --nodes) nodes=$2; shift 2 ;;
            --rate) rate=$2; shift 2 ;;
            --delay) delay=$2; shift 2 ;;
            *) die "unknown option $1" ;;
        esac
    done
    [[ "$nodes" =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le 200 ] || die "--nodes must be 1..200"
    burst_for "$rate" >/dev/null
    if ip link show "$BRIDGE" >/dev/null 2>&1 || ip netns list | grep -qE '^(csn|cshost)'; then
        die "a casync emulated network already exists (run links.sh down first)"
    fi
    DELAY_OK=1
    UP_STARTED=1
    ip link add "$BRIDGE" type bridge || die "cannot create bridge $BRIDGE"
    ip link set "$BRIDGE" up
    local i ns dev addr
    for i in $(seq 0 "$nodes"); do
        if [ "$i" = 0 ]; then ns=$HEAD_NS; dev=csvh; addr=$PREFIX.1; else ns=csn$i; dev=csv$i; addr=$PREFIX.$((10 + i)); fi
        ip netns add "$ns" || die "ip netns add $ns failed"
        ip link add "$dev" type veth peer name "${dev}b" || die "cannot create veth $dev"
        ip link set "$dev" netns "$ns"
        ip link set "${dev}b" master "$BRIDGE" up
        ip -n "$ns" addr add "$addr/24" dev "$dev"
        ip -n "$ns" link set "$dev" up
        ip -n "$ns" link set lo up
        if [ "$i" != 0 ]; then
            shape "$ns" "$dev" "$rate" "$delay"   # node egress
            shape "" "${dev}b" "$rate" "$delay"   # node ingress (the bridge port's egress)
        else
            shape_head "$ns" "$dev" "$rate"       # driver egress
            shape_head "" "${dev}b" "$rate"       # driver ingress
        fi
    done
    # a name for this machine's own network namespace, so that processes inside the cluster can read the
    # bridge ports' counters (tc -n cshost ...); deleting the name later leaves the namespace alone
    ip netns attach cshost $$ 2>/dev/null || die "ip netns attach cshost failed"
    mkdir -p "$STATE_DIR"
    local applied=""; [ -n "$delay" ] && [ "$DELAY_OK" = 1 ] && applied=$delay
    printf 'nodes=%s\nrate=%s\ndelay=%s\nhead=%s\nobject_manager_port=%s\n' "$nodes" "$rate" "$applied" \
        "$PREFIX.1" "$OM_PORT" > "$STATE_DIR/links.env"
    UP_STARTED=0
    echo "links.sh: up: $HEAD_NS ($PREFIX.1, htb: rate $rate, object-manager port $OM_PORT at 10x) + $nodes node(s)" \
         "csn1..csn$nodes ($PREFIX.11..), tbf rate $rate" \
         "${applied:+, netem delay $applied one way}" >&2
}

cmd_down() {
    local ns pids
    for ns in $HEAD_NS $(worker_namespaces); do
        ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$ns" || continue
        # processes still inside our namespaces are ours (Ray daemons, benchmark ranks): end them first,
        # otherwise the namespace lives on with them
        pids=$(ip netns pids "$ns" 2>/dev/null)
        if [ -n "$pids" ]; then
            kill -TERM $pids 2>/dev/null
            for _ in $(seq 50); do
                pids=$(ip netns pids "$ns" 2>/dev/null); [ -z "$pids" ] && break; sleep 0.1
            done
            [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
        fi
        ip netns del "$ns" 2>/dev/null
    done
    local dev
    for dev in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E '^csv(h|[0-9]+)b$'); do
        ip link del "$dev" 2>/dev/null
    done
    ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"
    ip netns list 2>/dev/null | awk '{print $1}' | grep -qx cshost && ip netns del cshost  # the name only
    rm -f "$STATE_DIR/links.env"
    echo "links.sh: down" >&2
}

cmd_status() {
    [ -f "$STATE_DIR/links.env" ] && cat "$STATE_DIR/links.env"
    local ns
    for ns in $HEAD_NS $(worker_namespaces); do
        ip netns list | awk '{print $1}' | grep -qx "$ns" || continue
        echo "== $ns: $(ip -n "$ns" -4 -o addr show | awk '$2 != "lo" {print $2, $4}')"
        tc -n "$ns" qdisc show | grep -v 'dev lo' | sed 's/^/   /'
    done
    tc qdisc show | grep -E 'dev csv' | sed 's/^/   bridge side: /'
    ip link show csvhb >/dev/null 2>&1 && tc -s class show dev csvhb | sed 's/^/   into the head: /'
}

main() {
    local cmd=${1:-}
    shift || true
    case "$cmd" in
        up) require_tools; cmd_up "$@" ;;
        down) require_tools; cmd_down ;;
        status) require_tools; cmd_status ;;
        *) echo "usage: $0 up [--nodes N] [--rate 1gbit] [--delay 100us] | down | status" >&2; exit 2 ;;
    esac
}

main "$@"
