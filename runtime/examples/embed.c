/*
 * Embedding refit in a trainer and an inference engine.
 *
 * One MPI job: the first ranks play the trainer, the others an inference
 * engine (the config says how many of each). The trainer writes new weights
 * into the shards refit hands it and starts a refit after every "training
 * step"; the engine keeps serving from its runtime weights between
 * refit_progress calls and commits at a safe point between two steps.
 *
 *   launch/refit-launch configs/demo.yaml -- build/runtime/refit-example configs/demo.yaml
 *
 * Error handling is reduced to the pattern a real program needs: every call
 * returns a status, refit_last_error() says why.
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

/* The "model": one checksum over the runtime weights stands in for a
 * forward pass that reads them. */
static unsigned long long serve_one_step(refit_session_h s) {
  unsigned long long sum = 0;
  for (int64_t i = 0; i < refit_tensor_count(s); i++) {
    refit_tensor_t t;
    CHECK(refit_tensor_get(s, i, &t));
    const unsigned char *p = t.data;
    for (size_t k = 0; k < t.bytes; k += 512)
      sum += p[k];
  }
  return sum;
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
   * and register it, before the first refit. */
  void **mine = calloc((size_t)refit_tensor_count(s), sizeof(void *));
  for (int64_t i = 0; i < refit_tensor_count(s); i++) {
    refit_tensor_t t;
    CHECK(refit_tensor_get(s, i, &t));
    t.data = mine[i] = calloc(1, t.bytes);
    CHECK(refit_tensor_register(s, &t));
  }

  for (uint64_t version = 1; version <= 3; version++) {
    int done = 0, served = 0;
    /* Trainer: a training step would update the shards here (the demo's
     * synthetic source fills them inside refit_begin). */
    CHECK(refit_begin(s, version, NULL));
    while (!done) {
      if (!trainer) {
        serve_one_step(s); /* still version - 1: nothing changed yet */
        served++;
      }
      CHECK(refit_progress(s, &done));
    }
    CHECK(refit_commit(s, NULL)); /* the engine's safe point */
    int64_t bad = 0;
    CHECK(refit_verify(s, version, &bad));
    printf("rank %d (%s): version %llu committed, %d serving steps during the "
           "refit, %s\n",
           rank, trainer ? "trainer" : "engine", (unsigned long long)version,
           served, bad == 0 ? "verified" : "MISMATCH");
  }
  const int64_t n = refit_tensor_count(s);
  refit_session_close(s);
  for (int64_t i = 0; i < n; i++)
    free(mine[i]);
  free(mine);
  MPI_Finalize();
  return 0;
}
