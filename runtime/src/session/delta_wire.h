/*
 * Delta refits on the wire (refit.delta; issue "Delta refit"): trainers
 * send, per message, only what changed since the last committed version,
 * each chunk in the cheapest encoding of kernels/delta.h; generators apply
 * each chunk's delta in place, in runtime storage (the async shadow in async
 * mode), writing only the changed bytes (loader_delta.c, kernels/place.h).
 * The runtime bytes are those of a full refit of the same version, bit for
 * bit.
 *
 * Baselines. A trainer keeps the bytes of the last committed version's
 * messages (a message packed once for several engines kept once; in host
 * memory, on a GPU as below), one copy, rewritten in place by every refit: a
 * full refit packs into it and sends from it; a delta refit packs into the
 * send buffer, encodes against it and then applies the deltas it made to it.
 * One copy is enough because only a committed refit leaves baselines behind:
 * one that fails or aborts leaves every generator without one (below), so
 * the next refit is full whatever the trainer's bytes are. A generator keeps
 * no copy of the wire: its baseline is its runtime storage itself, plus, per
 * chunk it lands, the unsealed digest of the committed version's chunk rows
 * (8 bytes; a full refit reads it back from each chunk's trailer once the
 * digest checked: trailer - seal), and the committed refit's seal tag. A
 * refit keeps its digests as candidates, which replace the committed ones at
 * commit. Begin marks a generator's baseline invalid, commit valid for the
 * committed version. So any refit that fails or aborts (its writes rolled
 * back, or storage POISONED) leaves every generator without a baseline, and
 * the next refit is full.
 *
 * Where every chunk lands bytewise. Each byte of a chunk's rows has one
 * place in a runtime tensor (kernels/place.h: the row permutation of the
 * layout, the 128x4 scale swizzle, the TP/EP slice; block FP8's weight and
 * weight_scale_inv), so a changed wire byte is a changed runtime byte. That
 * holds for BF16 rows, for MXFP8 quantized on the trainer, and refit.delta
 * makes an mxfp8 refit quantize on the trainer (refit_config_plan_options),
 * and for block FP8 quantized on the trainer (refit.prequantize, which
 * refit.delta under fp8_block requires). A generator that quantizes BF16
 * rows could not apply in place (one changed value can change its block's
 * scale and all its values): under fp8_block a tensor whose trainer shards
 * split a block falls back to that, and then delta: on is refused at plan
 * time (refit_config_plan_check) and delta: auto runs full refits
 * (refit_dw_create, every rank from the plan; the generator's own check
 * stays as a guard).
 *
 * The decision. At begin every rank says whether it can take part in a delta
 * refit (refit_dw_ready: a valid baseline of the committed version, not
 * POISONED, no trainer tensor registered at a new address; under delta: auto
 * a rank also says no while delta refits do not pay, see
 * REFIT_DW_AUTO_BREAK_EVEN); the refit is a delta refit only when every rank
 * says yes (the header exchange), so the first refit, and the one after any
 * failed, aborted, restored or POISONED one, is full.
 *
 * A message of a delta refit is either its full bytes (exactly the plan's
 * length, when the delta would be no smaller) or a frame shorter than that,
 * little-endian:
 *   u32 magic "RFDM", u32 chunk count, u64 frame bytes (header included),
 *   then per chunk of the message in plan order: u32 length, the chunk's
 *   delta (kernels/delta.h) against the baseline of its bytes.
 * A chunk's bytes are its span of the message: its rows and its trailer (the
 * 8-byte sealed digest), so the new trailer comes through the delta too. The
 * receive is posted at the message's full length with a variable length
 * (refit_xfer_t.got), so the received length tells the two forms apart (MPI,
 * UCX and IPC carry such receives). NCCL's messages have a fixed length: over
 * nccl each bucket's message lengths go ahead of it over MPI
 * (transport_lengths.c, the transport then named nccl+lengths) and the
 * messages follow at their exact lengths. Zero copy moves no weight bytes:
 * delta: on refuses zero_copy: on at the first begin, and under auto the
 * refits that run with zero copy are full.
 *
 * On a GPU (device memory, transport ipc). A trainer keeps its baseline in
 * GPU memory, or in pinned host memory under refit.delta_baseline: host, and
 * encodes a bucket's chunks in one call of the codec's CUDA twin
 * (kernels/delta_cuda.h) into a scratch, reads the lengths back, puts each
 * shorter message's frame together in one gather pass and then applies the
 * deltas to the baseline (the codec's CUDA apply), whose check it waits for.
 * A generator applies in place as on the host, a bucket at a time: it reads
 * each frame back to a host copy (the deltas only), walks the frames and the
 * deltas' headers there, and hands all the bucket's chunks, frames' and
 * whole messages' alike, to one batch of the place apply's CUDA twin
 * (kernels/place_cuda.h, refit_loader_delta_gpu): one check over the bucket
 * (the bytes each delta names, read at their places, and the digest change
 * of the words they touch), the digests compared on the host, then one write
 * of the changed bytes, logged in a GPU undo log for rollback. It keeps no
 * copy of the wire bytes.
 *
 * Integrity of a delta refit. Per chunk, before any byte of it is written:
 * the frame's and the delta's shape; every byte the delta names as changed
 * differs from what the generator holds (kernels/delta.h's baseline rule,
 * the old byte read from its runtime place, the old trailer rebuilt from the
 * committed digest and seal); and the digest: the new rows' digest is the
 * committed one plus term(new word, i) - term(old word, i) over the 8-byte
 * words the delta touches (core/digest.h: the digest is a sum of per-word
 * terms), sealed with this refit's tag, against the new trailer. A whole
 * message in a delta refit is compared with runtime storage byte by byte and
 * checked the same way. Any failure is REFIT_ERR_INTEGRITY naming version,
 * bucket, trainer and generator rank, chunk and tensor; that chunk is not
 * written, and the refit is discarded like any other failed one. What a
 * delta refit cannot see: it reads only the words it changes, so runtime
 * bytes damaged since the last commit fail a chunk's digest only where they
 * share an 8-byte word with a change; elsewhere they go undetected until a
 * full refit, which rewrites and checks every byte, or refit_verify
 * (refit.delta_full_every: N bounds how long: every N-th refit is full).
 *
 * Costs: a trainer quantizes and packs every chunk as a full refit does,
 * then compares it with its baseline (one pass reading both) and writes the
 * changed bytes into the baseline; a generator reads and writes, per chunk,
 * only the delta, the bytes it changes and the rest of their 8-byte words (a
 * chunk that went whole: every byte, compared run by run), and does no
 * layout transform (the places already are the layout's). In sync mode with
 * restore: full a generator logs each byte it writes (address, old value)
 * instead of saving whole stores, and rollback undoes the log; past a
 * sixteenth of the stores' bytes of log, a chunk's stores are saved whole as
 * in a full refit. Memory: a trainer's baseline as large as the bytes it
 * packs, and one frame buffer per exchange in flight; a generator 16 bytes
 * per chunk it lands (committed and candidate digests) and the undo log (9
 * bytes per changed byte, at most 9/16 of the stores), in host memory on a
 * host session; on a GPU the undo log is in GPU memory (grown as a refit
 * needs it) and the host holds a copy of one bucket's frames. The sizes are
 * logged (INFO) at the first begin and printed by refit-plan.
 */
#ifndef REFIT_DELTA_WIRE_H
#define REFIT_DELTA_WIRE_H

#include "generator/loader.h"
#include "refit/status.h"
#include "transport/transport.h"

#include <stddef.h>
#include <stdint.h>

struct refit_session;

#define REFIT_DW_MAGIC UINT32_C(0x4d444652) /* "RFDM" in memory order */
#define REFIT_DW_HEADER_BYTES 16

/* delta: auto runs a delta refit only while every rank's last delta refit
 * moved at most this fraction of a full refit's bytes (measured on CPU2 with
 * nothing else running, docs/benchmarks.md: a delta refit breaks even with a
 * full one at about 3.5 % of the bytes over shared memory and about 5 % over
 * TCP on one host, and 1/24 lies between the two; a network slower than
 * memory moves the break-even up); above it the rank asks for full refits,
 * and tries a delta one again after REFIT_DW_AUTO_PROBE full ones (the
 * changes may have become sparser). */
#define REFIT_DW_AUTO_BREAK_EVEN (1.0 / 24)
#define REFIT_DW_AUTO_PROBE 4

typedef struct refit_dw {
  int mode;   /* refit_delta_mode_t */
  int usable; /* this session can carry delta refits (transport, memory) */
  int valid;  /* the baseline holds version `version`'s bytes */
  uint64_t version;
  int this_refit; /* the ranks agreed that the refit in progress is a delta one */
  /* A trainer's baseline: base_bytes, bucket b at base_off[b], in its send
   * buffer's layout. A generator has none (NULL): its baseline is runtime
   * storage and the loader's digests. */
  unsigned char *base;
  size_t base_bytes;
  int64_t *base_off;
  /* Where: device sessions keep it in GPU memory, or (a trainer under
   * refit.delta_baseline: host) pinned host memory. */
  struct refit_mem *mem;
  int device, pinned;
  /* Trainer: a frame buffer per exchange in flight (this rank's memory). */
  unsigned char *enc[REFIT_EXCHANGES_IN_FLIGHT];
  size_t enc_bytes;
  /* Device sessions: a trainer's codec table (most chunks of a bucket),
   * lengths, frame pieces and headers (host), and its scratch in device
   * memory (the deltas at fixed offsets, then the frame headers); a
   * generator's host copies of a bucket's frames (most bytes of a bucket),
   * its batch and the (message, chunk) of each entry. */
  refit_mem_delta_t *chunks;
  uint64_t *lens;
  refit_mem_piece_t *pieces;
  unsigned char *hdr, *scratch, *hframe;
  size_t scratch_bytes, hdr_off, hdr_bytes, hframe_bytes;
  int64_t max_chunks, (*chunk_at)[2];
  refit_loader_gpu_chunk_t *batch; /* a generator's batch (most chunks + 1) */
  /* Generator: each receive's length, per exchange in flight and message. */
  size_t *got[REFIT_EXCHANGES_IN_FLIGHT];
  int64_t max_msgs; /* most messages of this rank in one bucket */
  int64_t *span;    /* one message's chunk spans (most chunks + 1) */
  /* This refit so far: bytes this rank sent (trainer) or received
   * (generator), what a full refit moves, messages sent as frames. */
  uint64_t wire_bytes, full_bytes;
  int64_t framed_msgs;
  /* delta: auto: the last committed delta refit's bytes over a full one's
   * on this rank, and full refits committed since. */
  double last_fraction;
  int full_streak;
  /* Delta refits committed since the last full one (refit.delta_full_every). */
  int delta_streak;
  int full_every;
} refit_dw_t;

/* At the first begin, once memory is bound: the baseline and buffers when
 * refit.delta is on or auto and this rank's transport and memory can carry
 * delta refits (sizes logged); *out NULL when refit.delta is off. delta: on
 * where they cannot is REFIT_ERR_CONFIG naming what to use instead. */
refit_status_t refit_dw_create(struct refit_session *s, refit_dw_t **out);
void refit_dw_destroy(refit_dw_t *dw);

/* Can this rank take part in a delta refit now? (See the decision above;
 * begin adds that no trainer tensor was registered at a new address.) */
int refit_dw_ready(const struct refit_session *s, const refit_dw_t *dw);

/* Begin: the ranks' answer (every rank ready); the baseline becomes invalid
 * until commit. */
void refit_dw_begin(refit_dw_t *dw, int delta_refit);

/* Commit succeeded: the baseline holds `version`. */
void refit_dw_commit(refit_dw_t *dw, uint64_t version);

/* Trainer: where bucket b is packed: its area of the baseline in a full
 * refit, `buf` in a delta refit or without a baseline. */
unsigned char *refit_dw_pack_target(refit_dw_t *dw, int32_t b, unsigned char *buf);

/* Trainer, bucket b packed in `buf` (refit_dw_pack_target; exchange slot
 * `slot`), its sends in xfers[0..nx) as refit_trainer_pack listed them: in a
 * delta refit, point each send at a frame against the baseline where that is
 * smaller (messages packed once share their frame); count the bytes. */
refit_status_t refit_dw_trainer_encode(struct refit_session *s, int32_t b, int slot,
                                       unsigned char *buf, refit_xfer_t *xfers, int nx);

/* Generator: a bucket's receives (xfers as refit_generator_recvs listed
 * them, into staging slot `slot`): in a delta refit each may be shorter (its
 * length goes to the slot's table); in a full one each is exactly its
 * length. */
void refit_dw_generator_recvs(struct refit_session *s, int slot, refit_xfer_t *xfers,
                              int nx);

/* Generator, bucket b received in `staging` (slot `slot`): in a delta refit
 * apply every frame, and every message that came whole, chunk by chunk in
 * place (refit_loader_delta_chunk) and set *land_from to NULL (nothing left
 * to land); in a full refit count the bytes and set *land_from to `staging`
 * (land it as usual). A frame that is malformed, of another chunk count or
 * made against another baseline, or a chunk whose digest does not match, is
 * REFIT_ERR_INTEGRITY naming version, bucket, trainer rank and chunk, and
 * that chunk is not written. `fault` is the land fault seam (loader.h),
 * played on a delta refit's bucket as refit_loader_land_bucket plays it on a
 * full one's. */
refit_status_t refit_dw_generator_apply(struct refit_session *s, int32_t b, int slot,
                                        unsigned char *staging, refit_land_fault_t fault,
                                        unsigned char **land_from);

/* Encode message bytes `now` against `base` (chunk spans at `span`, n + 1
 * offsets from the message's start, the last its length) as a frame into
 * `out` (room for refit_dw_frame_bound); *len its length. */
refit_status_t refit_dw_frame_encode(const unsigned char *now, const unsigned char *base,
                                     const int64_t *span, int64_t n, unsigned char *out,
                                     size_t *len);
size_t refit_dw_frame_bound(int64_t bytes, int64_t nchunks);

/* Walk a frame of `len` bytes (spans as above): check its header and
 * lengths and call fn(ctx, i, delta, delta_len) for each chunk i in order;
 * fn's error ends the walk. `what` names the message in errors. */
typedef refit_status_t (*refit_dw_chunk_fn)(void *ctx, int64_t i, const unsigned char *delta,
                                            size_t len);
refit_status_t refit_dw_frame_walk(const unsigned char *frame, size_t len,
                                   const int64_t *span, int64_t n, const char *what,
                                   refit_dw_chunk_fn fn, void *ctx);

/* Apply a frame (as refit_dw_frame_walk takes it) to `dst`, a flat copy of
 * the message's baseline bytes, chunk by chunk with the codec's decoder:
 * afterwards dst holds the new message (a trainer's baseline advanced by
 * the frame it made; generators apply through places instead). Errors
 * name `what` and the chunk; a chunk that fails is not written, earlier
 * ones are. */
refit_status_t refit_dw_frame_apply(const unsigned char *frame, size_t len,
                                    unsigned char *dst, const int64_t *span, int64_t n,
                                    const char *what);

#endif /* REFIT_DELTA_WIRE_H */
