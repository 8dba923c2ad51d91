/*
 * The bucket timeline of a refit (timeline.h): its buffers, and the JSON
 * file each rank writes after a committed refit.
 */
#include "session/timeline.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

refit_timeline_t *refit_timeline_create(int32_t nbuckets) {
  refit_timeline_t *tl = calloc(1, sizeof(*tl));
  if (tl == NULL)
    return NULL;
  const size_t n = nbuckets > 0 ? (size_t)nbuckets : 1;
  tl->stamp = malloc(n * REFIT_TL_FIELDS * sizeof(*tl->stamp));
  tl->cpu = malloc(n * REFIT_TL_FIELDS * sizeof(*tl->cpu));
  tl->bytes = malloc(n * sizeof(*tl->bytes));
  if (tl->stamp == NULL || tl->cpu == NULL || tl->bytes == NULL) {
    refit_timeline_destroy(tl);
    return NULL;
  }
  tl->nbuckets = nbuckets;
  return tl;
}

void refit_timeline_destroy(refit_timeline_t *tl) {
  if (tl == NULL)
    return;
  free(tl->stamp);
  free(tl->cpu);
  free(tl->bytes);
  free(tl);
}

void refit_timeline_start(refit_timeline_t *tl, double t0) {
  tl->t0 = t0;
  for (int64_t i = 0; i < (int64_t)tl->nbuckets * REFIT_TL_FIELDS; i++)
    tl->stamp[i] = NAN;
  memset(tl->bytes, 0, (size_t)tl->nbuckets * sizeof(*tl->bytes));
  for (int i = 0; i < REFIT_TL_PHASES; i++)
    tl->phase[i] = NAN;
  for (int i = 0; i < REFIT_EXCHANGES_IN_FLIGHT; i++)
    tl->slot_bucket[i] = -1;
}

/* A time, or null where it was not marked. */
static void refit_timeline_put(FILE *f, double t) {
  if (isnan(t))
    fputs("null", f);
  else
    fprintf(f, "%.9f", t);
}

/* CPU seconds between two marks, or null where either is unset. */
static void refit_timeline_cpu(FILE *f, const refit_timeline_t *tl, int64_t at, int s,
                               int e) {
  if (isnan(tl->stamp[at + s]) || isnan(tl->stamp[at + e]))
    fputs("null", f);
  else
    fprintf(f, "%.6f", tl->cpu[at + e] - tl->cpu[at + s]);
}

/* An interval [s, e], or null where neither end was marked. */
static void refit_timeline_span(FILE *f, double s, double e) {
  if (isnan(s) && isnan(e)) {
    fputs("null", f);
    return;
  }
  fputc('[', f);
  refit_timeline_put(f, s);
  fputs(", ", f);
  refit_timeline_put(f, e);
  fputc(']', f);
}

refit_status_t refit_timeline_write(const refit_timeline_t *tl, const char *prefix,
                                    const refit_timeline_owner_t *who) {
  char path[1200];
  snprintf(path, sizeof(path), "%s.refit%u.rank%d.json", prefix, (unsigned)who->attempt,
           who->rank);
  FILE *f = fopen(path, "w");
  if (f == NULL)
    return REFIT_ERR(REFIT_ERR_SYSTEM, "refit.timeline: cannot write %s: %s", path,
                     strerror(errno));
  const double *ph = tl->phase;
  fprintf(f,
          "{\"format\": \"refit-timeline-1\", \"rank\": %d, \"side\": \"%s\", "
          "\"role_rank\": %d, \"version\": %llu, \"attempt\": %u, "
          "\"transport\": \"%s\", \"buckets\": %d, \"clock\": \"CLOCK_MONOTONIC\", "
          "\"t0\": %.9f,\n \"phases\": {\"begin\": ",
          who->rank, who->trainer ? "trainer" : "generator", who->role_rank,
          (unsigned long long)who->version, (unsigned)who->attempt, who->transport,
          (int)tl->nbuckets, tl->t0);
  refit_timeline_span(f, 0.0, ph[REFIT_TL_BEGIN_END]);
  fputs(", \"source\": ", f);
  refit_timeline_span(f, ph[REFIT_TL_SOURCE_START], ph[REFIT_TL_SOURCE_END]);
  fputs(", \"progress_end\": ", f);
  refit_timeline_put(f, ph[REFIT_TL_PROGRESS_END]);
  fputs(", \"commit\": ", f);
  refit_timeline_span(f, ph[REFIT_TL_COMMIT_START], ph[REFIT_TL_COMMIT_END]);
  fputs("},\n \"bucket\": [", f);
  /* A bucket's three passes, each a span and the CPU seconds in it. */
  static const struct {
    const char *name;
    refit_tl_field_t start, end;
  } spans[] = {{"pack", REFIT_TL_PACK_START, REFIT_TL_PACK_END},
               {"wait", REFIT_TL_WAIT_START, REFIT_TL_WAIT_END},
               {"land", REFIT_TL_LAND_START, REFIT_TL_LAND_END}};
  for (int32_t b = 0; b < tl->nbuckets; b++) {
    const int64_t at = (int64_t)b * REFIT_TL_FIELDS;
    fprintf(f, "%s\n  {\"b\": %d, \"bytes\": %lld, \"post\": ", b ? "," : "", (int)b,
            (long long)tl->bytes[b]);
    refit_timeline_put(f, tl->stamp[at + REFIT_TL_POST]);
    for (size_t k = 0; k < sizeof(spans) / sizeof(spans[0]); k++) {
      fprintf(f, ", \"%s\": ", spans[k].name);
      refit_timeline_span(f, tl->stamp[at + spans[k].start],
                          tl->stamp[at + spans[k].end]);
    }
    fputs(", \"cpu\": {", f);
    for (size_t k = 0; k < sizeof(spans) / sizeof(spans[0]); k++) {
      fprintf(f, "%s\"%s\": ", k ? ", " : "", spans[k].name);
      refit_timeline_cpu(f, tl, at, spans[k].start, spans[k].end);
    }
    fputs("}}", f);
  }
  fputs("\n]}\n", f);
  const int failed = ferror(f);
  if (fclose(f) != 0 || failed)
    return REFIT_ERR(REFIT_ERR_SYSTEM, "refit.timeline: cannot write %s: %s", path,
                     strerror(errno));
  return REFIT_OK;
}
