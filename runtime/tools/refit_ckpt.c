/*
 * refit-ckpt CONFIG OUT [--dtype bf16|f32|f16] [--version V]
 *            [--format hdf5|safetensors] [--shards N]
 *
 * Write a checkpoint of the config's model with the synthetic source's values
 * of version V (default 1, seed from source.seed), so that demos and tests of
 * source.kind hdf5 and safetensors need no external files: an HDF5 file
 * (schema in runtime/src/session/dump.h), or with --format safetensors a Hugging Face
 * checkpoint, one .safetensors file or with --shards N > 1 a directory of N
 * files and model.safetensors.index.json. A client of the public API
 * (refit_checkpoint_write in refit/refit.h says what is written).
 */
#include "refit/refit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int refit_ckpt_usage(void) {
  fprintf(stderr, "usage: refit-ckpt CONFIG.yaml OUT [--dtype bf16|f32|f16] "
                  "[--version V] [--format hdf5|safetensors] [--shards N]\n");
  return 2;
}

int main(int argc, char **argv) {
  const char *config = NULL, *out = NULL;
  refit_checkpoint_options_t opt = {.format = REFIT_CHECKPOINT_HDF5,
                                    .dtype = REFIT_CHECKPOINT_BF16,
                                    .version = 1,
                                    .shards = 1};
  refit_config_h cfg = NULL;
  refit_checkpoint_info_t info;

  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) {
      const char *d = argv[++i];
      if (strcmp(d, "bf16") == 0)
        opt.dtype = REFIT_CHECKPOINT_BF16;
      else if (strcmp(d, "f32") == 0)
        opt.dtype = REFIT_CHECKPOINT_F32;
      else if (strcmp(d, "f16") == 0)
        opt.dtype = REFIT_CHECKPOINT_F16;
      else {
        fprintf(stderr, "refit-ckpt: --dtype must be bf16, f32 or f16, got '%s'\n", d);
        return 2;
      }
    } else if (strcmp(argv[i], "--version") == 0 && i + 1 < argc) {
      char *end = NULL;
      opt.version = strtoull(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0') {
        fprintf(stderr, "refit-ckpt: --version expects a number, got '%s'\n", argv[i]);
        return 2;
      }
    } else if (strcmp(argv[i], "--format") == 0 && i + 1 < argc) {
      const char *f = argv[++i];
      if (strcmp(f, "hdf5") != 0 && strcmp(f, "safetensors") != 0) {
        fprintf(stderr, "refit-ckpt: --format must be hdf5 or safetensors, got '%s'\n", f);
        return 2;
      }
      opt.format = strcmp(f, "safetensors") == 0 ? REFIT_CHECKPOINT_SAFETENSORS
                                                 : REFIT_CHECKPOINT_HDF5;
    } else if (strcmp(argv[i], "--shards") == 0 && i + 1 < argc) {
      char *end = NULL;
      const long n = strtol(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0' || n < 1 || n > 99999) {
        fprintf(stderr, "refit-ckpt: --shards expects 1 to 99999, got '%s'\n", argv[i]);
        return 2;
      }
      opt.shards = (int)n;
    } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      refit_ckpt_usage();
      return 0;
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "refit-ckpt: unknown option '%s'\n", argv[i]);
      return refit_ckpt_usage();
    } else if (config == NULL) {
      config = argv[i];
    } else if (out == NULL) {
      out = argv[i];
    } else {
      return refit_ckpt_usage();
    }
  }
  if (config == NULL || out == NULL)
    return refit_ckpt_usage();

  /* The config's problems are printed as it is read. */
  if (refit_config_open(config, &cfg) != REFIT_OK)
    return 2;
  if (opt.shards > 1 && opt.format != REFIT_CHECKPOINT_SAFETENSORS) {
    fprintf(stderr, "refit-ckpt: --shards needs --format safetensors\n");
    refit_config_close(cfg);
    return 2;
  }
  const refit_status_t st = refit_checkpoint_write(cfg, out, &opt, &info);
  refit_config_close(cfg);
  if (st != REFIT_OK) {
    fprintf(stderr, "refit-ckpt: %s: %s\n", refit_status_str(st), refit_last_error());
    return 1;
  }
  if (opt.format == REFIT_CHECKPOINT_SAFETENSORS)
    printf("refit-ckpt: wrote %s: %lld tensors in %d safetensors file%s, "
           "%.1f MiB of %s, version %llu, seed %llu\n",
           out, (long long)info.tensors, opt.shards, opt.shards == 1 ? "" : "s",
           (double)info.bytes / 1048576.0, info.dtype_name,
           (unsigned long long)opt.version, (unsigned long long)info.seed);
  else
    printf("refit-ckpt: wrote %s: %lld tensors, %.1f MiB of %s, version %llu, "
           "seed %llu\n",
           out, (long long)info.tensors, (double)info.bytes / 1048576.0, info.dtype_name,
           (unsigned long long)opt.version, (unsigned long long)info.seed);
  return 0;
}
