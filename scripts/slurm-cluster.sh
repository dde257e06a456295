#!/usr/bin/env bash
# A private 2-node Slurm cluster on this machine (nodes n1 and n2, one slurmd each, 127.0.0.1), for
# trying `sagemaker-dist slurm` and for CI. Everything lives under one directory and every daemon is
# stopped by its PID file; nothing global is touched (no /etc/slurm, no systemd).
#
#   scripts/slurm-cluster.sh up [DIR]     start munged, slurmctld, slurmd n1 and n2; print SLURM_CONF
#   scripts/slurm-cluster.sh down [DIR]   stop them (by PID file) and keep DIR's logs
#
# DIR defaults to $SLURM_CLUSTER_DIR, else /tmp/sagemaker-dist-slurm; slurmctld listens on
# $SLURM_CLUSTER_PORT (default 16817), the slurmds on the next two ports. Needs root and Debian's
# slurm-wlm 22.05, munge, libpmix2 and libpmix-dev (srun --mpi=pmix needs the unversioned libpmix.so).
# Clients need `export SLURM_CONF=DIR/slurm.conf`.
set -euo pipefail

ACTION=${1:-}
DIR=$(realpath -m "${2:-${SLURM_CLUSTER_DIR:-/tmp/sagemaker-dist-slurm}}")
NODES=(n1 n2)
CTLD_PORT=${SLURM_CLUSTER_PORT:-16817}
PORTS=($((CTLD_PORT + 1)) $((CTLD_PORT + 2)))

die() { echo "slurm-cluster: $*" >&2; exit 1; }

stop_pid() {  # stop_pid FILE: TERM the process named in FILE, KILL it after 10 s
  local file=$1 pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  rm -f "$file"
}

wait_for() {  # wait_for SECONDS WHAT COMMAND...
  local seconds=$1 what=$2
  shift 2
  for _ in $(seq $((seconds * 10))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  die "$what did not come up in ${seconds} s; see the logs in $DIR/log"
}

down() {
  for node in "${NODES[@]}"; do stop_pid "$DIR/run/slurmd-$node.pid"; done
  stop_pid "$DIR/run/slurmctld.pid"
  stop_pid "$DIR/run/munged.pid"
}

up() {
  [ "$(id -u)" = 0 ] || die "run as root (slurmd and munged run as root here)"
  for tool in munged mungekey slurmctld slurmd sinfo; do
    command -v "$tool" >/dev/null || die "$tool is missing: apt-get install --no-install-recommends slurm-wlm munge slurm-client libpmix2 libpmix-dev"
  done
  down  # a stale cluster in DIR goes first
  mkdir -p "$DIR"/{run,log,state,spool,tmpfs,munge}
  chmod 700 "$DIR/munge"
  [ -f "$DIR/munge/munge.key" ] || mungekey --create --keyfile="$DIR/munge/munge.key"
  chmod 600 "$DIR/munge/munge.key"
  munged --force --origin=127.0.0.1 --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munge.seed"
  local cpus mem
  cpus=2  # two ranks a node (the nodes share this machine's cores)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 4 ))
  {
    echo "ClusterName=sagemaker-dist"
    echo "SlurmctldHost=localhost(127.0.0.1)"
    echo "SlurmctldPort=$CTLD_PORT"
    echo "AuthType=auth/munge"
    echo "AuthInfo=socket=$DIR/munge/munge.socket"
    echo "CredType=cred/munge"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "StateSaveLocation=$DIR/state"
    echo "SlurmdSpoolDir=$DIR/spool/%n"
    echo "SlurmctldPidFile=$DIR/run/slurmctld.pid"
    echo "SlurmdPidFile=$DIR/run/slurmd-%n.pid"
    echo "SlurmctldLogFile=$DIR/log/slurmctld.log"
    echo "SlurmdLogFile=$DIR/log/slurmd-%n.log"
    echo "TmpFS=$DIR/tmpfs/%n"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "MpiDefault=none"
    echo "ReturnToService=2"
    echo "SchedulerType=sched/backfill"
    echo "JobCompType=jobcomp/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "MinJobAge=600"
    for i in "${!NODES[@]}"; do
      echo "NodeName=${NODES[$i]} NodeHostname=localhost NodeAddr=127.0.0.1 Port=${PORTS[$i]} CPUs=$cpus RealMemory=$mem State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
  } > "$DIR/slurm.conf"
  for node in "${NODES[@]}"; do mkdir -p "$DIR/tmpfs/$node" "$DIR/spool/$node"; done
  export SLURM_CONF="$DIR/slurm.conf"
  slurmctld -f "$SLURM_CONF"
  wait_for 20 slurmctld scontrol ping
  for node in "${NODES[@]}"; do slurmd -f "$SLURM_CONF" -N "$node"; done
  wait_for 30 "the nodes" sh -c "[ \"\$(sinfo -h -o %t | sort -u)\" = idle ]"
  echo "slurm-cluster: up: nodes ${NODES[*]} idle, logs in $DIR/log" >&2
  echo "export SLURM_CONF=$SLURM_CONF"
}

case "$ACTION" in
  up) up ;;
  down) down; echo "slurm-cluster: down ($DIR kept)" >&2 ;;
  *) die "usage: $0 up|down [DIR]" ;;
esac
