#!/bin/bash
# refit-plan at the model bounds of runtime/src/config/config_table.h: one past a
# bound is refused at its key (file:line:col, exit 2, no plan); every
# dimension at its bound at once plans or is refused with a message (exit
# 1), within the time limit: never a crash, a hang or a division by zero.
# Usage: test_plan_bounds.sh BUILD_DIR
set -u
plan="$1/runtime/refit-plan"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0

model() { # H L Q KV D V X I
  cat <<YAML
model:
  family: qwen3_moe
  hidden_size: $1
  num_layers: $2
  num_attention_heads: $3
  num_kv_heads: $4
  head_dim: $5
  vocab_size: $6
  num_experts: $7
  moe_intermediate_size: $8
refit:
  bucket_bytes: ${9:-1GiB}
YAML
}

# One past each bound: refused where it is written.
i=0
while read -r key args; do
  i=$((i + 1))
  model $args > "$dir/over$i.yaml"
  out=$(timeout 20 "$plan" "$dir/over$i.yaml" 2>&1)
  rc=$?
  if [ $rc -ne 2 ] || ! grep -q "over$i.yaml:[0-9]*:[0-9]*:.*$key" <<<"$out"; then
    echo "FAIL: $key past its bound: rc $rc, expected 2 and file:line:col naming it"
    echo "$out" | head -5
    fail=1
  fi
done <<'CASES'
hidden_size 131073 4 16 8 128 1024 8 256
num_layers 4096 1025 16 8 128 1024 8 256
num_attention_heads 4096 4 1025 8 128 1024 8 256
head_dim 4096 4 16 8 1025 1024 8 256
vocab_size 4096 4 16 8 128 4194305 8 256
num_experts 4096 4 16 8 128 1024 4097 256
moe_intermediate_size 4096 4 16 8 128 1024 8 65537
hidden_size 2147483648 4 16 8 128 1024 8 256
CASES

# At the bounds (bucket_bytes at most 2 GiB - 1, what one MPI message
# carries): each dimension at its maximum in turn, then the largest
# rows at once with the smallest bucket. Plans (exit 0) or says why (1).
i=0
while read -r args; do
  i=$((i + 1))
  model $args > "$dir/at$i.yaml"
  out=$(timeout 60 "$plan" "$dir/at$i.yaml" 2>&1)
  rc=$?
  if [ $rc -ne 0 ] && { [ $rc -ne 1 ] || ! grep -q "refit-plan: " <<<"$out"; }; then
    echo "FAIL: at the bounds ($args): rc $rc (0 or a refusal expected)"
    echo "$out" | tail -5
    fail=1
  else
    echo "ok: at the bounds ($args): rc $rc: $(grep -E 'predicted|refit-plan: ' <<<"$out" | head -1)"
  fi
done <<'CASES'
131072 2 16 8 128 1024 8 256
1024 1024 16 8 128 1024 8 256
1024 2 1024 1024 1024 1024 8 256 2147483647
1024 2 16 8 128 4194304 8 256 2147483647
1024 2 16 8 128 1024 4096 256
1024 2 16 8 128 1024 8 65536
131072 2 1024 1024 1024 4194304 8 65536 64KiB
131072 2 1024 1024 1024 4194304 8 65536 2147483647
CASES
exit $fail
