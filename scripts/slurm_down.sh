#!/usr/bin/env bash
# Stop what scripts/slurm_up.sh started, each daemon by the pid in its own pid file (never by
# name): slurmd first (it ignores SIGTERM while it retries a missing controller), then
# slurmctld, slurmdbd, MariaDB, munge. SIGTERM, up to 10 s, then SIGKILL. Safe to run twice.
set -u
stop() {
  local pidfile=$1 name=$2 pid st i
  pid=$(cat "$pidfile" 2>/dev/null) || { echo "slurm_down: $name not running (no $pidfile)"; return 0; }
  if [ -z "$pid" ] || ! kill "$pid" 2>/dev/null; then
    echo "slurm_down: $name not running"
    rm -f "$pidfile"
    return 0
  fi
  for i in $(seq 100); do
    st=$(ps -o stat= -p "$pid" 2>/dev/null) || break
    case "$st" in Z*) break ;; esac
    sleep 0.1
  done
  if st=$(ps -o stat= -p "$pid" 2>/dev/null) && [ "${st#Z}" = "$st" ]; then
    kill -9 "$pid" 2>/dev/null
    echo "slurm_down: killed $name (pid $pid) with SIGKILL"
  else
    echo "slurm_down: stopped $name (pid $pid)"
  fi
  rm -f "$pidfile"
}
stop /run/slurmd.pid slurmd
stop /run/slurmctld.pid slurmctld
stop /run/slurmdbd.pid slurmdbd
stop /run/mysqld/mysqld.pid mariadb
stop /run/munge/munged.pid munged
