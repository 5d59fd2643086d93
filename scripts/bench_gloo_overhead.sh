#!/usr/bin/env bash
# dtrain's Gloo backend against gloo's own gloo::allreduce (apps/gloo_baseline), with the
# same sizes, iterations and ranks, in one run: 3 ranks on localhost and a 3-node
# network-namespace cluster (scripts/test_cluster.sh, 1 slot per node). Prints busbw
# side by side with dtrain's overhead per size and overall, then the launch figures:
# time from `dtrain bench` start to every rank joined (1, 3 and 6 ranks, local and over
# SSH) and from a rank's kill -9 to every process of the job gone.
#
#   scripts/bench_gloo_overhead.sh [-b 1K] [-e 4M] [-n 20] [-w 5] [--no-rt] [--skip-cluster]
#
# Env: DTRAIN_BIN (default build/dtrain), GLOO_BASELINE (default: next to DTRAIN_BIN, else
# build-gloo-baseline/gloo_baseline). Needs root for the cluster part (skipped otherwise).
# --rt (default when root): every rank runs SCHED_FIFO (chrt -f 50) so that other load on
# the machine does not dominate microsecond latencies; gloo and dtrain block in the
# kernel while waiting, and the kernel's RT throttling leaves 5% to everything else.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DTRAIN_BIN=${DTRAIN_BIN:-$ROOT/build/dtrain}
if [[ -z ${GLOO_BASELINE:-} ]]; then
  GLOO_BASELINE=$(dirname "$DTRAIN_BIN")/apps/gloo_baseline/gloo_baseline
  [[ -x $GLOO_BASELINE ]] || GLOO_BASELINE=$ROOT/build-gloo-baseline/gloo_baseline
fi
MIN=1K MAX=4M ITERS=20 WARMUP=5 CLUSTER=1
RT=0
[[ $(id -u) -eq 0 ]] && RT=1
while [[ $# -gt 0 ]]; do
  case $1 in
    -b) MIN=$2; shift 2 ;;
    -e) MAX=$2; shift 2 ;;
    -n) ITERS=$2; shift 2 ;;
    -w) WARMUP=$2; shift 2 ;;
    --rt) RT=1; shift ;;
    --no-rt) RT=0; shift ;;
    --skip-cluster) CLUSTER=0; shift ;;
    -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_gloo_overhead.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x $DTRAIN_BIN ]] || { echo "no dtrain binary at $DTRAIN_BIN (set DTRAIN_BIN)" >&2; exit 2; }
[[ -x $GLOO_BASELINE ]] || {
  echo "no gloo_baseline at $GLOO_BASELINE: build it (cmake -S apps/gloo_baseline -B build-gloo-baseline &&" \
    "cmake --build build-gloo-baseline) or set GLOO_BASELINE" >&2
  exit 2
}
CHRT=()
((RT)) && CHRT=(chrt -f 50)
SWEEP=(-b "$MIN" -e "$MAX" -n "$ITERS" -w "$WARMUP")

WORK=$(mktemp -d /tmp/dtrain-gloo-overhead-XXXXXX)
CLUSTER_DIR=$WORK/cluster
CLUSTER_UP=0
cleanup() {
  ((CLUSTER_UP)) && bash "$ROOT/scripts/test_cluster.sh" down "$CLUSTER_DIR" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# ---------------------------------------------------------------------------
# Helpers

# Data rows of an nccl-tests table: "bytes oop_time oop_busbw ip_time ip_busbw".
table() { awk '!/^#/ && !/^\[/ && $1 ~ /^[0-9]+$/ && NF >= 13 {print $1, $6, $8, $10, $12}' "$1"; }

# Side by side: size, busbw of both (out-of-place, in-place; recomputed from the times,
# which the tables print with more digits than busbw), overhead % of dtrain's time.
compare() {
  local title=$1 n=$2 dt=$3 gb=$4
  echo
  echo "## $title  (busbw GB/s = bytes/time x 2(n-1)/n; overhead = dtrain time / gloo time - 1, out-of-place + in-place)"
  printf '%12s  %9s %9s  %9s %9s  %9s %9s  %9s\n' "size(B)" "dtrain" "gloo" "dtrain-ip" "gloo-ip" "dt-us" "gloo-us" \
    "overhead"
  join <(table "$dt" | sort -k1,1) <(table "$gb" | sort -k1,1) | sort -n -k1,1 | awk -v n="$n" '
    function bw(bytes, us) { return bytes / us / 1e3 * 2 * (n - 1) / n }
    { oh = ($2 + $4) / ($6 + $8) * 100 - 100; st_d += $2 + $4; st_g += $6 + $8; k++
      printf "%12d  %9.4f %9.4f  %9.4f %9.4f  %9.1f %9.1f  %8.1f%%\n", $1, bw($1, $2), bw($1, $6), bw($1, $4), \
             bw($1, $8), $2, $6, oh
      lr += log(($2 + $4) / ($6 + $8)) }
    END { if (k) printf "%12s  time-weighted %+.1f%%   per-size geometric mean %+.1f%%  (%d sizes)\n", "overall", \
                 st_d / st_g * 100 - 100, (exp(lr / k) - 1) * 100, k }'
}

# Runs the baseline: one process per "ns:address" argument (ns "-" = this namespace).
run_baseline() {
  local out=$1 store=$2 size
  shift 2
  size=$#
  rm -rf "$store"
  mkdir -p "$store"
  local r=0 pids=() spec ns addr
  for spec in "$@"; do
    ns=${spec%%:*}
    addr=${spec#*:}
    local cmd=("${CHRT[@]}" "$GLOO_BASELINE" --rank $r --size "$size" --store "$store" --address "$addr" "${SWEEP[@]}")
    if [[ $ns == - ]]; then
      timeout 300 "${cmd[@]}" >"$out.$r" 2>&1 &
    else
      timeout 300 ip netns exec "$ns" "${cmd[@]}" >"$out.$r" 2>&1 &
    fi
    pids+=($!)
    r=$((r + 1))
  done
  local rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  cp "$out.0" "$out"
  ((rc == 0)) || { echo "gloo_baseline failed:" >&2; cat "$out".* >&2; exit 1; }
}

# Seconds from the start of `dtrain bench ...` until WORLD ranks logged their Gloo mesh
# ("gloo: rank R of W connected"), read from the timestamped output. Also the total.
join_time() {
  local world=$1 log=$2
  shift 2
  local t0=$EPOCHREALTIME
  DTRAIN_LOG_LEVEL=debug timeout 120 "$@" 2>&1 | while IFS= read -r line; do
    printf '%s %s\n' "$EPOCHREALTIME" "$line"
  done >"$log" || true
  local t1=$EPOCHREALTIME
  awk -v t0="$t0" -v t1="$t1" -v w="$world" '
    / connected on tcp/ { n++; if (n == w) j = $1 - t0 }
    END { if (j) printf "%6.2f s to all %d joined, %6.2f s total\n", j, w, t1 - t0; else printf "ranks did not all join (%d of %d)\n", n, w }' "$log"
}

# ---------------------------------------------------------------------------
echo "# dtrain Gloo overhead vs gloo::allreduce: sizes $MIN..$MAX, -n $ITERS -w $WARMUP, rt=$RT"
echo "# dtrain $("$DTRAIN_BIN" --version 2>/dev/null || echo '?'), $(nproc) CPU(s), load $(cut -d' ' -f1-3 /proc/loadavg)"

# Localhost, 3 ranks.
"${CHRT[@]}" timeout 300 "$DTRAIN_BIN" bench allreduce --backend gloo --nproc-per-node 3 "${SWEEP[@]}" \
  --output-dir "$WORK/run-local" >"$WORK/dt-local.txt" 2>&1 || { cat "$WORK/dt-local.txt" >&2; exit 1; }
run_baseline "$WORK/gb-local.txt" "$WORK/store-local" -:127.0.0.1 -:127.0.0.1 -:127.0.0.1
compare "localhost, 3 ranks" 3 "$WORK/dt-local.txt" "$WORK/gb-local.txt"

if ((CLUSTER)); then
  if bash "$ROOT/scripts/test_cluster.sh" up 3 "$CLUSTER_DIR" 1 >"$WORK/cluster-up.log" 2>&1; then
    CLUSTER_UP=1
  else
    echo
    echo "## cluster part skipped: $(tail -1 "$WORK/cluster-up.log")"
    CLUSTER=0
  fi
fi
if ((CLUSTER)); then
  # shellcheck disable=SC1091
  source "$CLUSTER_DIR/env"
  SSH_SETS=(--set "cluster.ssh.identity_file=$CLUSTER_IDENTITY" --set "cluster.ssh.known_hosts=$CLUSTER_KNOWN_HOSTS")
  if ((RT)); then
    # Ranks inherit the scheduling policy of the sshd that spawns their agent.
    for i in 0 1 2; do chrt -f -p 50 "$(cat "$CLUSTER_DIR/sshd-$i.pid")"; done
  fi
  "${CHRT[@]}" timeout 300 "$DTRAIN_BIN" bench allreduce --backend gloo --hostfile "$CLUSTER_HOSTFILE" "${SWEEP[@]}" \
    "${SSH_SETS[@]}" --master-port 0 --output-dir "$WORK/run-cluster" >"$WORK/dt-cluster.txt" 2>&1 ||
    { cat "$WORK/dt-cluster.txt" >&2; exit 1; }
  run_baseline "$WORK/gb-cluster.txt" "$WORK/store-cluster" "$NODE_0_NS:$NODE_0_ADDR" "$NODE_1_NS:$NODE_1_ADDR" \
    "$NODE_2_NS:$NODE_2_ADDR"
  compare "3-node namespace cluster, 1 rank per node (veth + bridge)" 3 "$WORK/dt-cluster.txt" "$WORK/gb-cluster.txt"
fi

# ---------------------------------------------------------------------------
echo
echo "## launch: from 'dtrain bench' start to every rank's Gloo mesh connected (1 tiny allreduce row)"
TINY=(-b 1K -e 1K -n 1 -w 0)
for n in 1 3 6; do
  printf 'local   %d rank(s): ' "$n"
  join_time "$n" "$WORK/join-local-$n.log" "$DTRAIN_BIN" bench allreduce --backend gloo --nproc-per-node "$n" \
    "${TINY[@]}" --output-dir "$WORK/run-join-local"
done
if ((CLUSTER)); then
  printf 'root@%s slots=1\n' "$NODE_0_ADDR" >"$WORK/hf1"
  printf 'root@%s slots=2\nroot@%s slots=2\nroot@%s slots=2\n' "$NODE_0_ADDR" "$NODE_1_ADDR" "$NODE_2_ADDR" >"$WORK/hf6"
  for spec in "1:$WORK/hf1" "3:$CLUSTER_HOSTFILE" "6:$WORK/hf6"; do
    n=${spec%%:*}
    printf 'ssh     %d rank(s): ' "$n"
    join_time "$n" "$WORK/join-ssh-$n.log" "$DTRAIN_BIN" bench allreduce --backend gloo --hostfile "${spec#*:}" \
      "${TINY[@]}" "${SSH_SETS[@]}" --master-port 0 --output-dir "$WORK/run-join-ssh"
  done

  echo
  echo "## teardown: kill -9 of one rank (node 1) -> launcher exited and no dtrain process on any node"
  dtrain_pids() { # all dtrain processes of the cluster's namespaces
    local i p
    for i in 0 1 2; do
      for p in $(ip netns pids "$(eval echo "\$NODE_${i}_NS")" 2>/dev/null); do
        [[ $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) == "$DTRAIN_BIN "* ]] && echo "$p"
      done
    done
    return 0
  }
  for trial in 1 2 3; do
    log=$WORK/kill-$trial.log
    DTRAIN_LOG_LEVEL=debug timeout 120 "$DTRAIN_BIN" bench allreduce --backend gloo --hostfile "$WORK/hf6" \
      -b 16M -e 16M -n 1000 -w 1 "${SSH_SETS[@]}" --master-port 0 --set fault_tolerance.max_retries=0 \
      --output-dir "$WORK/run-kill" >"$log" 2>&1 &
    launcher=$!
    for _ in $(seq 600); do
      (($(grep -c ' of 6 connected on tcp' "$log" || true) >= 6)) && break
      sleep 0.1
    done
    victim=""
    for p in $(ip netns pids "$NODE_1_NS"); do
      if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q " worker"; then victim=$p; break; fi
    done
    [[ -n $victim ]] || { echo "no worker found in node 1"; kill "$launcher"; wait "$launcher" || true; continue; }
    t0=$EPOCHREALTIME
    kill -9 "$victim"
    rc=0
    wait "$launcher" || rc=$?
    t_exit=$EPOCHREALTIME
    until [[ -z $(dtrain_pids) ]]; do
      (($(awk -v a="$EPOCHREALTIME" -v b="$t0" 'BEGIN{print (a - b > 30)}'))) && break
      sleep 0.02
    done
    t_gone=$EPOCHREALTIME
    awk -v t0="$t0" -v e="$t_exit" -v g="$t_gone" -v rc="$rc" -v left="$(dtrain_pids | wc -l)" 'BEGIN {
      printf "trial: launcher exit %.2f s (code %d), every process gone %.2f s, left %d\n", e - t0, rc, g - t0, left }'
  done
fi
