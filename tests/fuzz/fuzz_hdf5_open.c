/*
 * libFuzzer: the input is an HDF5 checkpoint of a tiny Qwen3 model. The
 * checkpoint source opens it (signature, every tensor's presence, shape,
 * element type, dtype attribute, storage) and, when it accepts the file,
 * reads every row of every tensor: a bad file is refused with a message at
 * open, never a crash, a leak or a failure mid-read. The file lives in
 * /dev/shm when it exists, so a run costs no disk.
 */
#include "config/config.h"
#include "core/error.h"
#include "reshard/catalog.h"
#include "source/source.h"

#include <hdf5.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern const refit_source_ops_t refit_source_hdf5;

/* dump.c holds the HDF5 helpers the source uses, next to the dump writer,
 * which needs the session's memory layer; the writer is not fuzzed, so its
 * callees are stand-ins that must never run. */
#include "generator/loader.h"
#include "device/memory.h"
#include "transport/transport.h"
int refit_mem_on_device(const refit_mem_t *m) {
  (void)m;
  abort();
}
refit_status_t refit_mem_to_host(refit_mem_t *m, void *host, const void *src,
                                 size_t bytes) {
  (void)m, (void)host, (void)src, (void)bytes;
  abort();
}
const char *refit_dtype_name(refit_dtype_t dtype) {
  (void)dtype;
  abort();
}
refit_status_t refit_mpi_request_wait(MPI_Request *req, double deadline, const char *what) {
  (void)req, (void)deadline, (void)what;
  abort();
}

static const char tiny[] = "model: {family: qwen3, hidden_size: 32, num_layers: 1,\n"
                           "  num_attention_heads: 2, num_kv_heads: 1, head_dim: 16,\n"
                           "  vocab_size: 64, intermediate_size: 64}\n"
                           "trainer: {tp: 1}\n"
                           "generator: {tp: 1}\n"
                           "source: {kind: hdf5, path: ckpt.h5}\n";

static refit_config_t cfg;
static refit_catalog_t *cat;

static void fuzz_setup(void) {
  char *errors = NULL;
  if (refit_config_parse(tiny, sizeof(tiny) - 1, "tiny.yaml", 0, &cfg, &errors) !=
          REFIT_OK ||
      refit_catalog_create(&cfg.model, &cfg.trainer, &cfg.generator, &cat) != REFIT_OK) {
    fprintf(stderr, "fuzz_hdf5_open: setup: %s\n", errors ? errors : refit_last_error());
    abort();
  }
  snprintf(cfg.source.path, sizeof(cfg.source.path), "%s/refit-fuzz-%d.h5",
           access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp", (int)getpid());
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (cat == NULL)
    fuzz_setup();
  FILE *f = fopen(cfg.source.path, "wb");
  if (f == NULL || fwrite(data, 1, size, f) != size || fclose(f) != 0)
    abort();
  void *ctx = NULL;
  if (refit_source_hdf5.open(&cfg, cat, &ctx) != REFIT_OK) {
    if (refit_last_error()[0] == '\0')
      abort();                                /* a refusal always says why */
    if (getenv("REFIT_FUZZ_VERBOSE") != NULL) /* when reproducing one input */
      fprintf(stderr, "refused: %s\n", refit_last_error());
  } else {
    /* Accepted: every row of every tensor reads, or its read fails with a
     * message (a file damaged inside its data, which the open's schema
     * checks cannot see, fails the refit that reads it, cleanly). */
    for (int64_t i = 0; i < cat->nhf; i++) {
      const refit_src_tensor_t *t = &cat->hf[i];
      uint16_t *buf = malloc((size_t)(t->rows * t->cols) * sizeof(uint16_t));
      if (buf == NULL)
        abort();
      if (refit_source_hdf5.read(ctx, t, 1, 0, 0, t->rows, t->cols, buf) != REFIT_OK &&
          refit_last_error()[0] == '\0')
        abort();
      free(buf);
    }
    refit_source_hdf5.close(ctx);
  }
  /* Accepted or refused, the source leaves no HDF5 object open. */
  if (H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) != 0)
    abort();
  unlink(cfg.source.path);
  return 0;
}
