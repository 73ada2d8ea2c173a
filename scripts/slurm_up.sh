#!/usr/bin/env bash
# Bring up a single-node SLURM 22.05 cluster on this machine (Debian bookworm, root, no systemd):
# munge, MariaDB + slurmdbd (accounting, so submitit sees jobs that die without a result),
# slurmctld and one slurmd named `localhost` with this machine's cores and 80% of its memory,
# in the partition `debug`. Idempotent: a daemon whose pid file names a live process is left
# running, packages are installed only when missing. scripts/slurm_down.sh stops what this starts.
#   WITH_DBD=0   skip MariaDB/slurmdbd (then `sacct` fails; a lost job makes submitit wait forever)
set -euo pipefail
WITH_DBD=${WITH_DBD:-1}
t0=$(date +%s)
say() { echo "slurm_up: $*"; }
# A pid file naming a live (non-zombie) process; pgrep would also match zombies.
alive() {
  local pid st
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] || return 1
  st=$(ps -o stat= -p "$pid" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "${st#Z}" = "$st" ]
}
# wait_for SECONDS DESCRIPTION COMMAND...: poll COMMAND every 0.2 s.
wait_for() {
  local secs=$1 what=$2 end
  shift 2
  end=$(($(date +%s) + secs))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$end" ]; then
      echo "slurm_up: timed out after ${secs}s waiting for $what" >&2
      tail -n 20 /var/log/slurm/*.log >&2 2>/dev/null || true
      return 1
    fi
    sleep 0.2
  done
}
# start PIDFILE NAME COMMAND...: run COMMAND unless PIDFILE names a live process.
start() {
  local pidfile=$1 name=$2
  shift 2
  if alive "$pidfile"; then
    say "$name already running (pid $(cat "$pidfile"))"
  else
    "$@"
    say "started $name"
  fi
}

[ "$(id -u)" = 0 ] || { echo "slurm_up: must run as root" >&2; exit 1; }

pkgs="slurmctld slurmd slurm-client munge"
[ "$WITH_DBD" = 1 ] && pkgs="$pkgs slurmdbd mariadb-server"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  say "installing:$missing"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
else
  say "packages present"
fi

ncpu=$(nproc)
mem_mb=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 * 8 / 10))
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
if [ "$WITH_DBD" = 1 ]; then
  accounting="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819"
else
  accounting="AccountingStorageType=accounting_storage/none"
fi
conf_new=$(mktemp)
cat > "$conf_new" <<CONF
# Written by replay_exp scripts/slurm_up.sh: one node (localhost), partition debug.
ClusterName=ci
# A requeued job waits cred_expire seconds (default 120) before it may start again.
AuthInfo=cred_expire=15
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldPort=6817
SlurmdPort=6818
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
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
NodeName=localhost NodeAddr=127.0.0.1 CPUs=${ncpu} RealMemory=${mem_mb} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
${accounting}
CONF
conf_changed=0
if cmp -s "$conf_new" /etc/slurm/slurm.conf; then rm -f "$conf_new"; else
  mv "$conf_new" /etc/slurm/slurm.conf && chmod 644 /etc/slurm/slurm.conf && conf_changed=1
fi
say "wrote /etc/slurm/slurm.conf (CPUs=${ncpu} RealMemory=${mem_mb} MB, accounting: $([ "$WITH_DBD" = 1 ] && echo slurmdbd || echo none))"

mkdir -p /run/munge
chown munge:munge /run/munge
start /run/munge/munged.pid munged su -s /bin/sh munge -c /usr/sbin/munged
wait_for 10 munge munge -n

if [ "$WITH_DBD" = 1 ]; then
  mkdir -p /run/mysqld
  chown mysql:mysql /run/mysqld
  start_mariadb() {
    setsid /usr/sbin/mariadbd --user=mysql --bind-address=127.0.0.1 \
      --pid-file=/run/mysqld/mysqld.pid >>/var/log/slurm/mariadbd.log 2>&1 < /dev/null &
  }
  start /run/mysqld/mysqld.pid mariadb start_mariadb
  wait_for 30 mariadb mariadb-admin ping
  mariadb -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmpw';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
  cat > /etc/slurm/slurmdbd.conf <<CONF
# Written by replay_exp scripts/slurm_up.sh.
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
PidFile=/run/slurmdbd.pid
LogFile=/var/log/slurm/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
CONF
  chmod 600 /etc/slurm/slurmdbd.conf
  start /run/slurmdbd.pid slurmdbd /usr/sbin/slurmdbd
  wait_for 30 slurmdbd timeout 5 sacctmgr -n -P show cluster
  if ! timeout 10 sacctmgr -n -P show cluster format=cluster | grep -qx ci; then
    timeout 10 sacctmgr -i add cluster ci >/dev/null
    say "registered cluster ci in the accounting database"
  fi
fi

if [ "$conf_changed" = 1 ] && alive /run/slurmctld.pid; then
  timeout 10 scontrol reconfigure && say "slurm.conf changed: scontrol reconfigure"
fi
start /run/slurmctld.pid slurmctld /usr/sbin/slurmctld
start /run/slurmd.pid slurmd /usr/sbin/slurmd -N localhost
node_idle() { timeout 3 sinfo -h -N -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; }
wait_for 60 "node localhost to be idle" node_idle
timeout 5 sinfo
say "up in $(($(date +%s) - t0)) s"
