/*
 * Embedding refit in a trainer and an inference engine.
 *
 * One MPI job: the first ranks play a Megatron-Core trainer, the others a
 * vLLM-style inference engine (runtime/examples/embed.yaml says how many of
 * each). The trainer owns its tensors under Megatron-Core's names (fused
 * linear_qkv, per-rank [gate; up] linear_fc1, experts numbered per ep rank),
 * takes an "optimizer step" of its own on them and refits them as they are
 * (source.kind caller); the engine owns its runtime tensors under vLLM's
 * names, serves from them between refit_progress calls (async mode: it
 * keeps serving the committed version while the next streams into a
 * shadow) and commits at a safe point, then checks what it serves.
 *
 *   launch/refit-launch runtime/examples/embed.yaml -- \
 *     build/runtime/refit-example runtime/examples/embed.yaml
 *
 * The model is deliberately easy to check by eye: every weight of a module
 * kind starts at a value of its own (kind / 16) and each optimizer step adds
 * 0.5, so after step v every runtime element of that kind must read
 * kind / 16 + 0.5 v, whatever refit re-sharded, fused or split on the way.
 * (tests/caller checks every element's position against vLLM's rules; this
 * example shows the calls.) Error handling is the pattern a real program
 * needs: every call returns a status, refit_last_error() says why.
 */
#include "refit/refit.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                            \
  do {                                                                         \
    refit_status_t st_ = (call);                                               \
    if (st_ != REFIT_OK) {                                                     \
      fprintf(stderr, "%s failed: %s: %s\n", #call, refit_status_str(st_),     \
              refit_last_error());                                             \
      MPI_Abort(MPI_COMM_WORLD, 1);                                            \
    }                                                                          \
  } while (0)

/* Module kinds, as each side names them: a name's kind is the first row
 * whose Megatron (trainer) or vLLM (engine) fragment it contains. */
static const struct {
  const char *megatron, *vllm;
} kinds[] = {
    {"norm", "norm"}, /* every norm, fused into a linear layer by TE or not */
    {"linear_qkv", "qkv_proj"},
    {"linear_proj", "o_proj"},
    {"router", "mlp.gate.weight"},
    {"experts.linear_fc1", "w13_weight"},
    {"experts.linear_fc2", "w2_weight"},
    {"linear_fc1", "gate_up_proj"},
    {"linear_fc2", "down_proj"},
    {"word_embeddings", "embed_tokens"},
    {"output_layer", "lm_head"},
};
#define NKINDS ((int)(sizeof(kinds) / sizeof(kinds[0])))

static int kind_of(const char *name, int trainer) {
  for (int k = 0; k < NKINDS; k++)
    if (strstr(name, trainer ? kinds[k].megatron : kinds[k].vllm) != NULL)
      return k;
  return -1;
}

/* bfloat16 bits of a float that bfloat16 holds exactly (ours all do). */
static uint16_t bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return (uint16_t)(u >> 16);
}

static float value_at(int kind, uint64_t step) {
  return (float)(kind + 1) / 16.0f + 0.5f * (float)step;
}

/* The trainer's optimizer step: every weight moves by +0.5. */
static void optimizer_step(refit_session_h s, uint16_t **w, uint64_t step) {
  for (int64_t i = 0; i < refit_tensor_count(s); i++) {
    refit_tensor_t t;
    CHECK(refit_tensor_get(s, i, &t));
    const int kind = kind_of(t.name, 1);
    const uint16_t v = bf16(value_at(kind, step));
    for (size_t k = 0; k < t.bytes / 2; k++)
      w[i][k] = v;
  }
}

/* The engine's forward pass stands in as a read of every weight; after a
 * commit it also counts the elements that are not what step v makes. Rows
 * past the vocabulary (vLLM pads embed_tokens and lm_head to 64 rows) hold
 * zeros. */
static long long serve_one_step(refit_session_h s, uint64_t committed) {
  long long wrong = 0;
  for (int64_t i = 0; i < refit_tensor_count(s); i++) {
    refit_tensor_t t;
    CHECK(refit_tensor_get(s, i, &t));
    const uint16_t *p = t.data;
    const uint16_t want = bf16(value_at(kind_of(t.name, 0), committed));
    int padding = 0;
    for (size_t k = 0; k < t.bytes / 2; k++) {
      padding |= p[k] == 0 && committed > 0;
      wrong += committed > 0 && p[k] != (padding ? 0 : want);
    }
  }
  return wrong;
}

int main(int argc, char **argv) {
  refit_session_h s;
  int rank;
  if (argc != 2) {
    fprintf(stderr, "usage: refit-example CONFIG.yaml\n");
    return 2;
  }
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  CHECK(refit_session_open(MPI_COMM_WORLD, argv[1], &s));
  const int trainer = refit_session_side(s) == REFIT_SIDE_TRAINER;

  /* The application owns its memory: allocate every tensor refit expects
   * (refit_tensor_get names it, Megatron-style on the trainer, vLLM-style on
   * the engine) and register it, before the first refit. */
  const int64_t n = refit_tensor_count(s);
  uint16_t **mine = calloc((size_t)n, sizeof(*mine));
  for (int64_t i = 0; i < n; i++) {
    refit_tensor_t t;
    CHECK(refit_tensor_get(s, i, &t));
    if (trainer && kind_of(t.name, 1) < 0) {
      fprintf(stderr, "rank %d: no module kind for trainer tensor %s\n", rank, t.name);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    t.data = mine[i] = calloc(1, t.bytes);
    CHECK(refit_tensor_register(s, &t));
  }

  long long wrong = 0;
  for (uint64_t version = 1; version <= 3; version++) {
    int done = 0, served = 0;
    /* A training step writes the trainer's own tensors; refit_begin then
     * sends them as they are (a GPU trainer passes the stream its step ran
     * on instead of NULL). */
    if (trainer)
      optimizer_step(s, mine, version);
    CHECK(refit_begin(s, version, NULL));
    while (!done) {
      if (!trainer) {
        wrong += serve_one_step(s, version - 1); /* still the old version */
        served++;
      }
      CHECK(refit_progress(s, &done));
    }
    CHECK(refit_commit(s, NULL)); /* the engine's safe point */
    const long long now_wrong = trainer ? 0 : serve_one_step(s, version);
    wrong += now_wrong;
    printf("rank %d (%s): version %llu committed, %d serving steps during the "
           "refit, %s\n",
           rank, trainer ? "trainer" : "engine", (unsigned long long)version, served,
           trainer ? "sent as the trainer holds it"
           : now_wrong == 0 ? "serving what the trainer sent"
                            : "MISMATCH");
  }
  refit_session_close(s);
  for (int64_t i = 0; i < n; i++)
    free(mine[i]);
  free(mine);
  MPI_Finalize();
  return wrong == 0 ? 0 : 1;
}
