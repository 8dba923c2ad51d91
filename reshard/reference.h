/*
 * The from-definition reference: where each element of a generator runtime
 * tensor comes from, computed from the tensor's vLLM name and the published
 * sharding rules alone. It shares no code or tables with the catalog, so that
 * verification and the planner tests check the catalog and the plan against
 * an independent statement of the rules (../shared/reference/sharding.md).
 */
#ifndef REFIT_RESHARD_REFERENCE_H
#define REFIT_RESHARD_REFERENCE_H

#include "reshard/catalog.h"

#include <stdint.h>

/*
 * Row `row` of runtime tensor `name` (2-D matrix view) on generator tp rank
 * `tp_rank` is, element for element, row *src_row of trainer tensor
 * `src_name` starting at column *col_offset (runtime column c holds source
 * column c + *col_offset) of the Hugging Face tensor `src_name`. A row of
 * vocabulary padding (vLLM pads embed_tokens and lm_head to a multiple of
 * 64 rows; the padding holds zeros) has *src_row = -1. Returns
 * REFIT_ERR_INVALID_ARGUMENT for a name the rules do not know.
 */
refit_status_t refit_reference_source_row(const refit_model_t *model,
                                          const refit_generator_layout_t *gen,
                                          int tp_rank, const char *name,
                                          int64_t row,
                                          char src_name[REFIT_NAME_MAX],
                                          int64_t *src_row, int64_t *col_offset);

#endif /* REFIT_RESHARD_REFERENCE_H */
