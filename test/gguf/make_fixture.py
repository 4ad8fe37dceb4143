#!/usr/bin/env python3
# Writes llama_cpp_quantize.txt from llama.cpp's quantized files (see
# README.md): per case, file type and quantized tensor, llama.cpp's ggml
# type, the tensor's byte count and the FNV-1a 64 hash of its bytes.
#
#   make_fixture.py WORK > llama_cpp_quantize.txt
import struct
import sys

BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 6: (32, 22), 8: (32, 34), 12: (256, 144), 13: (256, 176), 14: (256, 210)}
SCALARS = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: 'B', 10: 'Q', 11: 'q', 12: 'd'}


def read_gguf(path):
    """The tensors of a GGUF v3 file: name -> (ne, ggml type, bytes from its offset on)."""
    b = open(path, 'rb').read()
    at = 4

    def take(fmt):
        nonlocal at
        v = struct.unpack_from('<' + fmt, b, at)[0]
        at += struct.calcsize(fmt)
        return v

    def string():
        nonlocal at
        n = take('Q')
        at += n
        return b[at - n:at].decode()

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take('I'), take('Q')
            return [value(et) for _ in range(n)]
        return take(SCALARS[t])

    take('I')  # version
    tensors, kvs = take('Q'), take('Q')
    meta = {}
    for _ in range(kvs):
        key = string()
        meta[key] = value(take('I'))
    infos = {}
    for _ in range(tensors):
        name = string()
        ne = [take('Q') for _ in range(take('I'))]
        infos[name] = (ne, take('I'), take('Q'))
    align = meta.get('general.alignment', 32)
    start = (at + align - 1) // align * align
    return {name: (ne, t, b[start + off:]) for name, (ne, t, off) in infos.items()}


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for x in data:
        h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


CASES = [('qwen2_d256_l8', 'q256'), ('llama_tied_d256_l3', 'llt'), ('qwen2_d96_ffn80', 'd80')]
FILE_TYPES = [(7, 'q8_0'), (2, 'q4_0'), (15, 'q4_k_m')]
work = sys.argv[1]
for case, folder in CASES:
    for ftype, name in FILE_TYPES:
        tensors = read_gguf(f'{work}/{folder}/llama_{ftype}.gguf')
        for tensor in sorted(tensors):
            ne, t, data = tensors[tensor]
            if t == 0:
                continue  # vectors stay F32
            per_block, block_bytes = BLOCKS[t]
            rows = 1
            for x in ne[1:]:
                rows *= x
            n = ne[0] // per_block * block_bytes * rows
            print(f'{case} {name} {tensor} {t} {n} {fnv1a64(data[:n]):016x}')
