/*
 * CUDA twin of the delta codec (kernels/delta.h states the format): the same
 * deltas, byte for byte, for a batch of chunks in one call, and their
 * application in place. Every pointer is a device pointer, the descriptor
 * tables included. Work is enqueued on `stream`; the calls return without
 * waiting, allocate nothing and make no host synchronization, so they may be
 * captured in a CUDA graph. The caller passes a workspace of
 * refit_delta_cuda_workspace(n, total) bytes and may reuse it for every call
 * that is ordered after the previous one on the stream.
 *
 * Errors a device finds (a chunk too large, a forced encoding that does not
 * fit, a delta that refit_delta_decode would refuse) are not returned: the
 * call writes the smallest index of a bad chunk to *bad_chunk_device (-1 when
 * all are good) and why to *reason_device (a refit_delta_cuda_reason_t),
 * and then writes no chunk at all (no delta, no length, no destination byte).
 * After one synchronization refit_delta_cuda_report turns the pair into a
 * status with a message. Within a chunk the reason is the one the C decoder
 * gives (the first failing check, in its order).
 *
 * Cost (for T = 32 KiB tiles of the chunks, numbered across the table, on a
 * grid that fills the GPU): encode reads the new and base bytes once (a
 * count pass that records a bit per changed 32-byte block in the workspace,
 * and the changed bytes of a tile with at most 512 scattered ones), then, in a
 * write pass, copies those lists or reads the changed blocks again (mask;
 * dense: the new chunk) and writes the delta; positions and block order are
 * stream compaction by block-wide prefix sums. The workspace takes about
 * 1/12 of the chunks' bytes. Apply checks the whole delta and the
 * destination bytes it names first (a read of each changed 32-byte sector of
 * the destination), then writes them: the delta is read twice. Both passes
 * walk work items counted from the delta headers (1024 positions, 8 mask
 * tiles, a dense tile), so that their cost follows the delta's size rather
 * than the chunks'. Four kernels
 * per call either way, so a call on a very sparse batch costs about four
 * launches. Any alignment is correct; the fast case is chunks, deltas and
 * destinations at 16-byte multiples.
 */
#ifndef REFIT_KERNELS_DELTA_CUDA_H
#define REFIT_KERNELS_DELTA_CUDA_H

#include "kernels/delta.h"

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The most chunks in one call (the error report packs the index in 23 bits). */
#define REFIT_DELTA_CUDA_MAX_CHUNKS (INT64_C(1) << 23)

/* One chunk to encode: its delta goes to out + out_off, at most cap bytes
 * (refit_delta_bound(bytes) is enough for AUTO and DENSE; forced positions
 * may need 16 + 5 * bytes, forced mask 16 + bytes / 256 + 1 + bytes). */
typedef struct {
  const void *new_bytes;
  const void *base;
  uint64_t bytes; /* at most UINT32_MAX */
  uint64_t out_off;
  uint64_t cap;
} refit_delta_cuda_enc_desc_t;

/* One delta to apply: delta_len bytes at delta, to the dst_bytes at dst that
 * hold the baseline it was made against. */
typedef struct {
  const void *delta;
  uint64_t delta_len;
  void *dst;
  uint64_t dst_bytes;
} refit_delta_cuda_dec_desc_t;

/* X(name, text): why a chunk was refused: the descriptor's checks, the
 * header's (in refit_delta_info's order), then the payload's. */
#define REFIT_DELTA_CUDA_REASON_MAP(X)                                                   \
  X(NONE, "no error")                                                                    \
  X(CHUNK_TOO_LARGE, "the chunk is larger than UINT32_MAX bytes")                        \
  X(NULL_POINTER, "a NULL pointer for a chunk of nonzero bytes")                         \
  X(WORKSPACE, "the workspace is too small for the chunks' total bytes")                 \
  X(CAPACITY, "the chosen encoding does not fit the chunk's output capacity")            \
  X(SHORT, "the delta is shorter than its 16-byte header")                               \
  X(MAGIC, "the magic is not \"RFD1\": not a delta")                                     \
  X(ENCODING, "the encoding is none of positions, mask, dense")                          \
  X(HEADER_PAD, "header bytes 5..7 are not zero")                                        \
  X(COUNT, "the count does not fit the chunk (or a dense delta's count is not 0)")       \
  X(SHORT_MASK, "the delta is shorter than its header and block mask")                   \
  X(MASK_TAIL, "mask bits past the chunk's last block are set")                          \
  X(MASK_COUNT, "the mask marks another number of blocks than the count")                \
  X(LENGTH, "the delta's length is not what its header says (truncated or padded)")      \
  X(CHUNK_SIZE, "the delta was made for a chunk of another size")                        \
  X(POS_RANGE, "a position lies past the chunk")                                         \
  X(POS_ORDER, "positions do not increase")                                              \
  X(POS_SAME, "a position names a byte the destination holds already: "                  \
              "the delta was not made against this baseline")                            \
  X(BLOCK_SAME, "a marked block is one the destination holds already: "                  \
                "the delta was not made against this baseline")

typedef enum {
#define REFIT_DELTA_CUDA_REASON_ENUM_(name, text) REFIT_DELTA_CUDA_##name,
  REFIT_DELTA_CUDA_REASON_MAP(REFIT_DELTA_CUDA_REASON_ENUM_)
#undef REFIT_DELTA_CUDA_REASON_ENUM_
      REFIT_DELTA_CUDA_REASONS
} refit_delta_cuda_reason_t;

/* Short text of a reason; "?" for an unknown code. Never NULL. */
const char *refit_delta_cuda_reason_str(int32_t reason);

/* Workspace bytes for a call over n chunks of `total_bytes` in all (encode:
 * the sum of bytes; apply: the sum of dst_bytes). */
size_t refit_delta_cuda_workspace(int64_t n, uint64_t total_bytes);

/*
 * Encode n chunks (descs_device) as `encoding` (REFIT_DELTA_AUTO: each the
 * smallest, with refit_delta_encode's ties) into out: chunk i's delta at
 * out + out_off, its length to len_device[i]. The inputs must not overlap
 * the output or the workspace.
 * Errors returned: REFIT_ERR_INVALID_ARGUMENT (NULL table, output or error
 * outputs with n > 0, n beyond REFIT_DELTA_CUDA_MAX_CHUNKS, an unknown
 * encoding, a workspace not 16-byte aligned or below
 * refit_delta_cuda_workspace(n, 0); one too small for the chunks' bytes is
 * the chunk error WORKSPACE),
 * REFIT_ERR_CUDA (a launch). Chunks' errors: see the file's comment.
 */
refit_status_t refit_delta_encode_cuda(const refit_delta_cuda_enc_desc_t *descs_device,
                                       int64_t n, refit_delta_encoding_t encoding,
                                       void *out, uint64_t *len_device, void *workspace,
                                       size_t workspace_bytes, int64_t *bad_chunk_device,
                                       int32_t *reason_device, cudaStream_t stream);

/*
 * Apply n deltas (descs_device) in place: first every delta and the
 * destination bytes it names are checked as refit_delta_decode checks them,
 * then, only if all are good, every destination gets its new bytes.
 * Errors returned: as encode. Chunks' errors: see the file's comment.
 */
refit_status_t refit_delta_apply_cuda(const refit_delta_cuda_dec_desc_t *descs_device,
                                      int64_t n, void *workspace, size_t workspace_bytes,
                                      int64_t *bad_chunk_device, int32_t *reason_device,
                                      cudaStream_t stream);

/* REFIT_OK when bad_chunk < 0, else REFIT_ERR_INTEGRITY (apply) or
 * REFIT_ERR_INVALID_ARGUMENT (encode's own reasons) naming `what`, the chunk
 * and the reason. Host values, read back by the caller. */
refit_status_t refit_delta_cuda_report(const char *what, int64_t bad_chunk,
                                       int32_t reason);

#ifdef __cplusplus
}
#endif

#endif /* REFIT_KERNELS_DELTA_CUDA_H */
