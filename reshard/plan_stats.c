/*
 * A plan's statistics and its predicted transfer time (plan.h): bytes per
 * rank, and bucket by bucket the busiest rank's time over its NIC and
 * NVLink.
 */
#include "reshard/plan.h"

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
    for (int64_t i = plan->bucket_msg_begin[b]; i < plan->bucket_msg_begin[b + 1]; i++) {
      const refit_msg_t *m = &plan->msgs[i];
      const int32_t src = m->src_rank, dst = T + m->dst_rank;
      int64_t *lane = gpn > 0 && src / gpn == dst / gpn ? nvl : nic;
      lane[src] += m->bytes;
      lane[dst] += m->bytes;
    }
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
