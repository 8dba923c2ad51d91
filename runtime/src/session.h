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

typedef enum {
  REFIT_DTYPE_BF16 = 0, /* uint16 bit patterns */
  REFIT_DTYPE_E4M3 = 1, /* float8_e4m3fn bytes */
  REFIT_DTYPE_E8M0 = 2  /* block scale exponent bytes */
} refit_dtype_t;

/*
 * One piece of generator runtime storage, named as vLLM names it
 * ("model.layers.0.self_attn.qkv_proj.weight", "...weight_scale"). Allocated
 * once at start-up; every refit writes into the same bytes.
 */
typedef struct {
  char name[REFIT_NAME_MAX + 8];
  refit_dtype_t dtype;
  const char *layout; /* "linear", "swizzle_128x4", "trtllm_moe_w13",
                         "trtllm_moe_w2", "trtllm_dense" */
  int ndim;
  int64_t shape[3];
  void *data;
  size_t bytes;
  int64_t gen;  /* index into catalog->gen */
  int is_scale; /* the _scale beside a quantized weight */
} refit_store_t;

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

  /* Generator: runtime storage of tp rank `tp_rank`. Catalog tensor
   * cat->gen_begin[tp_rank] + i owns stores[store_of[i]] (its weight) and,
   * when quantized, stores[store_of[i] + 1] (its scale). */
  int tp_rank, engine;
  refit_store_t *stores;
  int64_t nstores;
  int64_t *store_of;
  int64_t nruntime; /* catalog tensors of this tp rank */
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
