#!/bin/sh
# What the OAR job of a Saline best-effort vjob runs: it holds the nodes while the site
# master runs the vjob's VMs on them. OAR's checkpoint signal is only noted here (the manager
# acts on OAR's CHECKPOINT event); SIGUSR1 from the manager means the vjob finished.
# POSIX sh: it runs as the user on the node. Arguments: KEY [VJOB SOCKET stage|hold]. With the
# `vjob` command (the manager's path, when it exists on the node), `stage` first sends the
# current directory (OAR's submission directory) to the manager, and on SIGUSR1 the vjob's
# output is printed here, into OAR's own OAR.<id>.stdout/.stderr. Its own lines go to stderr.
key=${1:-?}
vjob=${2:-}
sock=${3:-}
mode=${4:-hold}
say() { echo "$(date +%T) vjob $key: $*" >&2; }
usable() { [ -n "$vjob" ] && [ -x "$vjob" ] && [ -S "$sock" ]; }  # the socket: only on the master's host
released() {
  say "released"
  if usable; then
    "$vjob" besteffort --socket "$sock" output --both "$key" || say "output not fetched"
  fi
  exit 0
}
trap released USR1
trap 'say "released"; exit 0' TERM
trap 'say "checkpoint signal"' USR2 HUP INT
if [ "$mode" = stage ]; then
  if usable; then
    "$vjob" besteffort --socket "$sock" stage "$key" || say "directory not sent (COMMAND starts in an empty home)"
  else
    say "no vjob command at '$vjob' or no socket at '$sock' on this node: directory not sent"
  fi
fi
say "holding the nodes for the Saline manager"
while :; do
  sleep 5 &
  wait $!
done
