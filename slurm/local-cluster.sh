#!/usr/bin/env bash
# A one-node SLURM cluster on localhost, for `make test-slurm` (needs root and Debian's
# slurm-wlm + munge, which `make test-slurm` installs). Not for production clusters.
#
#   slurm/local-cluster.sh start DIR   # writes DIR/slurm.conf, starts munged, slurmctld, slurmd
#   slurm/local-cluster.sh stop DIR    # stops them
#
# Daemons run as root with no cgroups (proctrack/linuxproc, task/none), state and logs in
# DIR. Callers point SLURM_CONF at DIR/slurm.conf.
set -euo pipefail

cmd=${1:?usage: local-cluster.sh start|stop DIR}
dir=$(realpath -m "${2:?usage: local-cluster.sh start|stop DIR}")
host=$(hostname -s)
cpus=$(nproc)
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
export SLURM_CONF="$dir/slurm.conf"

stop() {
  for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid"; do
    if [[ -s $pidfile ]]; then kill "$(cat "$pidfile")" 2>/dev/null || true; fi
  done
  for _ in $(seq 50); do
    pgrep -f "slurm(ctl)?d .*-f $dir/slurm.conf" >/dev/null || break
    sleep 0.2
  done
  pkill -9 -f "slurm(ctl)?d .*-f $dir/slurm.conf" 2>/dev/null || true
  rm -f "$dir/slurmd.pid" "$dir/slurmctld.pid"
}

case $cmd in
  stop) stop; exit 0 ;;
  start) ;;
  *) echo "unknown command $cmd (expected start or stop)" >&2; exit 2 ;;
esac

mkdir -p "$dir/state" "$dir/spool"
cat >"$dir/slurm.conf" <<EOF
ClusterName=inferencelab
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldPort=16817
SlurmdPort=16818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MpiDefault=none
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF

stop
if ! pgrep -x munged >/dev/null; then
  mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
  if [[ ! -s /etc/munge/munge.key ]]; then
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  fi
  runuser -u munge -- /usr/sbin/munged || /usr/sbin/munged --force
fi
/usr/sbin/slurmctld -f "$dir/slurm.conf"
/usr/sbin/slurmd -f "$dir/slurm.conf"

for _ in $(seq 60); do
  state=$(sinfo -h -N -o %t 2>/dev/null | head -1 || true)
  if [[ $state == idle* ]]; then
    echo "slurm up on $host ($cpus CPUs, ${mem_mb} MB); SLURM_CONF=$dir/slurm.conf"
    exit 0
  fi
  sleep 1
done
echo "slurm did not become idle; node state '${state:-none}'" >&2
tail -20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
exit 1
