# Sourced by the test scripts that need GPUs: refit_visible_gpus prints how
# many GPUs nvidia-smi lists (0 where it lists none or is not installed), so
# that a test without the GPUs it needs skips (exit 77) before it starts a
# job, or imports torch, to find that out.
refit_visible_gpus() {
  nvidia-smi -L 2>/dev/null | grep -c "^GPU "
}
