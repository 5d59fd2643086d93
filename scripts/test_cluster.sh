#!/usr/bin/env bash
# Local multi-node test cluster: N network namespaces behind a bridge, each running its
# own sshd with a throwaway host key, so the SSH launcher and multi-node tests run for
# real on one machine. Needs root, iproute2 and openssh-server; exits 77 (skip) otherwise.
#
#   test_cluster.sh up N STATE_DIR [SLOTS]   start N nodes (SLOTS per node in the hostfile,
#                                            default $DTRAIN_TEST_SLOTS or 2)
#   test_cluster.sh down STATE_DIR           kill everything in the nodes, delete them (idempotent)
#   test_cluster.sh link-down STATE_DIR I    cut node I off the network (silently: no RST)
#   test_cluster.sh link-up STATE_DIR I      reconnect node I
#   test_cluster.sh node-down STATE_DIR I    take node I down: kill every process in it (sshd included)
#   test_cluster.sh node-up STATE_DIR I      bring node I back: start its sshd again
#   test_cluster.sh exec STATE_DIR I CMD...  run CMD inside node I's namespace
#   test_cluster.sh throttle STATE_DIR I RATE  shape node I's link to RATE (tc tbf, both
#                                            directions; e.g. 40mbit)
#   test_cluster.sh unthrottle STATE_DIR I   remove that shaping
#   test_cluster.sh bind STATE_DIR I SRC DST bind-mount SRC over DST for node I only (its
#                                            sshd's mount namespace: every SSH session there)
#   test_cluster.sh unbind STATE_DIR I DST   undo it
#   test_cluster.sh status STATE_DIR         print STATE_DIR/env and whether each sshd runs
#
# `up` writes into STATE_DIR: hostfile ("root@198.18.X.10 slots=2" per node), known_hosts
# (each node's host key), id_ed25519 (+ .pub, the user key in authorized_keys),
# ssh_config (for `ssh -F STATE_DIR/ssh_config ADDR`), env (shell-sourceable KEY=VALUE:
# CLUSTER_*, NODE_<i>_NS, NODE_<i>_ADDR, NODE_<i>_VETH) and sshd-<i>.log. Names derive from
# a hash of STATE_DIR (namespaces dtn<hash>-<i>, bridge dtb<hash>, veths dtv<hash>-<i>)
# and every cluster gets its own /24 in 198.18.0.0/15, so parallel runs do not collide.
set -euo pipefail

SSHD=${SSHD:-/usr/sbin/sshd}
LOCK_FILE=/run/dtrain-test-cluster.lock

usage() {
  sed -n '6,21p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
die() {
  echo "test_cluster.sh: error: $*" >&2
  exit 1
}
skip() {
  echo "test_cluster.sh: SKIP: $*" >&2
  exit 77
}

# ---------------------------------------------------------------------------
# Names

# Sets STATE_DIR (absolute), H (hash), BRIDGE for the state directory $1.
cluster_names() {
  [[ -n ${1:-} ]] || usage
  STATE_DIR=$(realpath -m -- "$1")
  [[ $STATE_DIR =~ ^[A-Za-z0-9._/+-]+$ ]] ||
    die "STATE_DIR '$STATE_DIR' may only hold letters, digits and ._/+- (it goes into sshd_config)"
  H=$(printf '%s' "$STATE_DIR" | sha1sum | cut -c1-6)
  BRIDGE=dtb$H
}
ns_name() { echo "dtn$H-$1"; }
veth_name() { echo "dtv$H-$1"; }
cluster_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep "^dtn$H-" || true; }

check_prerequisites() {
  [[ $(id -u) -eq 0 ]] || skip "needs root (network namespaces, a bridge and sshd)"
  command -v ip >/dev/null || skip "no 'ip' command (apt-get install iproute2)"
  [[ -x $SSHD ]] || skip "no sshd at $SSHD (apt-get install openssh-server)"
  command -v ssh-keygen >/dev/null || skip "no ssh-keygen (apt-get install openssh-client)"
  local probe=dtnprobe$$
  ip netns add "$probe" 2>/dev/null || skip "cannot create network namespaces here (no CAP_SYS_ADMIN?)"
  ip netns del "$probe"
}

# Node index argument: 0 <= I < number of nodes.
node_index() {
  [[ ${1:-} =~ ^[0-9]+$ ]] || die "node index '${1:-}' is not a number"
  ip netns list | awk '{print $1}' | grep -qx "$(ns_name "$1")" ||
    die "node $1 of the cluster in $STATE_DIR does not exist (is it up?)"
}

# ---------------------------------------------------------------------------
# down

# kill -9 every process in namespace $1 (sshd and every session), up to 10 rounds $2 s
# apart (a process may fork while the last round ran). True when none is left.
ns_kill_all() {
  local pids tries
  for tries in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(ip netns pids "$1" 2>/dev/null || true)
    [[ -z $pids ]] && return 0
    kill -9 $pids 2>/dev/null || true
    sleep "$2"
  done
  [[ -z $(ip netns pids "$1" 2>/dev/null || true) ]]
}

cluster_down() {
  local ns veth
  for ns in $(cluster_namespaces); do
    # Processes keep a namespace alive: kill all of them.
    ns_kill_all "$ns" 0.1 || true
    ip netns del "$ns" 2>/dev/null || true
  done
  for veth in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^dtv$H-" || true); do
    ip link del "$veth" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  rm -f "$STATE_DIR"/env "$STATE_DIR"/sshd-*.pid
}

# ---------------------------------------------------------------------------
# up

# Picks a free 198.18.X.0/24 or 198.19.X.0/24 starting from the hash (under the lock) and
# creates the bridge with .1 on it. Sets NET ("198.18.X").
bridge_up() {
  local start k x net
  start=$((16#$H % 512))
  for ((k = 0; k < 512; k++)); do
    x=$(((start + k) % 512))
    if ((x < 256)); then net=198.18.$x; else net=198.19.$((x - 256)); fi
    if ! ip -o -4 addr show | grep -q " $net\." && [[ -z $(ip -4 route show "$net.0/24") ]]; then
      NET=$net
      ip link add name "$BRIDGE" type bridge forward_delay 0
      ip addr add "$NET.1/24" dev "$BRIDGE"
      ip link set "$BRIDGE" up
      return 0
    fi
  done
  die "no free /24 left in 198.18.0.0/15"
}

write_sshd_config() {
  cat >"$STATE_DIR/sshd_config" <<EOF
# sshd for the dtrain test cluster in $STATE_DIR (ListenAddress and PidFile per node on the command line)
Port 22
HostKey $STATE_DIR/host_ed25519_key
AuthorizedKeysFile $STATE_DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
X11Forwarding no
PrintMotd no
PrintLastLog no
MaxStartups 200
MaxSessions 200
ClientAliveInterval 5
ClientAliveCountMax 3
LogLevel VERBOSE
Subsystem sftp internal-sftp
EOF
}

# True when addr:22 answers with an SSH banner.
sshd_answers() {
  timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/22" && head -c 4 <&3' _ "$1" 2>/dev/null | grep -q '^SSH-'
}

cluster_up() {
  local n=$1 slots=$2 i ns vh vp addr deadline
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 200)) || die "node count '$n' must be 1..200"
  [[ $slots =~ ^[0-9]+$ ]] && ((slots >= 1)) || die "slots '$slots' must be a positive number"
  mkdir -p "$STATE_DIR"
  if [[ -f $STATE_DIR/env || -n $(cluster_namespaces) ]]; then
    die "a cluster is already up for $STATE_DIR; run: $0 down $STATE_DIR"
  fi
  # From here on a failure (or Ctrl-C) tears down whatever was created.
  trap 'rc=$?; if ((rc != 0)); then echo "test_cluster.sh: up failed (exit $rc), cleaning up" >&2; cluster_down; fi' EXIT
  trap 'exit 130' INT TERM

  exec 9>"$LOCK_FILE"
  flock -w 60 9 || die "timed out waiting for $LOCK_FILE"
  bridge_up
  flock -u 9
  exec 9>&-

  rm -f "$STATE_DIR"/host_ed25519_key* "$STATE_DIR"/id_ed25519*
  ssh-keygen -q -t ed25519 -N '' -C "dtrain-test-host-$H" -f "$STATE_DIR/host_ed25519_key"
  ssh-keygen -q -t ed25519 -N '' -C "dtrain-test-user-$H" -f "$STATE_DIR/id_ed25519"
  cp "$STATE_DIR/id_ed25519.pub" "$STATE_DIR/authorized_keys"
  write_sshd_config
  mkdir -p /run/sshd # sshd's privilege-separation directory
  chmod 755 /run/sshd

  : >"$STATE_DIR/hostfile"
  : >"$STATE_DIR/known_hosts"
  local host_key
  host_key=$(cut -d' ' -f1,2 "$STATE_DIR/host_ed25519_key.pub")
  for ((i = 0; i < n; i++)); do
    ns=$(ns_name "$i")
    vh=$(veth_name "$i")
    vp=dtp$H-$i
    addr=$NET.$((10 + i))
    ip netns add "$ns"
    ip link add "$vh" type veth peer name "$vp"
    ip link set "$vp" netns "$ns"
    ip link set "$vh" master "$BRIDGE"
    ip link set "$vh" up
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$vp" name eth0
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" route add default via "$NET.1"
    ip netns exec "$ns" "$SSHD" -f "$STATE_DIR/sshd_config" -E "$STATE_DIR/sshd-$i.log" \
      -o "ListenAddress=$addr" -o "PidFile=$STATE_DIR/sshd-$i.pid" ||
      die "sshd for node $i did not start; see $STATE_DIR/sshd-$i.log"
    echo "root@$addr slots=$slots" >>"$STATE_DIR/hostfile"
    echo "$addr $host_key" >>"$STATE_DIR/known_hosts"
  done

  cat >"$STATE_DIR/ssh_config" <<EOF
Host *
  User root
  IdentityFile $STATE_DIR/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $STATE_DIR/known_hosts
  StrictHostKeyChecking yes
  BatchMode yes
  ConnectTimeout 5
EOF

  deadline=$((SECONDS + 20))
  for ((i = 0; i < n; i++)); do
    addr=$NET.$((10 + i))
    until sshd_answers "$addr"; do
      ((SECONDS < deadline)) || die "sshd of node $i ($addr) does not answer; see $STATE_DIR/sshd-$i.log"
      sleep 0.1
    done
  done

  {
    echo "CLUSTER_STATE_DIR=$STATE_DIR"
    echo "CLUSTER_N=$n"
    echo "CLUSTER_SLOTS=$slots"
    echo "CLUSTER_HASH=$H"
    echo "CLUSTER_BRIDGE=$BRIDGE"
    echo "CLUSTER_SUBNET=$NET.0/24"
    echo "CLUSTER_LAUNCHER_ADDR=$NET.1"
    echo "CLUSTER_USER=root"
    echo "CLUSTER_IDENTITY=$STATE_DIR/id_ed25519"
    echo "CLUSTER_KNOWN_HOSTS=$STATE_DIR/known_hosts"
    echo "CLUSTER_HOSTFILE=$STATE_DIR/hostfile"
    echo "CLUSTER_SSH_CONFIG=$STATE_DIR/ssh_config"
    for ((i = 0; i < n; i++)); do
      echo "NODE_${i}_NS=$(ns_name "$i")"
      echo "NODE_${i}_ADDR=$NET.$((10 + i))"
      echo "NODE_${i}_VETH=$(veth_name "$i")"
    done
  } >"$STATE_DIR/env.tmp"
  mv "$STATE_DIR/env.tmp" "$STATE_DIR/env"
  trap - EXIT INT TERM
  echo "test_cluster.sh: $n node(s) up in $NET.0/24 (launcher $NET.1); state in $STATE_DIR" >&2
}

# ---------------------------------------------------------------------------
# Per-node faults: a slow link, a file or directory that only one node sees

# True when process $1 exists and is not a zombie (a killed sshd stays a zombie until its
# parent reaps it, and kill -0 succeeds on a zombie).
pid_alive() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z && $state != X ]]
}

# The pid of node I's sshd, whose mount namespace every SSH session of the node shares.
# `ip netns exec` gave it a mount namespace of its own (slave of the host's, so host
# mounts reach it but its mounts stay inside); refuse to mount when that is not so.
node_mount_pid() {
  local pid
  pid=$(cat "$STATE_DIR/sshd-$1.pid" 2>/dev/null) || die "no sshd pid file for node $1"
  pid_alive "$pid" || die "sshd of node $1 (pid $pid) is not running"
  [[ $(readlink "/proc/$pid/ns/mnt") != $(readlink /proc/self/ns/mnt) ]] ||
    die "node $1's sshd shares this mount namespace: a mount there would change every node"
  echo "$pid"
}

node_throttle() {
  local ns veth
  ns=$(ns_name "$1")
  veth=$(veth_name "$1")
  # Egress of the bridge side (traffic to the node) and of the node's eth0 (from it).
  tc qdisc replace dev "$veth" root tbf rate "$2" burst 64kb latency 100ms
  ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$2" burst 64kb latency 100ms
}

node_unthrottle() {
  tc qdisc del dev "$(veth_name "$1")" root 2>/dev/null || true
  ip netns exec "$(ns_name "$1")" tc qdisc del dev eth0 root 2>/dev/null || true
}

# ---------------------------------------------------------------------------
# main

command=${1:-}
case $command in
  up)
    [[ $# -ge 3 && $# -le 4 ]] || usage
    check_prerequisites
    cluster_names "$3"
    cluster_up "$2" "${4:-${DTRAIN_TEST_SLOTS:-2}}"
    ;;
  down)
    [[ $# -eq 2 ]] || usage
    [[ $(id -u) -eq 0 ]] || skip "needs root"
    cluster_names "$2"
    cluster_down
    ;;
  link-down | link-up)
    [[ $# -eq 3 ]] || usage
    cluster_names "$2"
    node_index "$3"
    ip link set "$(veth_name "$3")" "${command#link-}"
    ;;
  node-down)
    [[ $# -eq 3 ]] || usage
    cluster_names "$2"
    node_index "$3"
    ns_kill_all "$(ns_name "$3")" 0.2 || die "processes of node $3 survived kill -9"
    ;;
  node-up)
    [[ $# -eq 3 ]] || usage
    cluster_names "$2"
    node_index "$3"
    addr=$(sed -n "s/^NODE_$3_ADDR=//p" "$STATE_DIR/env")
    [[ -n $addr ]] || die "no address for node $3 in $STATE_DIR/env"
    ip netns exec "$(ns_name "$3")" "$SSHD" -f "$STATE_DIR/sshd_config" -E "$STATE_DIR/sshd-$3.log" \
      -o "ListenAddress=$addr" -o "PidFile=$STATE_DIR/sshd-$3.pid" ||
      die "sshd for node $3 did not start; see $STATE_DIR/sshd-$3.log"
    ;;
  exec)
    [[ $# -ge 4 ]] || usage
    cluster_names "$2"
    node_index "$3"
    ns=$(ns_name "$3")
    shift 3
    exec ip netns exec "$ns" "$@"
    ;;
  throttle)
    [[ $# -eq 4 ]] || usage
    [[ $4 =~ ^[0-9]+(bit|kbit|mbit|gbit)$ ]] || die "rate '$4' must look like 40mbit"
    cluster_names "$2"
    node_index "$3"
    node_throttle "$3" "$4"
    ;;
  unthrottle)
    [[ $# -eq 3 ]] || usage
    cluster_names "$2"
    node_index "$3"
    node_unthrottle "$3"
    ;;
  bind)
    [[ $# -eq 5 ]] || usage
    cluster_names "$2"
    node_index "$3"
    [[ -e $4 && -e $5 ]] || die "bind: both '$4' and '$5' must exist"
    nsenter -t "$(node_mount_pid "$3")" -m mount --bind "$4" "$5"
    ;;
  unbind)
    [[ $# -eq 4 ]] || usage
    cluster_names "$2"
    node_index "$3"
    nsenter -t "$(node_mount_pid "$3")" -m umount "$4"
    ;;
  status)
    [[ $# -eq 2 ]] || usage
    cluster_names "$2"
    [[ -f $STATE_DIR/env ]] || die "no cluster is up for $STATE_DIR"
    cat "$STATE_DIR/env"
    for pidfile in "$STATE_DIR"/sshd-*.pid; do
      [[ -f $pidfile ]] || continue
      if pid_alive "$(cat "$pidfile")"; then echo "$(basename "$pidfile" .pid): running"; else echo "$(basename "$pidfile" .pid): NOT running"; fi
    done
    ;;
  *) usage ;;
esac
