"""bench/real_scale.sh's table: reads LOGS (one .out, .time and, for grad, a
Google Benchmark .json per configuration and round) and prints, as Markdown,
workload, implementation, threads, tokens/s median (over every round's
repetitions), peak RSS (the largest over its processes) and grad's figure over
the peer's at the same threads; then decode's share of the measured memory
bandwidth, and the checks: grad's losses at 1 and 2 threads bit for bit, the
first loss against PyTorch's, the greedy tokens of every implementation, and
grad's profile of one L1 step.

  real_scale_table.py LOGS MODEL_DIR SEQ PROMPT NEW
"""
import glob
import json
import os
import re
import statistics
import sys


def read(path):
    with open(path) as f:
        return f.read()


def configs(logs):
    """name -> sorted round numbers, from LOGS/NAME.rR.out."""
    out = {}
    for p in glob.glob(os.path.join(logs, "*.r*.out")):
        m = re.match(r"(.*)\.r(\d+)\.out$", os.path.basename(p))
        time_file = p[:-len(".out")] + ".time"  # /usr/bin/time -o creates it at the start, fills it at the end
        if os.path.exists(time_file) and "Maximum resident" in read(time_file):  # a round cut short is left out
            out.setdefault(m.group(1), []).append(int(m.group(2)))
    return {k: sorted(v) for k, v in out.items()}


def samples(logs, name, rounds):
    """metric -> list of tokens/s over all rounds' repetitions."""
    got = {}
    for r in rounds:
        if "-grad-" in name:
            for b in json.loads(read(os.path.join(logs, f"{name}.r{r}.json")))["benchmarks"]:
                if b.get("run_type") != "iteration":
                    continue
                for key in ("items_per_second", "prefill_tok_s", "decode_tok_s"):
                    if key in b:
                        got.setdefault("tokens_per_s" if key == "items_per_second" else key, []).append(b[key])
        else:
            line = [l for l in read(os.path.join(logs, f"{name}.r{r}.out")).splitlines() if l.startswith("result ")][-1]
            for key, v in json.loads(line[len("result "):]).items():
                if key.endswith("tok_s") or key == "tokens_per_s":
                    got.setdefault(key, []).extend(v)
    return got


def peak_rss_mib(logs, name, rounds):
    kib = 0
    for r in rounds:
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", read(os.path.join(logs, f"{name}.r{r}.time")))
        kib = max(kib, int(m.group(1)))
    return kib / 1024


def losses(logs, name, r):
    out = []
    for l in read(os.path.join(logs, f"{name}.r{r}.out")).splitlines():
        m = re.match(r"loss (\d+) (\S+)$", l)
        if m:
            out.append(m.group(2))
    return out


def tokens(logs, name, r):
    lines = [l for l in read(os.path.join(logs, f"{name}.r{r}.out")).splitlines() if l.startswith("tokens")]
    return [int(x) for x in lines[-1].split()[1:]] if lines else []


def round_median(logs, name, r):
    """grad's or PyTorch's L1 tokens/s in round r: the median of its repetitions."""
    got = samples(logs, name, [r]).get("tokens_per_s")
    return statistics.median(got) if got else None


def core_balance(logs, name, r):
    """The lowest slowest/fastest core ratio of corespeed's snapshots around NAME's round r, or None."""
    p = os.path.join(logs, f"corespeed-{name}.r{r}.out")
    ratios = [float(x) for x in re.findall(r"slowest/fastest ([\d.]+)", read(p))] if os.path.exists(p) else []
    return min(ratios) if ratios else None


# grad's and PyTorch's L1 runs at 1 and 2 threads: the scaling lines and the loss checks compare them.
GRAD_L1 = ("L1-grad-t1", "L1-grad-t2")
TORCH_L1 = ("L1-torch-t1", "L1-torch-t2")


def scaling(logs, cfg):
    """L1 tokens/s at 2 threads over 1, round by round, with the cores' balance around grad's runs."""
    one, two = GRAD_L1
    if one not in cfg or two not in cfg:
        return
    print("L1 scaling from 1 to 2 threads, per round (each the ratio of that round's medians; cores: the slowest "
          "core's arithmetic speed over the fastest's, lowest of bench/corespeed's snapshots before and after "
          "grad's two runs):")
    grad_all, grad_even = [], []
    for r in sorted(set(cfg[one]) & set(cfg[two])):
        g1, g2 = round_median(logs, one, r), round_median(logs, two, r)
        line = f"  round {r}: grad {g2 / g1:.2f}x"
        grad_all.append(g2 / g1)
        t1, t2 = TORCH_L1
        if r in cfg.get(t1, []) and r in cfg.get(t2, []):
            line += f", PyTorch {round_median(logs, t2, r) / round_median(logs, t1, r):.2f}x"
        balance = [b for b in (core_balance(logs, one, r), core_balance(logs, two, r)) if b is not None]
        if balance:
            line += f", cores {min(balance):.2f}"
            if min(balance) >= 0.9:
                grad_even.append(g2 / g1)
        print(line)
    summary = f"  median over rounds: grad {statistics.median(grad_all):.2f}x ({len(grad_all)} rounds)"
    if grad_even:
        summary += (f"; {statistics.median(grad_even):.2f}x over the {len(grad_even)} whose cores all ran at "
                    f">= 0.9 of the fastest")
    print(summary)
    print()


def bandwidth(logs, threads):
    p = os.path.join(logs, f"membw-{threads}.out")
    if not os.path.exists(p):
        return None
    m = re.search(r"read ([\d.]+) GB/s best", read(p))
    return float(m.group(1)) if m else None


def main():
    logs, model_dir, seq, prompt, new = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
    cfg = configs(logs)
    weight_bytes = os.path.getsize(os.path.join(model_dir, "model.safetensors"))
    phases = {"L1": [("L1 finetune", "tokens_per_s")], "L2": [("L2 prefill", "prefill_tok_s"),
                                                            ("L2 decode", "decode_tok_s")]}
    med = {}
    rows = []
    order = sorted(cfg, key=lambda n: (n.split("-")[0], int(n.rsplit("-t", 1)[1]), n.split("-")[1] != "grad", n))
    for name in order:
        work, impl, t = name.split("-")[0], name.split("-")[1], int(name.rsplit("-t", 1)[1])
        got = samples(logs, name, cfg[name])
        rss = peak_rss_mib(logs, name, cfg[name])
        for label, key in phases[work]:
            if key not in got:
                continue
            med[(label, impl, t)] = statistics.median(got[key])
            rows.append((label, impl, t, med[(label, impl, t)], len(got[key]), rss))
    c = json.load(open(os.path.join(model_dir, "config.json")))
    print(f"model: {model_dir}: hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, "
          f"{c['num_attention_heads']}/{c['num_key_value_heads']} heads of width {c['head_dim']}, "
          f"MLP {c['intermediate_size']}, vocabulary {c['vocab_size']} ({weight_bytes / 1e9:.2f} GB of F32 weights); "
          f"L1 batch 1 x {seq}; L2 prompt {prompt}, {new} new tokens")
    print()
    print("| workload | implementation | threads | tokens/s (median) | samples | peak RSS | grad / peer |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for label, impl, t, m, n, rss in sorted(rows, key=lambda x: (x[0], x[2], x[1] != "grad", x[1])):
        g = med.get((label, "grad", t))
        ratio = "" if impl == "grad" or not g else f"{g / m:.2f}x"
        print(f"| {label} | {impl} | {t} | {m:.1f} | {n} | {rss / 1024:.2f} GiB | {ratio} |")
    print()
    print("decode against the memory bandwidth (each token reads every weight once: "
          f"{weight_bytes / 1e9:.2f} GB; the KV cache not counted):")
    for (label, impl, t), m in sorted(med.items()):
        bw = bandwidth(logs, t)
        if label == "L2 decode" and bw:
            print(f"  {impl} at {t} thread(s): {m * weight_bytes / 1e9:.2f} GB/s of {bw:.2f} GB/s measured read "
                  f"bandwidth ({t} thread(s)): {100 * m * weight_bytes / 1e9 / bw:.0f}%")
    print()
    scaling(logs, cfg)
    print("checks:")
    one, two = GRAD_L1
    if one in cfg and two in cfg:
        for r in sorted(set(cfg[one]) & set(cfg[two])):
            a, b = losses(logs, one, r), losses(logs, two, r)
            n = min(len(a), len(b))
            print(f"  round {r}: grad's L1 losses of {n} steps at 1 and 2 threads "
                  f"{'bitwise equal' if a[:n] == b[:n] else 'DIFFER: ' + str(a[:n]) + ' ' + str(b[:n])}")
    for t in (1, 2):
        g, p = f"L1-grad-t{t}", f"L1-torch-t{t}"
        if g in cfg and p in cfg:
            a, b = float.fromhex(losses(logs, g, 1)[0]), float(losses(logs, p, 1)[0])
            print(f"  first L1 loss at {t} thread(s): grad {a:.7g}, PyTorch {b:.7g} (relative difference {abs(a - b) / abs(b):.1e})")
            break
    for t in (1, 2):
        ref = f"L2-grad-t{t}"
        if ref not in cfg:
            continue
        g = tokens(logs, ref, cfg[ref][-1])
        for other in (f"L2-grad-t{3 - t}", f"L2-torch-t{t}", f"L2-llama.cpp-t{t}"):
            if other in cfg:
                o = tokens(logs, other, cfg[other][-1])
                same = next((i for i, (x, y) in enumerate(zip(g, o)) if x != y), min(len(g), len(o)))
                print(f"  greedy tokens: {ref} and {other} agree on the first {same} of {len(g)}")
        print(f"  {ref}'s tokens start {g[:12]} ({len(set(g))} distinct)")
        break
    if one in cfg:
        out = read(os.path.join(logs, f"{one}.r{cfg[one][-1]}.out"))
        at = out.find("profile of one step")
        if at >= 0:
            print()
            print("grad's profile of one L1 step at 1 thread (after the timed ones):")
            print(out[at:].rstrip())


if __name__ == "__main__":
    main()
