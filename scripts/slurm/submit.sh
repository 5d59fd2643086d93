#!/usr/bin/env bash
# Login-node wrapper around sbatch: submits scripts/slurm/dtrain.sbatch, follows the
# job's log until the job ends, and when it failed (time limit, node failure, crash)
# resubmits it as `dtrain resume RUN_DIR`, up to --retries times.
#
#   submit.sh [--retries N] [--sbatch FILE] [--poll S] [--] [sbatch options...]
#
# The run directory of the first job is found in its log ("run directory: DIR", as
# dtrain launch prints it) unless RUN_DIR is set. CONFIG, DTRAIN and DTRAIN_ARGS pass
# through to the job (see dtrain.sbatch). Exit status: 0 once a job completed, 1 when
# the retries are used up, 2 for bad usage.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
retries=3
sbatch_file=$here/dtrain.sbatch
poll=10
usage() {
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
while [[ $# -gt 0 ]]; do
  case $1 in
    --retries) [[ ${2:-} =~ ^[0-9]+$ ]] || usage; retries=$2; shift 2 ;;
    --sbatch) [[ -f ${2:-} ]] || { echo "submit.sh: no sbatch file '${2:-}'" >&2; exit 2; }; sbatch_file=$2; shift 2 ;;
    --poll) [[ ${2:-} =~ ^[0-9]+$ ]] || usage; poll=$2; shift 2 ;;
    -h|--help) usage ;;
    --) shift; break ;;
    *) break ;;
  esac
done
for tool in sbatch squeue scontrol; do
  command -v "$tool" >/dev/null || { echo "submit.sh: '$tool' not found: run this on a Slurm login node" >&2; exit 2; }
done

# The job's state once it has left the queue: COMPLETED, FAILED, TIMEOUT, NODE_FAIL, ...
# From sacct where accounting is on; else from slurmctld's memory of the job (scontrol
# knows it for MinJobAge seconds after the end): sacct without slurmdbd only says
# "Slurm accounting storage is disabled".
job_state() {
  local s
  for _ in 1 2 3 4 5 6; do
    s=$(sacct -n -X -P -o State -j "$1" 2>/dev/null | head -n1 | awk '{print $1}' || true)
    if [[ -z $s ]]; then
      s=$(scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n 's/^JobState=//p' | head -n1 || true)
    fi
    [[ -n $s && $s != RUNNING && $s != PENDING && $s != COMPLETING ]] && { echo "$s"; return; }
    sleep "$poll"
  done
  echo "${s:-UNKNOWN}"
}

attempt=0
while :; do
  if [[ -n ${RUN_DIR:-} ]]; then export RUN_DIR; fi
  job=$(sbatch --parsable --export=ALL "$@" "$sbatch_file")
  job=${job%%;*}
  log=dtrain-$job.out
  echo "submit.sh: submitted job $job (attempt $((attempt + 1)) of $((retries + 1)))${RUN_DIR:+, resuming $RUN_DIR}"
  # Follow the log while the job is queued or running.
  tail_pid=
  while squeue -h -j "$job" 2>/dev/null | grep -q .; do
    if [[ -z $tail_pid && -f $log ]]; then
      tail -n +1 -F "$log" &
      tail_pid=$!
    fi
    sleep "$poll"
  done
  if [[ -n $tail_pid ]]; then
    sleep 1
    kill "$tail_pid" 2>/dev/null || true
    wait "$tail_pid" 2>/dev/null || true
  elif [[ -f $log ]]; then
    cat "$log" # the job ended between two polls: show its log once
  fi
  state=$(job_state "$job")
  echo "submit.sh: job $job ended: $state"
  [[ $state == COMPLETED ]] && exit 0
  if [[ -z ${RUN_DIR:-} && -f $log ]]; then
    RUN_DIR=$(sed -n 's/.*run directory: \([^ ]*\).*/\1/p' "$log" | head -n1)
  fi
  if [[ -z ${RUN_DIR:-} ]]; then
    echo "submit.sh: job $job failed before creating a run directory; not resubmitting (see $log)" >&2
    exit 1
  fi
  attempt=$((attempt + 1))
  if ((attempt > retries)); then
    echo "submit.sh: giving up after $retries resubmission(s); continue by hand with: RUN_DIR=$RUN_DIR $0" >&2
    exit 1
  fi
  echo "submit.sh: resubmitting as dtrain resume $RUN_DIR"
done
