/*
 * A refit session: one rank's share of a refit job. It owns the parsed
 * config, the trainer/generator split of the world, the catalog and plan
 * (identical on every rank, proven by hash), the transport, and the memory:
 * trainer shards on trainer ranks, runtime tensors and staging on generator
 * ranks. Runtime tensors are allocated once; every refit writes them in place.
 */
#ifndef REFIT_SESSION_H
#define REFIT_SESSION_H

#include "config.h"
#include "reshard/catalog.h"
#include "reshard/plan.h"
#include "source.h"
#include "transport.h"

#include <mpi.h>
#include <stdint.h>

/* Seconds per phase of one refit, as seen by one rank. */
typedef struct {
  double source;   /* trainer: produce the new weights */
  double pack;     /* trainer: gather chunks into send buffers */
  double transfer; /* waiting on the transport */
  double unpack;   /* generator: scatter staging into runtime tensors */
  double total;    /* the whole refit, barrier to barrier */
} refit_phase_times_t;

typedef struct refit_session {
  refit_config_t cfg;
  char *config_text;
  size_t config_len;

  MPI_Comm world;
  int rank, size;
  int ntrainer, ngenerator;
  int is_trainer;
  int role_rank; /* rank within the trainer or generator group */

  refit_catalog_t *cat;
  refit_plan_t *plan;
  refit_transport_t transport;
  refit_source_t source;

  /* This rank's messages, by bucket: my_msgs[my_begin[b] .. my_begin[b+1]). */
  int64_t *my_msgs;
  int64_t *my_begin;

  /* Trainer: shard of each catalog src tensor this rank holds, else NULL. */
  uint16_t **shards;
  int32_t *shard_part;
  unsigned char *sendbuf[REFIT_EXCHANGES_IN_FLIGHT];

  /* Generator: runtime tensors of tp rank `tp_rank`, indexed from
   * cat->gen_begin[tp_rank]. */
  int tp_rank, engine;
  uint16_t **runtime;
  int64_t nruntime;
  unsigned char *staging[REFIT_EXCHANGES_IN_FLIGHT];

  uint64_t version; /* last version refitted */
} refit_session_t;

/*
 * Collective over `world`: rank 0 reads and validates the config (printing
 * every problem), the config is broadcast, the plan built everywhere and its
 * hash compared. Fails on every rank when any rank fails.
 */
refit_status_t refit_session_create(MPI_Comm world, const char *config_path,
                                    refit_session_t **out);
void refit_session_destroy(refit_session_t *s);

/* Collective: move version `version` from trainers to generators. */
refit_status_t refit_session_refit(refit_session_t *s, uint64_t version,
                                   refit_phase_times_t *times);

/* Generator ranks: compare every runtime byte with the from-definition
 * reference of `version`; *mismatches counts wrong elements (the first is
 * logged with tensor, rank, index, expected and actual). Trainers: 0. */
refit_status_t refit_session_verify(refit_session_t *s, uint64_t version,
                                    int64_t *mismatches);

#endif /* REFIT_SESSION_H */
