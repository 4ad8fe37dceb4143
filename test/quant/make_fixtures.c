/* Writes test/quant/<type>.bin from ggml's own reference quantizers and
 * dequantizers (the oracle; not part of grad's build). See README.md here
 * for the command and the file layout. */
#include <stdio.h>
#include <stdlib.h>

#include "ggml-quants.h"
#include "inputs.h"

typedef void (*quantize_fn)(const float*, void*, int64_t);
typedef void (*dequantize_fn)(const void*, float*, int64_t);

struct format {
  const char* name;
  uint32_t ggml_type, elements, bytes, nq, nr;
  quantize_fn quantize;
  dequantize_fn dequantize;
};

static void put_u32(FILE* f, uint32_t v) {
  for (int k = 0; k < 4; ++k) fputc((int)((v >> (8 * k)) & 0xFF), f);
}
static void put_u64(FILE* f, uint64_t v) {
  for (int k = 0; k < 8; ++k) fputc((int)((v >> (8 * k)) & 0xFF), f);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  const struct format formats[] = {
      {"q8_0", 8, 32, 34, 30 * quant_kinds, 256, (quantize_fn)quantize_row_q8_0_ref, (dequantize_fn)dequantize_row_q8_0},
      {"q4_0", 2, 32, 18, 30 * quant_kinds, 256, (quantize_fn)quantize_row_q4_0_ref, (dequantize_fn)dequantize_row_q4_0},
      {"q4_K", 12, 256, 144, 16 * quant_kinds, 128, (quantize_fn)quantize_row_q4_K_ref,
       (dequantize_fn)dequantize_row_q4_K},
      {"q5_K", 13, 256, 176, 16 * quant_kinds, 128, (quantize_fn)quantize_row_q5_K_ref,
       (dequantize_fn)dequantize_row_q5_K},
      {"q6_K", 14, 256, 210, 16 * quant_kinds, 128, (quantize_fn)quantize_row_q6_K_ref,
       (dequantize_fn)dequantize_row_q6_K},
  };
  float x[256], y[256];
  uint8_t block[256];
  for (size_t fi = 0; fi < sizeof formats / sizeof formats[0]; ++fi) {
    const struct format* q = &formats[fi];
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.bin", argv[1], q->name);
    FILE* f = fopen(path, "wb");
    if (!f) {
      perror(path);
      return 1;
    }
    fwrite("GRADQNT1", 1, 8, f);
    put_u32(f, q->ggml_type);
    put_u32(f, q->nq);
    put_u32(f, q->nr);
    uint8_t* blocks = malloc((size_t)q->nq * q->bytes);
    for (uint32_t b = 0; b < q->nq; ++b) {
      quant_block_inputs(q->elements, b, x);
      q->quantize(x, blocks + (size_t)b * q->bytes, q->elements);
    }
    fwrite(blocks, q->bytes, q->nq, f);
    for (uint32_t b = 0; b < q->nq; ++b) {
      q->dequantize(blocks + (size_t)b * q->bytes, y, q->elements);
      put_u64(f, quant_hash_floats(y, q->elements));
    }
    for (uint32_t b = 0; b < q->nr; ++b) {
      quant_random_block(q->bytes, b, block);
      q->dequantize(block, y, q->elements);
      put_u64(f, quant_hash_floats(y, q->elements));
    }
    free(blocks);
    fclose(f);
    printf("%s: %u quantized blocks, %u random blocks\n", path, q->nq, q->nr);
  }
  return 0;
}
