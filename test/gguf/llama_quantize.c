// Not built with grad (README.md): llama.cpp's own quantize
// (llama_model_quantize, from node-llama-cpp's prebuilt libllama) of a GGUF.
//
//   llama_quantize BINARY_DIR IN.gguf OUT.gguf FTYPE     (FTYPE: llama_ftype, 7 Q8_0, 2 Q4_0, 15 Q4_K_M)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// llama_model_quantize_params, opaque: the library fills it (its first two
// fields, nthread and ftype, have kept their places); room for any version's.
typedef struct {
  unsigned char bytes[1024];
} params_t;
params_t llama_model_quantize_default_params(void);
unsigned llama_model_quantize(const char* in, const char* out, const params_t* params);
void llama_backend_init(void);
void ggml_backend_load_all_from_path(const char* dir);

int main(int argc, char** argv) {
  if (argc != 5) return 2;
  ggml_backend_load_all_from_path(argv[1]);  // the CPU backends sit beside libllama
  llama_backend_init();
  params_t p = llama_model_quantize_default_params();
  const int nthread = 1, ftype = atoi(argv[4]);
  memcpy(p.bytes, &nthread, sizeof nthread);
  memcpy(p.bytes + 4, &ftype, sizeof ftype);
  const unsigned rc = llama_model_quantize(argv[2], argv[3], &p);
  printf("llama_model_quantize: %u\n", rc);
  return rc == 0 ? 0 : 1;
}
