/*
 * A plan's statistics and its predicted transfer time (plan.h): bytes per
 * rank, and bucket by bucket the busiest rank's time over its NIC and
 * NVLink; with the ranks' own passes over memory (pack, land, the restore
 * save), the pipeline the lifecycle runs, bucket by bucket.
 */
#include "reshard/plan.h"

#include "reshard/blocks.h"

#include "core/error.h"

#include <stdlib.h>
#include <string.h>

void refit_plan_stats(const refit_plan_t *plan, double link_gbps,
                      refit_plan_stats_t *stats) {
  const refit_plan_network_t net = {
      .link_gbps = link_gbps, .nvlink_gbps = 0, .gpus_per_node = 0};
  refit_plan_predict(plan, &net, stats);
}

/* Seconds a rank's bytes take: NIC and NVLink at once, the slower counts. */
static double refit_plan_rank_s(const refit_plan_network_t *net, int64_t nic,
                                int64_t nvl) {
  double s = (double)nic / (net->link_gbps * 1e9);
  if (nvl > 0) {
    double v = net->nvlink_gbps > 0 ? (double)nvl / (net->nvlink_gbps * 1e9) : 0;
    if (v > s)
      s = v;
  }
  return s;
}

/* Add bucket b's messages to the ranks' lanes (trainers, then generators):
 * a pair on one node of gpus_per_node ranks on NVLink, any other on both
 * ranks' NICs. */
static void refit_plan_bucket_lanes(const refit_plan_t *plan, int32_t gpn, int32_t b,
                                    int64_t *nic, int64_t *nvl) {
  const int32_t T = plan->ntrainer;
  for (int64_t i = plan->bucket_msg_begin[b]; i < plan->bucket_msg_begin[b + 1]; i++) {
    const refit_msg_t *m = &plan->msgs[i];
    const int32_t src = m->src_rank, dst = T + m->dst_rank;
    int64_t *lane = gpn > 0 && src / gpn == dst / gpn ? nvl : nic;
    lane[src] += m->bytes;
    lane[dst] += m->bytes;
  }
}

void refit_plan_predict(const refit_plan_t *plan, const refit_plan_network_t *net,
                        refit_plan_stats_t *stats) {
  const int32_t T = plan->ntrainer, G = plan->ngenerator;
  /* Per rank (trainers, then generators): NIC and NVLink bytes of the
   * bucket being summed, and of the whole refit. */
  int64_t *nic = calloc((size_t)(T + G), sizeof(int64_t));
  int64_t *nvl = calloc((size_t)(T + G), sizeof(int64_t));
  int64_t *nic_all = calloc((size_t)(T + G), sizeof(int64_t));
  int64_t *nvl_all = calloc((size_t)(T + G), sizeof(int64_t));

  memset(stats, 0, sizeof(*stats));
  for (int32_t r = 0; r < T; r++) {
    stats->total_bytes += plan->egress[r];
    if (plan->egress[r] > stats->egress_max)
      stats->egress_max = plan->egress[r];
  }
  for (int32_t g = 0; g < G; g++) {
    if (plan->ingress[g] > stats->ingress_max)
      stats->ingress_max = plan->ingress[g];
    if (plan->staging[g] > stats->staging_max)
      stats->staging_max = plan->staging[g];
    if (plan->arena[g] > stats->arena_max)
      stats->arena_max = plan->arena[g];
  }
  stats->egress_mean = (double)stats->total_bytes / T;
  stats->ingress_mean = (double)stats->total_bytes / G;
  if (nic == NULL || nvl == NULL || nic_all == NULL || nvl_all == NULL ||
      net->link_gbps <= 0)
    goto out;
  const int32_t gpn = net->gpus_per_node;
  for (int32_t b = 0; b < plan->nbuckets; b++) {
    int64_t out_sum = 0, out_max = 0, in_max = 0;
    refit_plan_bucket_lanes(plan, gpn, b, nic, nvl);
    double busiest = 0;
    for (int32_t r = 0; r < T + G; r++) {
      const double s = refit_plan_rank_s(net, nic[r], nvl[r]);
      if (s > busiest)
        busiest = s;
      const int64_t bytes = nic[r] + nvl[r];
      if (r < T) {
        out_sum += bytes;
        if (bytes > out_max)
          out_max = bytes;
      } else if (bytes > in_max) {
        in_max = bytes;
      }
      nic_all[r] += nic[r];
      nvl_all[r] += nvl[r];
      nic[r] = nvl[r] = 0;
    }
    stats->predicted_s += busiest;
    if (out_sum > 0) {
      /* Every byte of the bucket leaves one trainer and reaches one
       * generator: the means share the sum. */
      const double eo = (double)out_max * T / (double)out_sum;
      const double ei = (double)in_max * G / (double)out_sum;
      if (eo > stats->bucket_egress_imbalance)
        stats->bucket_egress_imbalance = eo;
      if (ei > stats->bucket_ingress_imbalance)
        stats->bucket_ingress_imbalance = ei;
    }
  }
  for (int32_t r = 0; r < T + G; r++) {
    const double s = refit_plan_rank_s(net, nic_all[r], nvl_all[r]);
    if (s > stats->floor_s)
      stats->floor_s = s;
  }
out:
  free(nic);
  free(nvl);
  free(nic_all);
  free(nvl_all);
}

/* Bytes `elements` of generator tensor g take in runtime storage, as the
 * prediction counts them: BF16 2 per element; MXFP8 1 and a scale per 32;
 * block FP8 1 and an FP32 scale per 128 x 128 block (MLA's kv_b_proj 2 more
 * for its dequantized copy); NVFP4 half a byte and a scale per 16. The
 * loader's stores also hold layout padding (rounded rows, swizzled scales),
 * left out here: a prediction's count, not an allocation's. */
static int64_t refit_plan_runtime_bytes(const refit_gen_tensor_t *g, int64_t elements) {
  const int64_t block = (int64_t)REFIT_BLOCK_EDGE * REFIT_BLOCK_EDGE;
  switch (g->quantized) {
  case REFIT_QUANT_MXFP8:
    return elements + elements / 32;
  case REFIT_QUANT_FP8_BLOCK:
    return elements + (elements + block - 1) / block * 4 +
           (g->mla_derived ? 2 * elements : 0);
  case REFIT_QUANT_NVFP4:
    return elements / 2 + elements / 16;
  default:
    return 2 * elements;
  }
}

/* What trainer passes charge in bucket b: per trainer, half the bytes its
 * pack reads (the shards' BF16 elements) plus half those it writes (the
 * wire rows), a memory copy of N bytes counting N. A message equal to an
 * earlier one of the bucket (another engine's copy, refit_plan_msgs_same)
 * is packed once, as the trainer does: prev[] chains each message to the
 * bucket's previous one from the same trainer, head[] per trainer. */
static void refit_plan_bucket_pack(const refit_plan_t *plan, const refit_catalog_t *cat,
                                   int32_t b, int64_t *head, int64_t *prev,
                                   int64_t *pack) {
  const int64_t first = plan->bucket_msg_begin[b];
  for (int32_t t = 0; t < plan->ntrainer; t++)
    head[t] = -1;
  for (int64_t i = first; i < plan->bucket_msg_begin[b + 1]; i++) {
    const refit_msg_t *m = &plan->msgs[i];
    int same = 0;
    for (int64_t j = head[m->src_rank]; j >= 0 && !same; j = prev[j - first])
      same = refit_plan_msgs_same(plan, cat, &plan->msgs[j], m);
    prev[i - first] = head[m->src_rank];
    head[m->src_rank] = i;
    for (int64_t c = 0; !same && c < m->chunk_count; c++) {
      const refit_chunk_t *ch = &plan->chunks[m->chunk_begin + c];
      pack[m->src_rank] += (ch->rows * ch->cols * 2 + ch->rows * ch->row_bytes) / 2;
    }
  }
}

/* What generator passes charge in bucket b: per generator, half the bytes
 * its land reads (the staged rows) plus half those it writes (runtime
 * bytes: the same for a copy or a split, fewer where it quantizes), and
 * with `save` the whole runtime storage of every tensor the rank meets for
 * the first time in the refit (seen[engine * ntensors + tensor]), which
 * restore: full copies aside before the first byte lands. */
static void refit_plan_bucket_land(const refit_plan_t *plan, const refit_catalog_t *cat,
                                   int32_t b, int save, unsigned char *seen,
                                   int64_t *land, int64_t *saved) {
  const int32_t tp = cat->generator.tp;
  const int64_t ntensors = cat->gen_begin[tp];
  for (int64_t i = plan->bucket_msg_begin[b]; i < plan->bucket_msg_begin[b + 1]; i++) {
    const refit_msg_t *m = &plan->msgs[i];
    for (int64_t c = 0; c < m->chunk_count; c++) {
      const refit_chunk_t *ch = &plan->chunks[m->chunk_begin + c];
      const refit_gen_tensor_t *g = &cat->gen[ch->dst_tensor];
      const int64_t read = ch->rows * ch->row_bytes;
      const int64_t written = g->quantized && !refit_plan_chunk_quantized(plan, cat, ch)
                                  ? refit_plan_runtime_bytes(g, ch->rows * ch->cols)
                                  : read;
      land[m->dst_rank] += (read + written) / 2;
      unsigned char *met = &seen[(int64_t)(m->dst_rank / tp) * ntensors + ch->dst_tensor];
      if (save && !*met)
        saved[m->dst_rank] += refit_plan_runtime_bytes(g, g->rows * g->cols);
      *met = 1;
    }
  }
}

/* The largest entry of v[0 .. n). */
static int64_t refit_plan_max(const int64_t *v, int32_t n) {
  int64_t most = 0;
  for (int32_t i = 0; i < n; i++)
    most = v[i] > most ? v[i] : most;
  return most;
}

static double refit_plan_later(double a, double b) { return a > b ? a : b; }

refit_status_t refit_plan_predict_passes(const refit_plan_t *plan,
                                         const refit_catalog_t *cat,
                                         const refit_plan_network_t *net,
                                         const refit_plan_passes_t *passes,
                                         refit_plan_bucket_prediction_t *buckets,
                                         refit_plan_pipeline_t *out) {
  const int32_t T = plan->ntrainer, G = plan->ngenerator, nb = plan->nbuckets;
  const int32_t tp = cat->generator.tp;
  if (!(net->link_gbps > 0) || !(passes->copy_gbps > 0))
    return REFIT_ERR(REFIT_ERR_INVALID_ARGUMENT,
                     "plan prediction: link_gbps %g and copy_gbps %g must be positive",
                     net->link_gbps, passes->copy_gbps);
  int64_t most_msgs = 1;
  for (int32_t b = 0; b < nb; b++) {
    const int64_t n = plan->bucket_msg_begin[b + 1] - plan->bucket_msg_begin[b];
    most_msgs = n > most_msgs ? n : most_msgs;
  }
  const int64_t ntensors = cat->gen_begin[tp];
  int64_t *nic = calloc((size_t)(T + G), sizeof(int64_t));
  int64_t *nvl = calloc((size_t)(T + G), sizeof(int64_t));
  int64_t *pack = calloc((size_t)T, sizeof(int64_t));
  int64_t *land = calloc((size_t)G, sizeof(int64_t));
  int64_t *saved = calloc((size_t)G, sizeof(int64_t));
  int64_t *head = malloc((size_t)T * sizeof(int64_t));
  int64_t *prev = malloc((size_t)most_msgs * sizeof(int64_t));
  unsigned char *seen = calloc((size_t)((G + tp - 1) / tp * ntensors + 1), 1);
  refit_status_t st = REFIT_OK;
  if (nic == NULL || nvl == NULL || pack == NULL || land == NULL || saved == NULL ||
      head == NULL || prev == NULL || seen == NULL) {
    st = REFIT_ERR(REFIT_ERR_NO_MEMORY, "plan prediction: tables of %d ranks",
                   (int)(T + G));
    goto out;
  }
  const double copy = passes->copy_gbps * 1e9;
  refit_plan_pipeline_t pl = {0};
  for (int32_t b = 0; b < nb; b++) {
    refit_plan_bucket_prediction_t *o = &buckets[b];
    memset(o, 0, sizeof(*o));
    refit_plan_bucket_lanes(plan, net->gpus_per_node, b, nic, nvl);
    for (int32_t r = 0; r < T + G; r++) {
      const double x = refit_plan_rank_s(net, nic[r], nvl[r]);
      o->transfer_s = x > o->transfer_s ? x : o->transfer_s;
      nic[r] = nvl[r] = 0;
    }
    refit_plan_bucket_pack(plan, cat, b, head, prev, pack);
    refit_plan_bucket_land(plan, cat, b, passes->save, seen, land, saved);
    o->pack_bytes = refit_plan_max(pack, T);
    for (int32_t g = 0; g < G; g++)
      if (land[g] + saved[g] > o->land_bytes + o->save_bytes) {
        o->land_bytes = land[g];
        o->save_bytes = saved[g];
      }
    o->pack_s = (double)o->pack_bytes / copy;
    o->land_s = (double)(o->land_bytes + o->save_bytes) / copy;
    memset(pack, 0, (size_t)T * sizeof(int64_t));
    memset(land, 0, (size_t)G * sizeof(int64_t));
    memset(saved, 0, (size_t)G * sizeof(int64_t));
  }
  /* The lifecycle's pipeline (lifecycle.c), two exchanges in flight: a
   * trainer packs bucket b once it packed b - 1 and the send of b - 2
   * completed (its buffer's slot), sends it and goes on to pack b + 1; a
   * generator posts the receive of b after landing b - 2 and lands b once
   * it arrived and b - 1 landed; the links carry one bucket after another.
   * Where bytes move only inside the ranks' transport calls, b moves after
   * its generator landed b - 1 (it receives nothing while it lands), and
   * where the sender's calls are needed too, after its trainer packed
   * b + 1 (it sends nothing while it packs). */
  for (int32_t b = 0; b < nb; b++) {
    refit_plan_bucket_prediction_t *o = &buckets[b];
    const double packed_prev = b > 0 ? buckets[b - 1].pack_end_s : 0;
    const double sent_1 = b > 0 ? buckets[b - 1].transfer_end_s : 0;
    const double sent_2 = b > 1 ? buckets[b - 2].transfer_end_s : 0;
    o->pack_end_s = refit_plan_later(packed_prev, sent_2) + o->pack_s;
    double start = refit_plan_later(o->pack_end_s, sent_1);
    if (passes->progress == REFIT_PLAN_PROGRESS_ASYNC)
      start = refit_plan_later(start, b > 1 ? buckets[b - 2].land_end_s : 0);
    else
      start = refit_plan_later(start, b > 0 ? buckets[b - 1].land_end_s : 0);
    if (passes->progress == REFIT_PLAN_PROGRESS_BOTH && b + 1 < nb)
      start = refit_plan_later(start, refit_plan_later(o->pack_end_s, sent_1) +
                                          buckets[b + 1].pack_s);
    o->transfer_end_s = start + o->transfer_s;
    o->land_end_s =
        refit_plan_later(o->transfer_end_s, b > 0 ? buckets[b - 1].land_end_s : 0) +
        o->land_s;
    pl.pack_s += o->pack_s;
    pl.transfer_s += o->transfer_s;
    pl.land_s += o->land_s;
    pl.save_bytes += o->save_bytes;
  }
  /* refit.mode async: the commit copies every runtime byte of the rank
   * from its shadow. */
  if (passes->commit_copy)
    for (int32_t g = 0; g < G; g++) {
      int64_t bytes = 0;
      const int32_t t = g % tp;
      for (int64_t i = cat->gen_begin[t]; i < cat->gen_begin[t + 1]; i++)
        bytes +=
            refit_plan_runtime_bytes(&cat->gen[i], cat->gen[i].rows * cat->gen[i].cols);
      const double c = (double)bytes / copy;
      pl.commit_s = c > pl.commit_s ? c : pl.commit_s;
    }
  pl.total_s = (nb > 0 ? buckets[nb - 1].land_end_s : 0) + pl.commit_s;
  *out = pl;
out:
  free(nic);
  free(nvl);
  free(pack);
  free(land);
  free(saved);
  free(head);
  free(prev);
  free(seen);
  return st;
}
