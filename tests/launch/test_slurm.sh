#!/usr/bin/env bash
# Slurm for real: start a one-node cluster on this machine (munged,
# slurmctld, slurmd with a private config, ports and state directory), submit
# launch/slurm/refit-colocated.sbatch with sbatch, wait for it (bounded), and
# require that the refit ran through srun and verified; then run the
# disaggregated script in async mode the same way. Stops every daemon
# it started. Needs root (the daemons) and Debian's slurm-wlm packages
# (launch/bootstrap.sh test installs them); exits 77 (skipped) otherwise.
#   test_slurm.sh BUILD_DIR
set -uo pipefail
build=$1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
[ "$(id -u)" -eq 0 ] || { echo "test_slurm: skipped: needs root to run slurmd"; exit 77; }
for b in munged slurmctld slurmd sbatch srun; do
  command -v $b >/dev/null 2>&1 || PATH=$PATH:/usr/sbin
  command -v $b >/dev/null 2>&1 ||
    { echo "test_slurm: skipped: $b not installed (launch/bootstrap.sh test installs slurm)"; exit 77; }
done

tmp=$(mktemp -d /tmp/refit-slurm.XXXXXX)
chmod 755 "$tmp"
pids=()
cleanup() {
  # Stop what this test started, by pid, newest first.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[$i]}" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "test_slurm: FAIL: $*"
  for f in "$tmp"/*.log; do echo "--- $f"; tail -n 20 "$f"; done
  exit 1
}

host=$(hostname -s)
cpus=$(nproc)
# The node offers at least 4 CPUs to the scheduler, so the 4-rank demo fits
# on a 2-core machine (config_overrides lets slurmd accept more CPUs than it
# counts; the ranks then share cores, as with --overcommit).
slots=$((cpus > 4 ? cpus : 4))
# Ports unlikely to collide with a real cluster on this machine.
base=$((17000 + $$ % 1000 * 2))

# munge with its own socket: a system munged (if any) is left alone.
install -m 0400 /etc/munge/munge.key "$tmp/munge.key" 2>/dev/null ||
  { dd if=/dev/urandom of="$tmp/munge.key" bs=1024 count=1 2>/dev/null; chmod 400 "$tmp/munge.key"; }
munged --force --socket="$tmp/munge.sock" --key-file="$tmp/munge.key" \
  --pid-file="$tmp/munged.pid" --log-file="$tmp/munged.log" \
  --seed-file="$tmp/munge.seed" --foreground &
pids+=($!)

cat >"$tmp/slurm.conf" <<CONF
ClusterName=refittest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$base
SlurmdPort=$((base + 1))
AuthType=auth/munge
AuthInfo=socket=$tmp/munge.sock
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
GresTypes=gpu
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=$slots Gres=gpu:2 State=UNKNOWN
PartitionName=refit Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
# Two stand-in GPUs so the script's --gpus-per-node is scheduled as on a
# cluster; Slurm wants a device file per GPU, and this machine has no GPUs,
# so two harmless character devices stand in (nothing opens them).
printf 'NodeName=%s Name=gpu File=/dev/null\nNodeName=%s Name=gpu File=/dev/zero\n' \
  "$host" "$host" >"$tmp/gres.conf"
mkdir -p "$tmp/state" "$tmp/spool"
export SLURM_CONF=$tmp/slurm.conf

for _ in $(seq 50); do [ -S "$tmp/munge.sock" ] && break; sleep 0.1; done
[ -S "$tmp/munge.sock" ] || fail "munged did not start"
slurmctld -D -i >"$tmp/slurmctld.out.log" 2>&1 &
pids+=($!)
slurmd -D >"$tmp/slurmd.out.log" 2>&1 &
pids+=($!)

state=""
for _ in $(seq 60); do
  state=$(sinfo -h -n "$host" -o %T 2>/dev/null | head -n1)
  case "$state" in idle|mixed|allocated) break ;; esac
  sleep 0.5
done
[ "$state" = idle ] || fail "node not idle after 30 s (state '$state')"
echo "test_slurm: one-node cluster up on $host ($cpus cores)"

out=$tmp/job.out
# 4 ranks on 2 cores: --overcommit; the node's 2 stand-in GPUs.
cd "$root"
timeout 240 sbatch --wait --overcommit --nodes=1 --ntasks=4 \
  --cpus-per-task=1 --gpus-per-node=2 --time=5 --output="$out" --error="$out" \
  launch/slurm/refit-colocated.sbatch configs/demo.yaml "$build" >"$tmp/sbatch.log" 2>&1
rc=$?
cat "$tmp/sbatch.log"
cat "$out" 2>/dev/null
[ $rc -eq 0 ] || fail "sbatch --wait exited $rc"
grep -q "refit-launch: srun -n 4 --mpi=pmix" "$out" || fail "the job did not start ranks with srun"
grep -q "node-local rank 3 of 4, GPU 1" "$out" || fail "no GPU mapping printed"
grep -q "refit-run: verified: 3 refits" "$out" || fail "the refit did not verify"

# The disaggregated script, run for real in async mode, scaled to this one
# node (block placement: trainer ranks first, generator ranks after; it is
# meant for separate trainer and generator nodes).
sed 's/^  mode: sync/  mode: async/' configs/demo.yaml >"$tmp/demo-async.yaml"
grep -q "mode: async" "$tmp/demo-async.yaml" || fail "could not make an async demo config"
out2=$tmp/job2.out
timeout 240 sbatch --wait --overcommit --nodes=1 --ntasks=4 \
  --cpus-per-task=1 --gpus-per-node=2 --time=5 --output="$out2" --error="$out2" \
  launch/slurm/refit-disaggregated.sbatch "$tmp/demo-async.yaml" "$build" \
  >"$tmp/sbatch2.log" 2>&1
rc=$?
cat "$tmp/sbatch2.log"
cat "$out2" 2>/dev/null
[ $rc -eq 0 ] || fail "sbatch --wait (disaggregated) exited $rc"
grep -q "refit-launch: srun -n 4 --mpi=pmix --distribution=block" "$out2" ||
  fail "the disaggregated job did not start ranks with srun in block placement"
grep -q "mode async" "$out2" || fail "the disaggregated job did not run in async mode"
grep -q "refit-run: verified: 3 refits" "$out2" || fail "the disaggregated refit did not verify"
echo "test_slurm: ok"
