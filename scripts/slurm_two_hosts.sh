#!/usr/bin/env bash
# A two-node SLURM cluster on the two emulated hosts of scripts/two_hosts.sh: slurmctld on
# host-b, a slurmd on each host (nodes host-a and host-b, one CPU each), partition `two`, no
# accounting. Its own configuration (/etc/slurm-two/slurm.conf: use it with
# SLURM_CONF=/etc/slurm-two/slurm.conf, from a command run on a host) and daemons, so it can
# run beside the single-node cluster of scripts/slurm_up.sh; munge is shared (a unix socket).
#
#   scripts/slurm_two_hosts.sh up      the hosts (two_hosts.sh up), munge, the daemons; waits
#                                      until sinfo shows both nodes idle
#   scripts/slurm_two_hosts.sh down    stop the daemons (the hosts stay: two_hosts.sh down)
#   scripts/slurm_two_hosts.sh exec a|b CMD ...   CMD on a host with SLURM_CONF set
#
# Needs root, slurm-wlm's slurmctld, slurmd and client, munge (scripts/slurm_up.sh installs
# them). Environment: as two_hosts.sh (TWO_HOSTS_PREFIX, TWO_HOSTS_NET).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PREFIX=${TWO_HOSTS_PREFIX:-rx-}
CONF_DIR=/etc/slurm-two/${PREFIX%-}
STATE=/var/spool/slurm-two/${PREFIX%-}
RUN=/run/slurm-two/${PREFIX%-}
LOGS=/var/log/slurm-two/${PREFIX%-}
export SLURM_CONF=$CONF_DIR/slurm.conf
say() { echo "slurm_two_hosts: $*" >&2; }
on() { "$here/two_hosts.sh" exec "$@"; }

alive() {  # alive PIDFILE: it names a live, non-zombie process
  local pid st
  pid=$(cat "$1" 2>/dev/null) || return 1
  st=$(ps -o stat= -p "$pid" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "${st#Z}" = "$st" ]
}

up() {
  "$here/two_hosts.sh" up
  for b in slurmctld slurmd sinfo munged; do
    command -v "$b" >/dev/null || [ -x "/usr/sbin/$b" ] || {
      say "no $b: run scripts/slurm_up.sh once (it installs slurm-wlm and munge)"; exit 1; }
  done
  mkdir -p "$CONF_DIR" "$STATE/ctld" "$STATE/d-host-a" "$STATE/d-host-b" "$RUN" "$LOGS"
  local a b mem
  a=$("$here/two_hosts.sh" addr a)
  b=$("$here/two_hosts.sh" addr b)
  mem=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 / 4))
  cat > "$SLURM_CONF" <<CONF
# Written by replay_exp scripts/slurm_two_hosts.sh: two nodes on the emulated hosts.
ClusterName=two
SlurmctldHost=host-b($b)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=15
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d-%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldPort=6817
SlurmdPort=6818
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=5
Waittime=0
NodeName=host-a NodeAddr=$a CPUs=1 RealMemory=$mem State=UNKNOWN
NodeName=host-b NodeAddr=$b CPUs=1 RealMemory=$mem State=UNKNOWN
PartitionName=two Nodes=host-a,host-b Default=YES MaxTime=INFINITE State=UP
CONF
  chmod 644 "$SLURM_CONF"
  if ! munge -n >/dev/null 2>&1; then
    mkdir -p /run/munge && chown munge:munge /run/munge
    su -s /bin/sh munge -c /usr/sbin/munged
  fi
  alive "$RUN/slurmctld.pid" || on b env SLURM_CONF="$SLURM_CONF" /usr/sbin/slurmctld
  for h in a b; do
    # ip netns exec mounts a fresh /sys, without the cgroup tree slurmd looks for: this
    # machine's cgroup v1 hierarchies mounted again there (in the daemon's mount namespace,
    # nobody else's; the same hierarchies, so nothing changes outside it)
    alive "$RUN/slurmd-host-$h.pid" ||
      on "$h" sh -c 'mount -t tmpfs tmpfs /sys/fs/cgroup &&
        for c in cpu cpuacct cpuset memory devices freezer blkio pids; do
          mkdir -p /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c; done &&
        mkdir -p /sys/fs/cgroup/systemd &&
        mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd &&
        exec env SLURM_CONF="$0" /usr/sbin/slurmd -N "$1"' "$SLURM_CONF" "host-$h"
  done
  local end=$(($(date +%s) + 60))
  until [ "$(on b env SLURM_CONF="$SLURM_CONF" sinfo -h -N -o %T 2>/dev/null |
            grep -cE '^(idle|mixed|allocated)')" = 2 ]; do
    if [ "$(date +%s)" -ge "$end" ]; then
      say "the two nodes did not come up in 60 s"; tail -n 20 "$LOGS"/*.log >&2 || true; exit 1
    fi
    sleep 0.5
  done
  on b env SLURM_CONF="$SLURM_CONF" sinfo -N >&2
  say "up: nodes host-a, host-b (SLURM_CONF=$SLURM_CONF)"
}

down() {
  for f in "$RUN"/slurmd-*.pid "$RUN/slurmctld.pid"; do
    [ -f "$f" ] && alive "$f" && kill "$(cat "$f")" 2>/dev/null || true
  done
  rm -rf "$STATE" "$RUN"
  say "down"
}

case ${1:-} in
  up) up ;;
  down) down ;;
  exec) [ $# -ge 3 ] || { say "usage: exec a|b CMD ..."; exit 1; }
        h=$2; shift 2; on "$h" env SLURM_CONF="$SLURM_CONF" "$@" ;;
  *) say "usage: $0 up|down|exec H CMD..."; exit 1 ;;
esac
