"""PyTorch eager peer of bench_real_scale (issue 27's L1 and L2), float32.

  peer_torch_real_scale.py finetune --model DIR --threads N --reps R [--seq 512] [--rank 16]
  peer_torch_real_scale.py generate --model DIR --threads N --reps R [--prompt 512] [--new 128]

A Qwen2 decoder written here in eager PyTorch, as Hugging Face's
Qwen2ForCausalLM computes it with attn_implementation="eager" (RMSNorm,
rotate-half RoPE, grouped-query attention as matmul + causal mask + softmax,
SiLU-gated MLP, tied head); the weights read from the directory's
model.safetensors by the format's definition (there is no safetensors package
here). finetune: PEFT-style LoRA (y = x W^T + b + alpha / r * (x A^T) B^T, B
zero at first) on every projection, the base frozen, torch.optim.Adam over the
adapters, one step per repetition. generate: the prompt in one batch (only its
last position's logits, as llama.cpp and transformers' generate compute), then
greedy tokens one at a time through a preallocated KV cache. One warm-up
before the timed repetitions, as bench_real_scale (finetune: a step;
generate: 16 prompt tokens and 4 new ones). The token ids are
bench_real_scale's token_at formula. Prints "loss STEP VALUE" / "tokens ...",
then one line "result {json}" that bench/real_scale.sh reads.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def read_safetensors(path):
    """name -> float32 tensor; F32 tensors are views of one buffer (the file read once)."""
    size = os.path.getsize(path)
    buf = torch.empty(size, dtype=torch.uint8)
    with open(path, "rb") as f:
        f.readinto(memoryview(buf.numpy()))
    (n,) = struct.unpack("<Q", bytes(buf[:8].tolist()))
    header = json.loads(bytes(buf[8:8 + n].tolist()))
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = buf[8 + n + b:8 + n + end]
        dtype = DTYPES[e["dtype"]]
        if (8 + n + b) % torch.empty(0, dtype=dtype).element_size() != 0:  # a misaligned tensor: copied
            raw = raw.clone()
        out[name] = raw.view(dtype).reshape(e["shape"]).to(torch.float32)
    return out


def token_at(i, vocab):
    return (i * 7919 + 13) % vocab


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Qwen2:
    def __init__(self, model_dir, lora_rank=0, lora_alpha=32.0, max_seq=1024):
        cfg = json.load(open(os.path.join(model_dir, "config.json")))
        self.cfg = cfg
        self.w = read_safetensors(os.path.join(model_dir, "model.safetensors"))
        self.layers = cfg["num_hidden_layers"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg["num_key_value_heads"]
        self.hd = cfg.get("head_dim", cfg["hidden_size"] // self.heads)
        self.eps = cfg["rms_norm_eps"]
        self.embed = self.w["model.embed_tokens.weight"]
        self.head = self.w.get("lm_head.weight", self.embed)  # tied
        inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, self.hd, 2, dtype=torch.float32) / self.hd))
        freqs = torch.outer(torch.arange(max_seq, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos, self.sin = emb.cos(), emb.sin()
        self.lora = {}
        self.scale = lora_alpha / lora_rank if lora_rank else 0.0
        if lora_rank:
            g = torch.Generator().manual_seed(1)
            for l in range(self.layers):
                for name in self.projections(l):
                    out_f, in_f = self.w[name + ".weight"].shape
                    a = (torch.rand(lora_rank, in_f, generator=g) * 2 - 1) / math.sqrt(in_f)
                    self.lora[name] = (a.requires_grad_(), torch.zeros(out_f, lora_rank, requires_grad=True))

    @staticmethod
    def projections(l):
        p = f"model.layers.{l}."
        return [p + "self_attn." + n for n in ("q_proj", "k_proj", "v_proj", "o_proj")] + \
               [p + "mlp." + n for n in ("gate_proj", "up_proj", "down_proj")]

    def parameters(self):
        return [t for ab in self.lora.values() for t in ab]

    def linear(self, x, name):
        y = F.linear(x, self.w[name + ".weight"], self.w.get(name + ".bias"))
        if name in self.lora:
            a, b = self.lora[name]
            y = y + self.scale * F.linear(F.linear(x, a), b)
        return y

    def block(self, l, x, pos, cache=None):
        """x [T, d] at positions pos .. pos + T - 1; cache: (keys, values) [layers, kv, max, hd] to fill and read."""
        T = x.shape[0]
        p = f"model.layers.{l}."
        h = rms_norm(x, self.w[p + "input_layernorm.weight"], self.eps)
        q = self.linear(h, p + "self_attn.q_proj").view(T, self.heads, self.hd).transpose(0, 1)
        k = self.linear(h, p + "self_attn.k_proj").view(T, self.kv_heads, self.hd).transpose(0, 1)
        v = self.linear(h, p + "self_attn.v_proj").view(T, self.kv_heads, self.hd).transpose(0, 1)
        cos, sin = self.cos[pos:pos + T], self.sin[pos:pos + T]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            cache[0][l, :, pos:pos + T] = k
            cache[1][l, :, pos:pos + T] = v
            k, v = cache[0][l, :, :pos + T], cache[1][l, :, :pos + T]
        group = self.heads // self.kv_heads
        k = k.repeat_interleave(group, dim=0)
        v = v.repeat_interleave(group, dim=0)
        scores = torch.matmul(q, k.transpose(1, 2)) / math.sqrt(self.hd)
        if T > 1:
            n = k.shape[1]
            mask = torch.full((T, n), float("-inf")).triu(n - T + 1)
            scores = scores + mask
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(0, 1).reshape(T, self.heads * self.hd)
        x = x + self.linear(ctx, p + "self_attn.o_proj")
        h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], self.eps)
        m = F.silu(self.linear(h, p + "mlp.gate_proj")) * self.linear(h, p + "mlp.up_proj")
        return x + self.linear(m, p + "mlp.down_proj")

    def hidden(self, ids, pos=0, cache=None):
        x = F.embedding(ids, self.embed)
        for l in range(self.layers):
            x = self.block(l, x, pos, cache)
        return rms_norm(x, self.w["model.norm.weight"], self.eps)

    def logits(self, h):
        return F.linear(h, self.head)


def finetune(a):
    m = Qwen2(a.model, lora_rank=a.rank, max_seq=a.seq)
    vocab = m.embed.shape[0]
    ids = torch.tensor([token_at(i, vocab) for i in range(a.seq)])
    targets = torch.tensor([token_at(i + 1, vocab) for i in range(a.seq)])
    opt = torch.optim.Adam(m.parameters(), lr=1e-4)
    rates, losses = [], []

    def step():
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(m.logits(m.hidden(ids)), targets)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        print(f"loss {len(losses)} {losses[-1]!r}", flush=True)
        return dt

    step()  # warm-up
    for _ in range(a.reps):
        rates.append(a.seq / step())
    return {"tokens_per_s": rates, "losses": losses}


def generate(a):
    m = Qwen2(a.model, max_seq=a.prompt + a.new)
    vocab = m.embed.shape[0]
    prompt = torch.tensor([token_at(i, vocab) for i in range(a.prompt)])
    shape = (m.layers, m.kv_heads, a.prompt + a.new, m.hd)
    cache = (torch.zeros(shape), torch.zeros(shape))
    prefill, decode = [], []

    def run(n_prompt, n_new):
        with torch.inference_mode():
            t0 = time.perf_counter()
            h = m.hidden(prompt[:n_prompt], 0, cache)
            tokens = [int(torch.argmax(m.logits(h[-1])))]
            t1 = time.perf_counter()
            for n in range(1, n_new):
                h = m.hidden(torch.tensor([tokens[-1]]), n_prompt + n - 1, cache)
                tokens.append(int(torch.argmax(m.logits(h[-1]))))
            t2 = time.perf_counter()
        return n_prompt / (t1 - t0), (n_new - 1) / (t2 - t1), tokens

    run(min(a.prompt, 16), 4)  # warm-up: a short run, as bench_real_scale's
    for _ in range(a.reps):
        p, d, tokens = run(a.prompt, a.new)
        prefill.append(p)
        decode.append(d)
    print("tokens " + " ".join(map(str, tokens)))
    return {"prefill_tok_s": prefill, "decode_tok_s": decode, "tokens": tokens}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["finetune", "generate"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=128)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    r = finetune(a) if a.mode == "finetune" else generate(a)
    r["threads"] = torch.get_num_threads()
    print("result " + json.dumps(r), flush=True)


if __name__ == "__main__":
    sys.exit(main())
