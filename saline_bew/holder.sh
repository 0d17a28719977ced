#!/bin/sh
# What the OAR job of a Saline best-effort vjob runs: it holds the nodes while the site
# master runs the vjob's VMs on them. OAR's checkpoint signal is only noted here (the manager
# acts on OAR's CHECKPOINT event); SIGUSR1 from the manager means the vjob finished.
# POSIX sh only: it runs as the user on the node, where vjob's Python may not be reachable.
key=${1:-?}
trap 'echo "$(date +%T) vjob $key: released"; exit 0' USR1 TERM
trap 'echo "$(date +%T) vjob $key: checkpoint signal"' USR2 HUP INT
echo "$(date +%T) vjob $key: holding the nodes for the Saline manager"
while :; do
  sleep 5 &
  wait $!
done
