#!/usr/bin/env bash
# Two emulated hosts on this machine, for the multinode tests (tests/runtime/test_multinode.py)
# and for trying a run across hosts by hand: network namespaces ${PREFIX}a and ${PREFIX}b, each
# with its own loopback, its own hostname (host-a, host-b: a UTS namespace per command) and an
# address on a veth pair between them (${NET}.1 and ${NET}.2/24); /etc/netns/<ns>/hosts names
# both (ip netns exec mounts it over /etc/hosts). Their traffic stays inside the two
# namespaces: nothing is routed anywhere else. The filesystem is shared, as on a cluster.
#
#   scripts/two_hosts.sh up                  create them (idempotent)
#   scripts/two_hosts.sh down                remove them and their files (idempotent)
#   scripts/two_hosts.sh exec a|b CMD ...    run CMD on host a or b
#   scripts/two_hosts.sh link a|b down|up    cut or restore a host's link (a lost host)
#   scripts/two_hosts.sh addr a|b            print a host's address
#   scripts/two_hosts.sh check               exit 0 if this machine can make them (root, ip
#                                            netns, unshare), else print why and exit 1
#
# Needs root, iproute2 (`ip netns`) and util-linux (`unshare`). Environment: TWO_HOSTS_PREFIX
# (default rx-), TWO_HOSTS_NET (default 10.231.7, a /24 no real network here uses).
set -euo pipefail
PREFIX=${TWO_HOSTS_PREFIX:-rx-}
NET=${TWO_HOSTS_NET:-10.231.7}
say() { echo "two_hosts: $*" >&2; }
die() { say "$*"; exit 1; }

ns() { echo "${PREFIX}$1"; }
addr() { case $1 in a) echo "$NET.1" ;; b) echo "$NET.2" ;; *) die "host must be a or b, not '$1'" ;; esac; }
veth() { echo "${PREFIX}v$1"; }

check() {
  [ "$(id -u)" = 0 ] || { echo "not root: network namespaces need root"; return 1; }
  command -v ip >/dev/null || { echo "no ip command (install iproute2)"; return 1; }
  ip netns list >/dev/null 2>&1 || { echo "ip netns does not work here"; return 1; }
  command -v unshare >/dev/null || { echo "no unshare command (install util-linux)"; return 1; }
  return 0
}

up() {
  why=$(check) || die "$why"
  for h in a b; do
    ip netns list | grep -qw "$(ns $h)" || ip netns add "$(ns $h)"
    ip -n "$(ns $h)" link set lo up
    mkdir -p "/etc/netns/$(ns $h)"
    printf '127.0.0.1 localhost\n%s host-a\n%s host-b\n' "$(addr a)" "$(addr b)" \
      > "/etc/netns/$(ns $h)/hosts"
  done
  if ! ip -n "$(ns a)" link show "$(veth a)" >/dev/null 2>&1; then
    ip link add "$(veth a)" type veth peer name "$(veth b)"
    for h in a b; do
      ip link set "$(veth $h)" netns "$(ns $h)"
      ip -n "$(ns $h)" addr add "$(addr $h)/24" dev "$(veth $h)"
    done
  fi
  for h in a b; do ip -n "$(ns $h)" link set "$(veth $h)" up; done
  say "up: host-a $(addr a) ($(ns a)), host-b $(addr b) ($(ns b))"
}

down() {
  for h in a b; do
    ip netns list 2>/dev/null | grep -qw "$(ns $h)" && ip netns del "$(ns $h)"
    rm -rf "/etc/netns/$(ns $h)"
  done
  say "down"
}

run_on() {  # run_on HOST CMD...: in the host's namespace, under its own hostname
  local h=$1
  shift
  ip netns list | grep -qw "$(ns "$h")" || die "host $h is not up (scripts/two_hosts.sh up)"
  exec ip netns exec "$(ns "$h")" unshare --uts sh -c 'hostname "$0" && exec "$@"' "host-$h" "$@"
}

case ${1:-} in
  up) up ;;
  down) down ;;
  check) check ;;
  addr) addr "${2:?host}" ;;
  exec) [ $# -ge 3 ] || die "usage: exec a|b CMD ..."; h=$2; shift 2; run_on "$h" "$@" ;;
  link) ip -n "$(ns "${2:?host}")" link set "$(veth "$2")" "${3:?up or down}" ;;
  *) die "usage: $0 up|down|check|addr H|exec H CMD...|link H up|down" ;;
esac
