"""Float64 PyTorch reference of Hugging Face's Qwen2ForCausalLM and
LlamaForCausalLM, written from their published definitions (transformers'
modeling_qwen2.py / modeling_llama.py and PEFT's LoRA layer), not from
grad's model: test/test_hf.cpp runs it on the very safetensors files it
wrote and loaded, and compares logits, loss and the adapters' gradients.

    /usr/bin/python3 test/oracle/hf_oracle.py MODEL_DIR ADAPTER_DIR|- BATCH SEQ IDS TARGETS OUT [MODEL_DIR ...]
(as many cases as groups of seven arguments: one start of torch for all). IDS and TARGETS are comma-separated ([BATCH, SEQ] and [BATCH*SEQ], -100 ignored:
the targets are already the next tokens, no shift). OUT gets, in
test/golden.hpp's format: "logits" [BATCH*SEQ, vocab], "loss" [1], and
"grad.<PEFT name>" for every adapter tensor (lora_A [r, in], lora_B [out, r]).

The pieces, as transformers defines them:
  RMSNorm      w * (x * rsqrt(mean(x^2) + eps))
  RoPE         inv_freq = 1 / theta^(arange(0, hd, 2) / hd), emb = cat(freqs, freqs),
               q * cos + rotate_half(q) * sin, rotate_half(x) = cat(-x2, x1)
  attention    q, k, v = Linear(h) (bias on q/k/v for Qwen2), repeat_kv for GQA,
               softmax(q k^T * hd^-0.5 + causal mask) v, o_proj
  MLP          down(silu(gate(h)) * up(h))
  lm_head      embed_tokens.weight when tie_word_embeddings
  LoRA (PEFT)  base(x) + lora_B(lora_A(x)) * lora_alpha / r"""

import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden import write_golden  # noqa: E402

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def read_safetensors(path):
    """name -> float64 tensor, from the format's definition (no safetensors package)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:end]), dtype=DTYPES[e["dtype"]]) if end > b else \
            torch.zeros(0, dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"]).to(torch.float64)
    return out


def read_model(d):
    index = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for f in files:
        w.update(read_safetensors(os.path.join(d, f)))
    return w


def rms_norm(x, weight, eps):
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(h, n_rep):
    b, kv, t, hd = h.shape
    if n_rep == 1:
        return h
    return h[:, :, None, :, :].expand(b, kv, n_rep, t, hd).reshape(b, kv * n_rep, t, hd)


def main():
    args = sys.argv[1:]
    if not args or len(args) % 7 != 0:
        sys.exit(__doc__)
    for i in range(0, len(args), 7):
        run_case(*args[i:i + 7])


def run_case(model_dir, adapter_dir, B, T, ids, targets, out_path):
    B, T = int(B), int(T)
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    arch = cfg["architectures"][0]
    assert arch in ("Qwen2ForCausalLM", "LlamaForCausalLM"), arch
    W = read_model(model_dir)
    d, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads", H)
    hd = cfg.get("head_dim") or d // H
    eps, theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    tied = cfg.get("tie_word_embeddings", False)

    lora, scaling = {}, 0.0
    if adapter_dir != "-":
        acfg = json.load(open(os.path.join(adapter_dir, "adapter_config.json")))
        scaling = acfg["lora_alpha"] / acfg["r"]
        lora = read_safetensors(os.path.join(adapter_dir, "adapter_model.safetensors"))
        for t in lora.values():
            t.requires_grad_(True)

    def linear(x, module):
        """module: e.g. model.layers.0.self_attn.q_proj; torch.nn.Linear plus PEFT's adapter."""
        y = F.linear(x, W[module + ".weight"], W.get(module + ".bias"))
        a = lora.get("base_model.model." + module + ".lora_A.weight")
        if a is not None:
            b = lora["base_model.model." + module + ".lora_B.weight"]
            y = y + F.linear(F.linear(x, a), b) * scaling
        return y

    ids_t = torch.tensor([int(v) for v in ids.split(",")]).reshape(B, T)
    tgt_t = torch.tensor([int(v) for v in targets.split(",")])
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).to(torch.float64) / hd))
    freqs = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.full((T, T), torch.finfo(torch.float64).min, dtype=torch.float64).triu(1)

    x = W["model.embed_tokens.weight"][ids_t]  # [B, T, d]
    for layer in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{layer}."
        h = rms_norm(x, W[pre + "input_layernorm.weight"], eps)
        q = linear(h, pre + "self_attn.q_proj").view(B, T, H, hd).transpose(1, 2)
        k = linear(h, pre + "self_attn.k_proj").view(B, T, KV, hd).transpose(1, 2)
        v = linear(h, pre + "self_attn.v_proj").view(B, T, KV, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, H // KV), repeat_kv(v, H // KV)
        scores = torch.matmul(q, k.transpose(2, 3)) * hd ** -0.5 + mask
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(B, T, H * hd)
        x = x + linear(ctx, pre + "self_attn.o_proj")
        h = rms_norm(x, W[pre + "post_attention_layernorm.weight"], eps)
        x = x + linear(F.silu(linear(h, pre + "mlp.gate_proj")) * linear(h, pre + "mlp.up_proj"),
                       pre + "mlp.down_proj")
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if tied else W["lm_head.weight"]
    logits = F.linear(x, head).reshape(B * T, -1)
    loss = F.cross_entropy(logits, tgt_t, ignore_index=-100)
    out = {"logits": logits.detach(), "loss": loss.detach().reshape(1)}
    if lora:
        loss.backward()
        for name, t in lora.items():
            out["grad." + name] = t.grad
    write_golden(out_path, out, f"{arch} float64 reference, torch {torch.__version__}, test/oracle/hf_oracle.py")


if __name__ == "__main__":
    main()
