#!/usr/bin/env bash
# A single-node Slurm on this machine, for `nox -s slurm` (the slurm launcher against a real
# scheduler). Needs root and Debian's packages (installed here when missing).
#
#   scripts/slurm_local.sh start   install if needed, write $GEOSPEC_SLURM_DIR/slurm.conf, start
#                                  munged, slurmctld and slurmd, wait until the node is idle
#   scripts/slurm_local.sh stop    stop the daemons this script started (by their pid files)
#   scripts/slurm_local.sh env     print the `export SLURM_CONF=...` line the clients need
#
# Everything lives under $GEOSPEC_SLURM_DIR (default /tmp/geospec-slurm): the configuration,
# the state, the logs and the pid files. /etc/slurm is left alone: the clients (sbatch, squeue,
# scontrol, scancel) find this cluster through SLURM_CONF.
set -euo pipefail

DIR="${GEOSPEC_SLURM_DIR:-/tmp/geospec-slurm}"
CONF="$DIR/slurm.conf"

install() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
        && command -v sbatch >/dev/null; then
        return
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "slurm_local.sh: slurmctld, slurmd, munge and the clients are missing and this is not root" >&2
        exit 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
}

write_conf() {
    local host cpus memory
    host="$(hostname -s)"
    cpus="$(nproc --all)"
    memory="$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)"
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
    cat >"$CONF" <<EOF
# written by scripts/slurm_local.sh: one node, this machine
ClusterName=geospec-local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
KillWait=30
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$host CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
    install
    write_conf
    export SLURM_CONF="$CONF"
    if ! alive "$DIR/munged.pid"; then
        mkdir -p /run/munge "$DIR/munge"
        chown munge:munge /run/munge 2>/dev/null || true
        # as root (--force), our own socket and pid file: an existing munged is left alone
        munged --force --socket="$DIR/munge/munge.socket.2" --pid-file="$DIR/munged.pid" \
            --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed"
    fi
    # slurm's munge plugin reads the socket path from AuthInfo
    if ! grep -q '^AuthInfo=' "$CONF"; then
        echo "AuthInfo=socket=$DIR/munge/munge.socket.2" >>"$CONF"
    fi
    alive "$DIR/slurmctld.pid" || slurmctld -f "$CONF"
    alive "$DIR/slurmd.pid" || slurmd -f "$CONF"
    for _ in $(seq 60); do
        if sinfo -h -o '%T' 2>/dev/null | grep -qx 'idle'; then
            echo "slurm_local.sh: Slurm is up on $(hostname -s) ($(nproc --all) CPUs); export SLURM_CONF=$CONF"
            return
        fi
        sleep 1
    done
    echo "slurm_local.sh: the node did not become idle within 60 s; sinfo says:" >&2
    sinfo -N -l >&2 || true
    tail -n 20 "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" >&2 || true
    exit 1
}

stop() {
    local name pid
    for name in slurmd slurmctld munged; do
        if alive "$DIR/$name.pid"; then
            pid="$(cat "$DIR/$name.pid")"
            kill "$pid"
            for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        fi
        rm -f "$DIR/$name.pid"
    done
    echo "slurm_local.sh: stopped"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
env) echo "export SLURM_CONF=$CONF" ;;
*)
    echo "usage: scripts/slurm_local.sh start|stop|env" >&2
    exit 2
    ;;
esac
