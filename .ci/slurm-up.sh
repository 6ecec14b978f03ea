#!/usr/bin/env bash
# Start a one-node Slurm cluster on this machine (munged, slurmctld, slurmd) for the tests that
# submit real jobs. Idempotent: what is installed stays installed, what runs keeps running, so
# .ci/run and a developer can call it any number of times. Needs root (it writes /etc and starts
# daemons); as another user it says so and does nothing.
# No slurmdbd: jobs are tracked by slurmctld alone (sacct does not work), which is why
# parascale's status also reads a marker each job writes (docs/slurm.md).
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
  echo "slurm-up: not root, leaving Slurm alone (the Slurm tests will skip)" >&2
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  apt-get update -qq >/dev/null
  apt-get install -y -qq slurm-wlm munge >/dev/null
fi

# munge: a shared key (one node, so any random key will do), then the daemon.
if [ ! -s /etc/munge/munge.key ]; then
  head -c 1024 /dev/urandom > /etc/munge/munge.key
fi
chown munge:munge /etc/munge/munge.key
chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  # --force: the log folder's ownership is not what munged wants on a fresh image
  runuser -u munge -- munged --force
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi

host=$(hostname -s)
cpus=$(nproc)
# leave the OS some memory: Slurm refuses a node whose RealMemory exceeds what it sees
mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
conf=/etc/slurm/slurm.conf
want=$(cat <<CONF
# written by parascale's .ci/slurm-up.sh: a one-node cluster for tests
ClusterName=parascale-ci
SlurmctldHost=$host
AuthType=auth/munge
SlurmUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
# a finished job stays visible to scontrol for 5 minutes (the default, said out loud)
MinJobAge=300
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
)
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
changed=0
if [ ! -f "$conf" ] || [ "$(cat "$conf")" != "$want" ]; then
  printf '%s\n' "$want" > "$conf"
  changed=1
fi

# alive by its pid file (pgrep's procps is not on every image)
running() { [ -s "/run/$1.pid" ] && kill -0 "$(cat "/run/$1.pid")" 2>/dev/null; }
if [ "$changed" = 1 ] && running slurmctld; then
  scontrol reconfigure || true
fi
if ! running slurmctld; then slurmctld -c; fi
if ! running slurmd; then slurmd; fi

# wait until the node takes jobs (about 3 s on a fresh start)
for _ in $(seq 60); do
  state=$(sinfo -h -N -o '%t' 2>/dev/null | head -1 || true)
  case "$state" in
    idle|mix|alloc) echo "slurm-up: node $host is $state"; exit 0 ;;
    down*|drain*) scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true ;;
  esac
  sleep 0.5
done
echo "slurm-up: the node did not become idle (sinfo: ${state:-nothing}); see /var/log/slurm" >&2
exit 1
