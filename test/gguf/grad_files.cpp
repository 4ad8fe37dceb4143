// Not built with grad (README.md): grad's GGUF files of a seeded random
// model, F32 and quantized, for llama.cpp's quantize to be compared with.
//
//   grad_files DIR D_MODEL LAYERS FFN HEAD_WIDTH TIED
#include <cstdio>
#include <cstdlib>
#include <grad/hf/gguf.hpp>
#include <grad/lm.hpp>

int main(int argc, char** argv) {
  using namespace grad;
  if (argc != 7) return 2;
  nn::LmConfig c;  // test_gguf's "llama.cpp's quantize" case builds the same
  c.vocab = 257;
  c.d_model = std::strtoul(argv[2], nullptr, 10);
  c.layers = std::strtoul(argv[3], nullptr, 10);
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = std::strtoul(argv[4], nullptr, 10);
  c.max_seq = 64;
  c.head_width = std::strtoul(argv[5], nullptr, 10);
  c.tied_embeddings = std::atoi(argv[6]) != 0;
  Tape<float> tp;
  nn::Lm<float> m(tp, c, 77);
  const hf::BpeVocab vocab = hf::byte_level_vocab({"<|endoftext|>"});
  for (const auto t : {hf::GgufType::f32, hf::GgufType::q8_0, hf::GgufType::q4_0, hf::GgufType::q4_k_m}) {
    const auto r = hf::write_gguf(std::string(argv[1]) + "/grad_" + std::string(hf::gguf_type_name(t)) + ".gguf", m,
                                  vocab, {.type = t});
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", r.error.c_str());
      return 1;
    }
  }
  return 0;
}
