#!/usr/bin/env bash
# A two-node Slurm cluster on this machine, everything under DIR: munge with its own key and socket,
# slurm.conf with free ports of its own, slurmctld and two slurmd. The nodes are named by loopback addresses
# (127.0.0.1 and 127.0.0.2, both this machine on Linux) so that the job's node list, from which a launcher
# takes its rendezvous endpoint, resolves without touching /etc/hosts; on a real cluster node names resolve.
#   scripts/slurm/cluster.sh start DIR   # prints the SLURM_CONF to export; waits until both nodes are idle
#   scripts/slurm/cluster.sh stop DIR    # stops only what `start DIR` started
# Needs slurm-wlm and munge (scripts/lib.sh: ensure_slurm).
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1
dir=$(realpath -m "$2")
export SLURM_CONF="$dir/slurm.conf"
sock="$dir/munge/munge.socket"
N1=127.0.0.1
N2=127.0.0.2
# How long the cluster may take to come up (it takes about a second here).
START_DEADLINE_S=${SLURM_START_DEADLINE_S:-30}

# free_ports N: N distinct TCP ports on loopback that nothing listens on now.
free_ports() {
    python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

write_conf() {
    local ctld n1 n2 srun_lo
    read -r ctld n1 n2 srun_lo <<<"$(free_ports 4)"
    # srun listens on a small range of its own; a range starting at a free port is free in practice.
    cat >"$SLURM_CONF" <<CONF
ClusterName=muster-test
SlurmctldHost=localhost
SlurmctldPort=$ctld
SlurmdPort=$n1
SrunPortRange=$srun_lo-$((srun_lo + 20))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
StateSaveLocation=$dir/state
SlurmctldPidFile=$dir/slurmctld.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdSpoolDir=$dir/spool/%n
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmdLogFile=$dir/%n.log
KillWait=5
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=$N1 NodeHostname=$(hostname) NodeAddr=$N1 Port=$n1 CPUs=2 RealMemory=1000
NodeName=$N2 NodeHostname=$(hostname) NodeAddr=$N2 Port=$n2 CPUs=2 RealMemory=1000
PartitionName=debug Nodes=$N1,$N2 Default=YES OverSubscribe=YES MaxTime=INFINITE State=UP
CONF
}

start() {
    command -v slurmctld >/dev/null && command -v munged >/dev/null || {
        echo "slurm-wlm and munge are not installed: source scripts/lib.sh; ensure_slurm" >&2
        exit 1
    }
    mkdir -p "$dir/munge" "$dir/state" "$dir/spool"
    chmod 700 "$dir/munge"
    if [ ! -f "$dir/munge/munge.key" ]; then
        mungekey --create --keyfile="$dir/munge/munge.key"
        chmod 400 "$dir/munge/munge.key"
    fi
    munged --force --socket="$sock" --key-file="$dir/munge/munge.key" --pid-file="$dir/munge/munged.pid" \
        --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed"
    write_conf
    slurmctld -i
    slurmd -N "$N1"
    slurmd -N "$N2"
    local deadline=$((SECONDS + START_DEADLINE_S)) states=""
    while [ $SECONDS -lt $deadline ]; do
        states=$(sinfo -h -N -o %t 2>/dev/null | sort -u | tr '\n' ' ') || true
        if [ "$states" = "idle " ]; then
            echo "$SLURM_CONF"
            return 0
        fi
        sleep 0.2
    done
    echo "slurm under $dir did not come up within ${START_DEADLINE_S}s (node states: '${states}'); logs in $dir" >&2
    stop
    exit 1
}

# kill_pidfile FILE: ends the process named in FILE (the ones `start` made), waiting for it to go.
kill_pidfile() {
    local pid
    [ -f "$1" ] || return 0
    pid=$(cat "$1")
    case "$pid" in '' | *[!0-9]*) return 0 ;; esac
    kill "$pid" 2>/dev/null || return 0
    local deadline=$((SECONDS + 10))
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
}

stop() {
    [ -f "$SLURM_CONF" ] || return 0
    # scontrol shutdown ends slurmctld and every slurmd of this cluster (and so their steps); the pid files
    # cover a controller that no longer answers.
    timeout 10 scontrol shutdown >/dev/null 2>&1 || true
    kill_pidfile "$dir/slurmd.$N1.pid"
    kill_pidfile "$dir/slurmd.$N2.pid"
    kill_pidfile "$dir/slurmctld.pid"
    if [ -S "$sock" ]; then
        munged -s --socket="$sock" >/dev/null 2>&1 || kill_pidfile "$dir/munge/munged.pid"
    fi
}

case "$cmd" in
    start) start ;;
    stop) stop ;;
    *) usage ;;
esac
