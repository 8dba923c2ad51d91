/*
 * Inside the catalog (catalog.h): the builder that catalog.c,
 * catalog_hf.c, catalog_megatron.c and catalog_runtime.c fill, and the
 * appends they share.
 */
#ifndef REFIT_RESHARD_CATALOG_INTERNAL_H
#define REFIT_RESHARD_CATALOG_INTERNAL_H

#include "core/error.h"
#include "reshard/catalog.h"

#include <stdint.h>

typedef struct {
  refit_catalog_t *cat;
  int64_t src_cap, gen_cap, seg_cap, run_cap;
  int64_t ngen;
} refit_catalog_builder_t;

/* Trainer tensor indices of one layer, filled by refit_build_src_layer. */
typedef struct {
  int32_t in_norm, post_norm, q, k, v, o, q_norm, k_norm;
  int32_t q_bias, k_bias, v_bias; /* families with qkv_bias */
  /* MLA (families with mla): q is q_proj when q_lora_rank is 0. */
  int32_t q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b;
  int32_t gate, up, down, router; /* gate, up, down: a dense MLP layer */
  int32_t expert_bias;            /* the router's FP32 bias, or -1 */
  int32_t expert0; /* first of 3 * X expert tensors: gate, up, down per e */
  int32_t shared_gate, shared_up, shared_down; /* -1 without shared experts */
  int moe;                                     /* refit_layer_is_moe */
} refit_layer_src_t;

/* printf into a name of REFIT_NAME_MAX bytes. */
void refit_name_fmt(char *dst, const char *fmt, ...) REFIT_PRINTF(2, 3);

/* Append a trainer tensor, its index into *index (catalog.c). */
refit_status_t refit_add_src(refit_catalog_builder_t *b, int32_t *index, int stage,
                             int32_t layer, refit_role_t role, refit_split_t split,
                             int64_t rows, int64_t cols, const char *fmt, ...)
    REFIT_PRINTF(9, 10);

/* Make trainer tensor t the expert `expert` of its layer (MoE folding). */
void refit_src_set_expert(const refit_catalog_t *cat, refit_src_tensor_t *t,
                          int64_t expert);

/* Append a runtime tensor of the tp rank being built, *out pointing at it. */
/* A 1-D runtime tensor of n elements is [1, n] (a norm); refit_add_gen_bias
 * appends a bias [n] as the column [n, 1] (catalog.h). */
refit_status_t refit_add_gen_bias(refit_catalog_builder_t *b, refit_gen_tensor_t **out,
                                  int32_t layer, int64_t n, const char *name);
refit_status_t refit_add_gen(refit_catalog_builder_t *b, refit_gen_tensor_t **out,
                             int32_t layer, refit_role_t role, refit_gen_kind_t kind,
                             int ndim, int64_t d0, int64_t d1, int64_t d2,
                             const char *name);

/* Rows [src_row, +rows) of trainer tensor `src` are rows [hf_row, +rows) of
 * Hugging Face tensor `hf`. */
refit_status_t refit_add_run(refit_catalog_builder_t *b, int32_t src, int32_t hf,
                             int64_t src_row, int64_t hf_row, int64_t rows);

/* Place a rectangle of Hugging Face tensor `hf` in runtime tensor g. */
refit_status_t refit_add_seg(refit_catalog_builder_t *b, refit_gen_tensor_t *g,
                             int32_t hf, int64_t hf_row, int64_t col, int64_t rows,
                             int64_t cols, int64_t dst_row, int64_t dst_col);

/* The Hugging Face tensors of layer l on pipeline stage `stage`, their
 * indices into *ls (catalog_hf.c). */
refit_status_t refit_build_src_layer(refit_catalog_builder_t *b, int l, int stage,
                                     refit_layer_src_t *ls);

/* The runtime tensors of layer l on generator tp rank t (catalog_runtime.c). */
refit_status_t refit_build_gen_layer(refit_catalog_builder_t *b, int l, int t,
                                     const refit_layer_src_t *ls);

/* The trainer tensors under Megatron-Core's names, over the Hugging Face
 * tensors already built (catalog_megatron.c). */
refit_status_t refit_build_megatron(refit_catalog_builder_t *b,
                                    const refit_layer_src_t *ls, int32_t embed,
                                    int32_t norm, int32_t lm_head);

#endif /* REFIT_RESHARD_CATALOG_INTERNAL_H */
