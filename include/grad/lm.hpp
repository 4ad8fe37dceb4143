// A decoder-only language model (Qwen2-style blocks, byte-level tokens) in
// grad::nn: configuration, named parameters, a forward that records the
// whole model on a tape for a [batch, seq] window, LoRA adapters, merge,
// model files, and a tape-free KV-cache decoder.
//
//   nn::LmConfig c;                          // vocab 256, d_model 64, 2 layers, ...
//   Tape<float> tp;
//   nn::Lm<float> model(tp, c, /*seed*/ 1);  // parameters recorded as tp.param
//   const auto episode = tp.mark();
//   auto out = model.forward(model.ids(inputs, batch, seq), model.ids(targets, batch * seq, 0));
//   tp.backward(out.loss); ...; tp.reset_to(episode);
//
// The block (pre-norm, as Qwen2; q/k/v biases under LmConfig::qkv_bias):
//   h = rmsnorm(x, attn_norm); x = x + o(attention(q(h), k(h), v(h)))
//   h = rmsnorm(x, mlp_norm);  x = x + down(silu(gate(h)) * up(h))
// and logits = rmsnorm(x, final_norm) . head (embed^T under
// LmConfig::tied_embeddings). Attention
// runs batched (nn::attention): heads become the leading axis
// (reshape/transpose), RoPE in the NEOX half split, then the fused
// causal_attention_probs and attention_context ops: no mask and no repeated
// keys/values for GQA, with the bits of the repeat-and-mask recording.
//
// Weights are [in, out] (x . w). Every projection p in LmConfig::lora_targets
// gets an adapter when lora_rank > 0: p(h) = h.w0 + lora_scale * (h.A).B
// (nn::lora_linear), A [in, r] seeded, B [r, out] zero. Lm::Train::lora
// records the base weights as constants: no gradient buffers, no backward
// work below them; only the adapters are parameters.
//
// Token ids live on the tape as constants of exact integers in T (ids());
// embedding and cross_entropy check them when recorded.
//
// The pieces: lm/model.hpp (config, tokenizer, Lm, merge_lora), lm/files.hpp
// (save_lm, load_lm), lm/decode.hpp (KvDecoder, sampling); Hugging Face
// checkpoints in and out: grad/hf/model.hpp (the grad_hf library).
#pragma once

#include "grad/lm/decode.hpp"
#include "grad/lm/files.hpp"
#include "grad/lm/model.hpp"
