#!/usr/bin/env bash
# Two separately launched jobs meet through refit_comm_join and refit
# (tests/python/join_job.py): the generator job first, the trainer job later,
# each its own mpirun; then each side alone, which must time out naming the
# port file. Then the secret: a stranger that claims the port file and sends
# the old constant hello is refused and never merged; a trainer with another
# key file is refused in both directions; a key file others may read is
# refused before anything is published. Open MPI's mpirun needs an
# ompi-server shared by both launches to connect them: this script starts one
# and stops it.
#   run_join.sh BUILD_DIR CONFIG
set -uo pipefail
build=$(cd "$1" && pwd) config=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/python_env.sh" || exit 1
command -v ompi-server >/dev/null || { echo "run_join: FAIL: no ompi-server (openmpi-bin)"; exit 1; }
tmp=$(mktemp -d)
server=""
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
ompi-server --no-daemonize --report-uri "$tmp/uri" &
server=$!
for _ in $(seq 100); do [ -s "$tmp/uri" ] && break; sleep 0.1; done
[ -s "$tmp/uri" ] || { echo "run_join: FAIL: ompi-server wrote no URI"; exit 1; }
read -r ntrainer ngenerator < <("$python" -c "
import yaml, sys
c = yaml.safe_load(open(sys.argv[1])); t = c.get('trainer', {}); g = c.get('generator', {})
print(t.get('tp', 1) * t.get('pp', 1) * t.get('dp', 1), g.get('tp', 1) * g.get('engines', 1))" "$config")
launch() { # launch NP SIDE TIMEOUT [--expect-timeout]
  "$root/launch/refit-launch" --build-dir "$build" --np "$1" \
    --launcher-args "--ompi-server file:$tmp/uri" "$config" -- \
    "$python" "$here/join_job.py" "$2" "$config" "$tmp/port" "$3" "${@:4}"
}
fail=0
check() { # check NAME LOG RC COUNT: exit 0 and COUNT ranks passed
  cat "$2"
  local n
  n=$(grep -o "join_job: passed" "$2" | wc -l) # ranks interleave their lines
  if [ "$3" -ne 0 ] || [ "$n" -ne "$4" ]; then
    echo "run_join: FAIL: $1 (exit status $3, $n of $4 ranks passed)"
    fail=1
  fi
}
launch "$ngenerator" generator 60 >"$tmp/gen.log" 2>&1 &
gen=$!
sleep 2 # the trainer job starts later, as a separate job would
launch "$ntrainer" trainer 60 >"$tmp/trainer.log" 2>&1
rc_t=$?
wait "$gen"
rc_g=$?
check "generator job" "$tmp/gen.log" $rc_g "$ngenerator"
check "trainer job" "$tmp/trainer.log" $rc_t "$ntrainer"
launch "$ngenerator" generator 3 --expect-timeout >"$tmp/alone.log" 2>&1
check "generator alone" "$tmp/alone.log" $? "$ngenerator"
launch "$ntrainer" trainer 3 --expect-timeout >"$tmp/alone.log" 2>&1
check "trainer alone" "$tmp/alone.log" $? "$ntrainer"
[ -f "$tmp/port.key" ] && [ "$(stat -c %a "$tmp/port.key")" = 600 ] ||
  { echo "run_join: FAIL: no key file $tmp/port.key of mode 0600"; fail=1; }

# A stranger (no key) claims the port and sends the first protocol's hello.
launch "$ngenerator" generator 20 --expect-error "did not prove that it holds the key" \
  >"$tmp/gen.log" 2>&1 &
gen=$!
sleep 2
timeout -k 5 30 "$root/launch/refit-launch" --build-dir "$build" --np 1 \
  --launcher-args "--ompi-server file:$tmp/uri" "$config" -- \
  "$python" "$here/join_job.py" trainer "$config" "$tmp/port" 20 --intruder >"$tmp/intruder.log" 2>&1
wait "$gen"
check "generator refusing a stranger" "$tmp/gen.log" $? "$ngenerator"
cat "$tmp/intruder.log"
grep -q "join_job: intruder: connected" "$tmp/intruder.log" ||
  { echo "run_join: FAIL: the intruder did not get as far as connecting"; fail=1; }
if grep -q "join_job: intruder: merged" "$tmp/intruder.log"; then
  echo "run_join: FAIL: a stranger without the key was merged with the generators"; fail=1
fi

# A trainer job with another key: each side refuses the other.
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/other.key" && chmod 600 "$tmp/other.key"
launch "$ngenerator" generator 20 --expect-error "did not prove that it holds the key" \
  >"$tmp/gen.log" 2>&1 &
gen=$!
sleep 2
REFIT_JOIN_KEY_FILE=$tmp/other.key launch "$ntrainer" trainer 20 \
  --expect-error "refused this job's key" >"$tmp/trainer.log" 2>&1
rc_t=$?
wait "$gen"
check "generator refusing another key" "$tmp/gen.log" $? "$ngenerator"
check "trainer with another key" "$tmp/trainer.log" $rc_t "$ntrainer"

# A key file others may read is refused before the port is published.
chmod 644 "$tmp/port.key"
launch "$ngenerator" generator 5 --expect-error "has mode 0644" >"$tmp/alone.log" 2>&1
check "generator with a readable key file" "$tmp/alone.log" $? "$ngenerator"
[ -e "$tmp/port" ] && { echo "run_join: FAIL: a port was published"; fail=1; }
[ $fail -eq 0 ] && echo "run_join: ok"
exit $fail
