#!/usr/bin/env bash
# C framework processes attached to refit agents (refit/agent.h):
#   run_agent_c.sh BUILD_DIR [VERSIONS]
# Checks that librefit-agent.so and its client link no MPI, no librefit and
# no CUDA and export the public API alone; starts the agents of
# moe_synthetic_c.yaml through launch/refit-launch, waits for DIR/ready, runs
# two engines and two trainers of tests/agent/agent_client_c.c (VERSIONS
# refits, default 3, every engine byte verified by its agent), then a
# trainer client that shuts the job down. Every process must exit 0.
set -uo pipefail
build=$(cd "$1" && pwd)
versions=${2:-3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
lib=$build/runtime/librefit-agent.so
client=$build/tests/agent/agent_client_c
config=$here/moe_synthetic_c.yaml
fail() { echo "run_agent_c: $*" >&2; exit 1; }

# What the library links and exports.
for f in "$lib" "$client"; do
  [ -e "$f" ] || fail "$f is not built"
  deps=$(ldd "$f") || fail "ldd $f failed"
  if grep -Eiq 'libmpi|libopen-pal|libpmix|librefit\.so|libcuda|libnccl|libucp' <<<"$deps"; then
    fail "$f links what a framework process must not load:"$'\n'"$deps"
  fi
done
exports=$(nm -D --defined-only "$lib" | awk '{print $3}')
grep -qx refit_agent_client_attach <<<"$exports" || fail "refit_agent_client_attach not exported"
grep -qx refit_last_error <<<"$exports" || fail "refit_last_error not exported"
for private in refit_agent_send refit_agent_recv refit_error_set; do
  ! grep -qx "$private" <<<"$exports" || fail "$lib exports the internal $private"
done

tmp=$(mktemp -d /tmp/refit-agent-c.XXXXXX) || exit 1
chmod 700 "$tmp"
dir=$tmp/s
agents=""
cleanup() {
  if [ -n "$agents" ] && kill -0 "$agents" 2>/dev/null; then
    kill -KILL -- "-$agents" 2>/dev/null
    wait "$agents" 2>/dev/null
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
show() {
  for f in "$tmp"/*.log; do echo "==== $(basename "$f")"; cat "$f"; done >&2
}

setsid "$root/launch/refit-launch" --build-dir "$build" "$config" -- \
  "$build/runtime/refit-agent" --socket-dir "$dir" --attach-grace 10 "$config" \
  >"$tmp/agents.log" 2>&1 &
agents=$!
for _ in $(seq 600); do
  [ -e "$dir/ready" ] && break
  kill -0 "$agents" 2>/dev/null || { show; fail "the agents exited before they were ready"; }
  sleep 0.1
done
[ -e "$dir/ready" ] || { show; fail "the agents were not ready within 60 s"; }

# Two engines, two trainers (the config's ranks), each a plain process.
pids=()
names=()
for role in "generator 0" "generator 1" "trainer 0" "trainer 1"; do
  set -- $role
  timeout 120 "$client" "$1" "$2" "$dir" "$versions" >"$tmp/$1$2.log" 2>&1 &
  pids+=($!)
  names+=("$1$2")
done
bad=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "run_agent_c: ${names[$i]} exited $rc" >&2
    bad=1
  fi
done
for g in generator0 generator1; do
  for v in $(seq "$versions"); do
    grep -q "^committed $v: 0 mismatches" "$tmp/$g.log" || { echo "$g: no version $v" >&2; bad=1; }
  done
  grep -q "^refused as expected: refit_agent_client_register_host(c, bad, 2)" \
    "$tmp/$g.log" || { echo "$g: unknown name not refused" >&2; bad=1; }
done
[ "$bad" -eq 0 ] || { show; fail "a client failed"; }

# The default directory: $REFIT_AGENT_DIR when no socket_dir is given.
REFIT_AGENT_DIR=$dir timeout 60 "$client" shutdown 0 "" 0 >"$tmp/shutdown.log" 2>&1 || { show; fail "shutdown failed"; }
for _ in $(seq 300); do
  kill -0 "$agents" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$agents" 2>/dev/null && { show; fail "the agents did not stop after shutdown"; }
wait "$agents"
rc=$?
agents=""
[ "$rc" -eq 0 ] || { show; fail "the agents ended with $rc"; }
! grep -q AddressSanitizer "$tmp"/*.log || { show; fail "a sanitizer report"; }
grep -h "refused as expected\|^committed\|^attached" "$tmp"/generator0.log "$tmp"/trainer0.log
echo "run_agent_c: ok ($versions versions, 2 engines, 2 trainers, in C)"
