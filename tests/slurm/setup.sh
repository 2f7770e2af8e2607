#!/usr/bin/env bash
# A local single-node SLURM cluster for the tests (Debian/Ubuntu, as root): munge, slurmctld and
# slurmd on this machine, one node with its CPUs and memory, no accounting (the executor plugin
# reads job states with squeue). Idempotent: does nothing when the node already answers.
#   tests/slurm/setup.sh        # then: sinfo; srun hostname
set -euo pipefail
if sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
  exit 0
fi
if [[ $(id -u) != 0 ]]; then
  echo "tests/slurm/setup.sh: needs root (apt-get, daemons)" >&2
  exit 1
fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q slurm-wlm munge >/dev/null 2>&1 || { apt-get update -q >/dev/null; apt-get install -y -q slurm-wlm munge >/dev/null; }
fi

# munge: one key, the daemon as the munge user.
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
if [[ ! -s /etc/munge/munge.key ]]; then
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
fi
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged

host=$(hostname -s)
cpus=$(nproc)
mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
install -d /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=draftsmith-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldDebug=info
ReturnToService=2
MpiDefault=none
KillWait=30
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=main Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF

pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
for _ in $(seq 60); do
  if sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
    sinfo
    exit 0
  fi
  scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
  sleep 1
done
echo "tests/slurm/setup.sh: the node did not become idle; see /var/log/slurm/" >&2
exit 1
