/* Which runtime tensors are MXFP8: see precision.h. */
#include "session/precision.h"

#include "session/session.h"

#include "core/error.h"

#include <stdio.h>
#include <string.h>

int refit_precision_form(const refit_config_t *cfg, const refit_catalog_t *cat,
                         const refit_store_t *stores, int64_t nstores,
                         const refit_store_t *found, const refit_tensor_t *t,
                         int64_t *gen) {
  const int mxfp8 = cfg->refit.precision == REFIT_PRECISION_MXFP8;
  if (found != NULL) {
    const refit_gen_tensor_t *g = &cat->gen[found->gen];
    if (found->is_scale)
      return 0;
    *gen = found->gen;
    if (found->dtype == REFIT_DTYPE_E4M3 && t->dtype == REFIT_TENSOR_BF16)
      return REFIT_FORM_BF16;
    if (found->dtype == REFIT_DTYPE_BF16 && t->dtype == REFIT_TENSOR_E4M3 && mxfp8 &&
        g->kind != REFIT_GEN_PLAIN)
      return REFIT_FORM_MXFP8;
    return 0;
  }
  /* "<weight>_scale" beside a weight refit planned in BF16. */
  static const char suffix[] = "_scale";
  const size_t len = strlen(t->name), slen = sizeof(suffix) - 1;
  char base[REFIT_NAME_MAX + 16];
  if (!mxfp8 || t->dtype != REFIT_TENSOR_E8M0 || len <= slen || len - slen >= sizeof(base) ||
      strcmp(t->name + len - slen, suffix) != 0)
    return 0;
  memcpy(base, t->name, len - slen);
  base[len - slen] = '\0';
  for (int64_t i = 0; i < nstores; i++)
    if (refit_store_name_matches(stores[i].name, base)) {
      if (stores[i].dtype != REFIT_DTYPE_BF16 ||
          cat->gen[stores[i].gen].kind == REFIT_GEN_PLAIN)
        return 0;
      *gen = stores[i].gen;
      return REFIT_FORM_MXFP8;
    }
  return 0;
}

/* Append `name` to a list of at most four names ("a, b, c, d, ..."). */
static void refit_precision_list(char *buf, size_t len, int64_t *count, const char *name) {
  const size_t used = strlen(buf);
  if (*count < 4 && used < len)
    snprintf(buf + used, len - used, "%s%s", used ? ", " : "", name);
  else if (*count == 4 && used < len)
    snprintf(buf + used, len - used, ", ...");
  (*count)++;
}

refit_status_t refit_precision_decide(const refit_config_t *cfg, refit_catalog_t *cat,
                                      const unsigned char *votes, int64_t *to_bf16,
                                      int64_t *to_mxfp8) {
  const int64_t n = cat->gen_begin[cat->generator.tp];
  char both[512] = "", why[1024] = "";
  int64_t nboth = 0, nbad = 0;
  *to_bf16 = *to_mxfp8 = 0;
  for (int64_t i = 0; i < n; i++) {
    const refit_gen_tensor_t *g = &cat->gen[i];
    const int v = votes[i];
    const int bf16 = (v & REFIT_FORM_BF16) || ((v & REFIT_FORM_PLANNED) && !g->quantized);
    const int mx = (v & REFIT_FORM_MXFP8) || ((v & REFIT_FORM_PLANNED) && g->quantized);
    if (bf16 && mx) {
      refit_precision_list(both, sizeof(both), &nboth, g->name);
      continue;
    }
    if (mx && !g->quantized) {
      if (refit_config_check_quantizable(cfg, cat, g) != REFIT_OK) {
        if (nbad++ == 0)
          snprintf(why, sizeof(why), "%s", refit_last_error());
        continue;
      }
      (*to_mxfp8)++;
    } else if (bf16 && g->quantized) {
      (*to_bf16)++;
    }
  }
  if (nboth > 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "register: %lld runtime tensor%s registered both in BF16 and in "
                     "MXFP8 (by two engines, or a BF16 weight beside an E8M0 "
                     "scale): %s; every engine must hold the same parameters",
                     (long long)nboth, nboth == 1 ? "" : "s", both);
  if (nbad > 0)
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "register: the engine registers %lld tensor%s as MXFP8 that "
                     "refit cannot quantize: %s; register %s in bfloat16",
                     (long long)nbad, nbad == 1 ? "" : "s", why,
                     nbad == 1 ? "it" : "them");
  for (int64_t i = 0; i < n; i++) {
    refit_gen_tensor_t *g = &cat->gen[i];
    const int v = votes[i];
    if ((v & REFIT_FORM_MXFP8) && !g->quantized)
      g->quantized = refit_config_quant_format(cfg);
    else if ((v & REFIT_FORM_BF16) && g->quantized)
      g->quantized = 0;
  }
  return REFIT_OK;
}
