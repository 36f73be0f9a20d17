"""quants.py - independent numpy reference of the ggml weight block formats.

Owns: dequantization (raw GGUF tensor bytes -> float32) of F32, F16, BF16, Q8_0,
Q4_0, Q4_K, Q5_K and Q6_K, written from docs/models.md section 5 (block table
and the K-quant 6-bit scale unpacking), vectorized over blocks; plus simple
quantizers (float -> valid blocks) for the same types, so tests can write
quantized model files.
Does not: reproduce llama.cpp's quantizer search (our encodings are valid but not
the ones llama-quantize would pick), or know about GGUF files (see gguf_io.py).

Arithmetic: every dequantized value is computed in float32, one IEEE operation at a
time and in the order the formulas of section 5 are written, e.g. Q4_K
`y = (d * sc) * q - (dmin * mn)`, Q6_K `y = (d * sc) * q`, Q8_0 `y = d * q`,
Q4_0 `y = d * (q - 8)` (q - 8 exact). numpy float32 ops round to float32 after each
operation (no fused multiply-add), so these are the bits a straightforward C loop
without FMA contraction produces.
"""

import numpy as np

# ggml type ids (section 5)
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0 = 0, 1, 2, 8
GGML_Q4_K, GGML_Q5_K, GGML_Q6_K = 12, 13, 14
GGML_F64, GGML_BF16 = 28, 30

QK = 32     # block of the legacy quants
QK_K = 256  # super-block of the K-quants

# id -> (name, block elements, block bytes)
TYPES = {
    GGML_F32: ("F32", 1, 4),
    GGML_F16: ("F16", 1, 2),
    GGML_Q4_0: ("Q4_0", QK, 18),
    GGML_Q8_0: ("Q8_0", QK, 34),
    GGML_Q4_K: ("Q4_K", QK_K, 144),
    GGML_Q5_K: ("Q5_K", QK_K, 176),
    GGML_Q6_K: ("Q6_K", QK_K, 210),
    GGML_F64: ("F64", 1, 8),
    GGML_BF16: ("BF16", 1, 2),
}
# lower-case dtype name (as used on command lines) -> type id
NAME_TO_ID = {v[0].lower(): k for k, v in TYPES.items()}
QUANT_IDS = (GGML_Q4_0, GGML_Q8_0, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K)

F32 = np.float32


def type_id(t):
    """'q4_k' / 'Q4_K' / 12 -> 12."""
    if isinstance(t, (int, np.integer)):
        if int(t) not in TYPES:
            raise ValueError("unsupported ggml type %d" % t)
        return int(t)
    key = str(t).lower()
    if key not in NAME_TO_ID:
        raise ValueError("unsupported dtype %r (have %s)" % (t, ", ".join(sorted(NAME_TO_ID))))
    return NAME_TO_ID[key]


def block_info(t):
    """(block elements, block bytes) of a type."""
    _, blk, bsz = TYPES[type_id(t)]
    return blk, bsz


def n_bytes(t, n_elements):
    blk, bsz = block_info(t)
    if n_elements % blk:
        raise ValueError("%d elements not a multiple of block %d" % (n_elements, blk))
    return n_elements // blk * bsz


# --------------------------------------------------------------------------
# helpers

def _blocks(raw, bsz):
    b = np.frombuffer(raw, dtype=np.uint8)
    if b.size % bsz:
        raise ValueError("%d bytes not a multiple of block size %d" % (b.size, bsz))
    return b.reshape(-1, bsz)


def _half(blocks, off):
    """The fp16 field at byte `off` of every block -> float32 column [nb, 1]."""
    return blocks[:, off:off + 2].copy().view("<f2").astype(F32)


def bf16_to_f32(bits):
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(F32)


def k_scale_min(scales):
    """scales [nb, 12] uint8 -> (sc, mn) each [nb, 8] (section 5, 6-bit K-quant packing):
    s < 4:  sc = scales[s] & 63;  mn = scales[s+4] & 63
    s >= 4: sc = (scales[s+4] & 15) | ((scales[s-4] >> 6) << 4)
            mn = (scales[s+4] >> 4) | ((scales[s] >> 6) << 4)"""
    s = scales.astype(np.uint16)
    sc = np.empty((s.shape[0], 8), dtype=np.uint16)
    mn = np.empty((s.shape[0], 8), dtype=np.uint16)
    sc[:, 0:4] = s[:, 0:4] & 63
    mn[:, 0:4] = s[:, 4:8] & 63
    sc[:, 4:8] = (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:8] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn


def k_pack_scale_min(sc, mn):
    """Inverse of k_scale_min: sc, mn [nb, 8] integers in 0..63 -> scales [nb, 12] uint8."""
    sc = np.asarray(sc, dtype=np.uint16)
    mn = np.asarray(mn, dtype=np.uint16)
    if sc.max(initial=0) > 63 or mn.max(initial=0) > 63:
        raise ValueError("K-quant scale/min out of 6-bit range")
    out = np.empty((sc.shape[0], 12), dtype=np.uint16)
    out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (mn[:, 0:4] & 63) | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 15) | ((mn[:, 4:8] & 15) << 4)
    return out.astype(np.uint8)


# --------------------------------------------------------------------------
# dequantization: raw bytes -> float32 [n]

def deq_q8_0(raw):
    b = _blocks(raw, 34)
    d = _half(b, 0)                                        # [nb, 1]
    qs = b[:, 2:34].view(np.int8).astype(F32)              # [nb, 32]
    return (d * qs).reshape(-1)


def deq_q4_0(raw):
    b = _blocks(raw, 18)
    d = _half(b, 0)
    qs = b[:, 2:18]
    lo = (qs & 15).astype(F32) - F32(8)                    # x[j]      j < 16
    hi = (qs >> 4).astype(F32) - F32(8)                    # x[j + 16]
    return (d * np.concatenate([lo, hi], axis=1)).reshape(-1)


def _deq_k_4_5(b, qs, qh):
    """Shared Q4_K / Q5_K body. qs [nb, 128]; qh [nb, 32] or None (Q4_K)."""
    nb = b.shape[0]
    d = _half(b, 0)
    dmin = _half(b, 2)
    sc, mn = k_scale_min(b[:, 4:16])
    d_sc = d * sc.astype(F32)                              # [nb, 8]   d * sc(s)
    m_mn = dmin * mn.astype(F32)                           # [nb, 8]   dmin * mn(s)
    y = np.empty((nb, 256), dtype=F32)
    for j in range(4):
        q = qs[:, 32 * j:32 * j + 32]
        lo = (q & 15).astype(np.int32)
        hi = (q >> 4).astype(np.int32)
        if qh is not None:
            lo = lo + 16 * ((qh >> (2 * j)) & 1).astype(np.int32)       # u1 = 1 << 2j
            hi = hi + 16 * ((qh >> (2 * j + 1)) & 1).astype(np.int32)   # u2 = 2 << 2j
        s0, s1 = 2 * j, 2 * j + 1
        y[:, 64 * j:64 * j + 32] = d_sc[:, s0:s0 + 1] * lo.astype(F32) - m_mn[:, s0:s0 + 1]
        y[:, 64 * j + 32:64 * j + 64] = d_sc[:, s1:s1 + 1] * hi.astype(F32) - m_mn[:, s1:s1 + 1]
    return y.reshape(-1)


def deq_q4_k(raw):
    b = _blocks(raw, 144)
    return _deq_k_4_5(b, b[:, 16:144], None)


def deq_q5_k(raw):
    b = _blocks(raw, 176)
    return _deq_k_4_5(b, b[:, 48:176], b[:, 16:48])


def deq_q6_k(raw):
    b = _blocks(raw, 210)
    nb = b.shape[0]
    ql = b[:, 0:128]
    qh = b[:, 128:192]
    sc = b[:, 192:208].view(np.int8).astype(F32)           # [nb, 16]
    d = _half(b, 208)                                      # d is LAST
    q = np.empty((nb, 256), dtype=np.int32)
    for n in range(2):
        l_ = ql[:, 64 * n:64 * n + 64]
        h_ = qh[:, 32 * n:32 * n + 32].astype(np.int32)
        a, c = l_[:, 0:32].astype(np.int32), l_[:, 32:64].astype(np.int32)
        base = 128 * n
        q[:, base + 0:base + 32] = ((a & 15) | (((h_ >> 0) & 3) << 4)) - 32
        q[:, base + 32:base + 64] = ((c & 15) | (((h_ >> 2) & 3) << 4)) - 32
        q[:, base + 64:base + 96] = ((a >> 4) | (((h_ >> 4) & 3) << 4)) - 32
        q[:, base + 96:base + 128] = ((c >> 4) | (((h_ >> 6) & 3) << 4)) - 32
    # element e = 128n + 32m + l uses sc[8n + l/16 + 2m] = sc[e / 16]: one scale per 16 elements
    d_sc = np.repeat(d * sc, 16, axis=1)                   # [nb, 256]  d * sc[is]
    return (d_sc * q.astype(F32)).reshape(-1)


def dequantize(raw, t, n=None):
    """Raw tensor bytes of type t -> float32 vector (n elements, checked if given)."""
    t = type_id(t)
    if t == GGML_F32:
        y = np.frombuffer(raw, dtype="<f4").astype(F32)
    elif t == GGML_F16:
        y = np.frombuffer(raw, dtype="<f2").astype(F32)
    elif t == GGML_BF16:
        y = bf16_to_f32(np.frombuffer(raw, dtype="<u2"))
    elif t == GGML_Q8_0:
        y = deq_q8_0(raw)
    elif t == GGML_Q4_0:
        y = deq_q4_0(raw)
    elif t == GGML_Q4_K:
        y = deq_q4_k(raw)
    elif t == GGML_Q5_K:
        y = deq_q5_k(raw)
    elif t == GGML_Q6_K:
        y = deq_q6_k(raw)
    else:
        raise ValueError("dequantize: type %s is not a float32 target (F64?)" % TYPES[t][0])
    if n is not None and y.size != n:
        raise ValueError("dequantize %s: got %d values, expected %d" % (TYPES[t][0], y.size, n))
    return y


# --------------------------------------------------------------------------
# simple quantizers: float array (last axis a multiple of the block) -> bytes

def _f16(x):
    """Round to fp16 (kept as float16 array)."""
    return np.asarray(x, dtype=np.float64).astype(np.float16)


def _safe_div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b != 0, a / np.where(b != 0, b, 1), 0.0)


def q_q8_0(x):
    x = np.asarray(x, dtype=np.float64).reshape(-1, 32)
    d = _f16(np.abs(x).max(axis=1, keepdims=True) / 127.0)
    q = np.clip(np.rint(_safe_div(x, d.astype(np.float64))), -127, 127).astype(np.int8)
    out = np.empty((x.shape[0], 34), dtype=np.uint8)
    out[:, 0:2] = d.astype("<f2").view(np.uint8)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def q_q4_0(x):
    x = np.asarray(x, dtype=np.float64).reshape(-1, 32)
    idx = np.abs(x).argmax(axis=1)
    vmax = x[np.arange(x.shape[0]), idx][:, None]          # signed value of largest magnitude
    d = _f16(vmax / -8.0)                                  # that value maps to q = 0 (-8)
    q = np.clip(np.rint(_safe_div(x, d.astype(np.float64))) + 8, 0, 15).astype(np.uint8)
    out = np.empty((x.shape[0], 18), dtype=np.uint8)
    out[:, 0:2] = d.astype("<f2").view(np.uint8)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    return out.tobytes()


def _k_affine(x, levels):
    """Q4_K / Q5_K common part. x [nb, 256] -> (d, dmin fp16 [nb,1], sc, mn [nb,8], q [nb,256])."""
    nb = x.shape[0]
    xs = x.reshape(nb, 8, 32)
    lo = np.minimum(xs.min(axis=2), 0.0)                   # sub-block minimum (<= 0)
    hi = xs.max(axis=2)
    step = (hi - lo) / levels                              # wanted scale per sub-block
    mval = -lo                                             # wanted min (>= 0)
    d = _f16(step.max(axis=1, keepdims=True) / 63.0)
    dmin = _f16(mval.max(axis=1, keepdims=True) / 63.0)
    sc = np.clip(np.ceil(_safe_div(step, d.astype(np.float64))), 0, 63).astype(np.int64)
    mn = np.clip(np.ceil(_safe_div(mval, dmin.astype(np.float64))), 0, 63).astype(np.int64)
    st = (d.astype(np.float64) * sc)[:, :, None]           # effective step
    off = (dmin.astype(np.float64) * mn)[:, :, None]       # effective offset
    q = np.clip(np.rint(_safe_div(xs + off, st)), 0, levels).astype(np.int64)
    return d, dmin, sc, mn, q.reshape(nb, 256)


def q_q4_k(x):
    x = np.asarray(x, dtype=np.float64).reshape(-1, 256)
    d, dmin, sc, mn, q = _k_affine(x, 15)
    out = np.empty((x.shape[0], 144), dtype=np.uint8)
    out[:, 0:2] = d.astype("<f2").view(np.uint8)
    out[:, 2:4] = dmin.astype("<f2").view(np.uint8)
    out[:, 4:16] = k_pack_scale_min(sc, mn)
    for j in range(4):
        a = q[:, 64 * j:64 * j + 32]
        c = q[:, 64 * j + 32:64 * j + 64]
        out[:, 16 + 32 * j:16 + 32 * j + 32] = (a | (c << 4)).astype(np.uint8)
    return out.tobytes()


def q_q5_k(x):
    x = np.asarray(x, dtype=np.float64).reshape(-1, 256)
    d, dmin, sc, mn, q = _k_affine(x, 31)
    nb = x.shape[0]
    out = np.empty((nb, 176), dtype=np.uint8)
    out[:, 0:2] = d.astype("<f2").view(np.uint8)
    out[:, 2:4] = dmin.astype("<f2").view(np.uint8)
    out[:, 4:16] = k_pack_scale_min(sc, mn)
    qh = np.zeros((nb, 32), dtype=np.int64)
    for j in range(4):
        a = q[:, 64 * j:64 * j + 32]
        c = q[:, 64 * j + 32:64 * j + 64]
        out[:, 48 + 32 * j:48 + 32 * j + 32] = ((a & 15) | ((c & 15) << 4)).astype(np.uint8)
        qh |= (a >> 4) << (2 * j)
        qh |= (c >> 4) << (2 * j + 1)
    out[:, 16:48] = qh.astype(np.uint8)
    return out.tobytes()


def q_q6_k(x):
    x = np.asarray(x, dtype=np.float64).reshape(-1, 256)
    nb = x.shape[0]
    xs = x.reshape(nb, 16, 16)
    step = np.abs(xs).max(axis=2) / 31.0                   # wanted scale per 16 elements
    d = _f16(step.max(axis=1, keepdims=True) / 127.0)
    sc = np.clip(np.ceil(_safe_div(step, d.astype(np.float64))), -128, 127).astype(np.int64)
    st = (d.astype(np.float64) * sc)[:, :, None]
    q = (np.clip(np.rint(_safe_div(xs, st)), -32, 31) + 32).astype(np.int64).reshape(nb, 256)
    out = np.empty((nb, 210), dtype=np.uint8)
    for n in range(2):
        b = 128 * n
        q0, q1, q2, q3 = (q[:, b + 32 * m:b + 32 * m + 32] for m in range(4))
        out[:, 64 * n:64 * n + 32] = ((q0 & 15) | ((q2 & 15) << 4)).astype(np.uint8)
        out[:, 64 * n + 32:64 * n + 64] = ((q1 & 15) | ((q3 & 15) << 4)).astype(np.uint8)
        out[:, 128 + 32 * n:128 + 32 * n + 32] = (
            (q0 >> 4) | ((q1 >> 4) << 2) | ((q2 >> 4) << 4) | ((q3 >> 4) << 6)).astype(np.uint8)
    out[:, 192:208] = sc.astype(np.int8).view(np.uint8)
    out[:, 208:210] = d.astype("<f2").view(np.uint8)
    return out.tobytes()


def f32_to_bf16_bits(x):
    """float array -> uint16 bf16 bit patterns, round to nearest even (NaN kept NaN)."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def quantize(x, t):
    """Float array (any shape; size a multiple of the block) -> raw bytes of type t,
    laid out in C order (the last axis = ne[0] contiguous)."""
    t = type_id(t)
    x = np.ascontiguousarray(x, dtype=np.float64)
    blk, _ = block_info(t)
    if x.ndim and x.shape[-1] % blk:
        raise ValueError("%s: last axis %d not a multiple of %d" % (TYPES[t][0], x.shape[-1], blk))
    if t == GGML_F32:
        return x.astype("<f4").tobytes()
    if t == GGML_F16:
        if np.abs(x).max(initial=0.0) > 65504.0:
            raise ValueError("value out of f16 range")
        return x.astype("<f2").tobytes()
    if t == GGML_BF16:
        return f32_to_bf16_bits(x).astype("<u2").tobytes()
    if t == GGML_F64:
        return x.astype("<f8").tobytes()
    if t == GGML_Q8_0:
        return q_q8_0(x)
    if t == GGML_Q4_0:
        return q_q4_0(x)
    if t == GGML_Q4_K:
        return q_q4_k(x)
    if t == GGML_Q5_K:
        return q_q5_k(x)
    if t == GGML_Q6_K:
        return q_q6_k(x)
    raise ValueError("quantize: unsupported type %d" % t)


# --------------------------------------------------------------------------
# random valid blocks (for bit-exact dequantization tests)

def random_f16_bits(rng, n, lo_exp=-14, hi_exp=4):
    """n finite fp16 bit patterns: mostly normal numbers with exponent in [lo_exp, hi_exp]
    and random sign, plus a few specials (+-0, subnormals, the largest finite) mixed in."""
    e = rng.integers(lo_exp + 15, hi_exp + 16, n)          # biased exponent
    m = rng.integers(0, 1024, n)
    s = rng.integers(0, 2, n)
    bits = (s << 15) | (e << 10) | m
    specials = np.array([0x0000, 0x8000, 0x0001, 0x83FF, 0x0200, 0x7BFF, 0xFBFF, 0x3C00], dtype=np.int64)
    k = min(n, max(1, n // 16))
    where = rng.choice(n, k, replace=False)
    bits[where] = rng.choice(specials, k)
    return bits.astype(np.uint16)


def random_blocks(rng, t, n_blocks):
    """n_blocks random but valid blocks of type t: random bytes everywhere except the fp16
    fields (d, dmin), which get finite values from random_f16_bits."""
    t = type_id(t)
    blk, bsz = block_info(t)
    if t == GGML_F32:
        v = rng.standard_normal(n_blocks) * np.exp(rng.uniform(-20, 20, n_blocks))
        return v.astype("<f4").tobytes()
    if t == GGML_F16:
        return random_f16_bits(rng, n_blocks, -14, 15).astype("<u2").tobytes()
    if t == GGML_BF16:
        e = rng.integers(0, 255, n_blocks)                 # includes subnormals (e = 0), no inf/NaN
        bits = (rng.integers(0, 2, n_blocks) << 15) | (e << 7) | rng.integers(0, 128, n_blocks)
        return bits.astype("<u2").tobytes()
    b = rng.integers(0, 256, (n_blocks, bsz)).astype(np.uint8)
    half_fields = {GGML_Q8_0: (0,), GGML_Q4_0: (0,), GGML_Q4_K: (0, 2), GGML_Q5_K: (0, 2),
                   GGML_Q6_K: (208,)}[t]
    for off in half_fields:
        b[:, off:off + 2] = random_f16_bits(rng, n_blocks).astype("<u2").view(np.uint8).reshape(n_blocks, 2)
    return b.tobytes()


# --------------------------------------------------------------------------
# self-test (no C binary needed)

def _scalar_q4_k_block(blk):
    """Literal, per-element transcription of the section 5 Q4_K / Q5_K pseudo-code for one
    block (bytes), in float32 - a cross-check of the vectorized version."""
    is_q5 = len(blk) == 176
    d = np.frombuffer(blk[0:2].tobytes(), "<f2")[0].astype(F32)
    dmin = np.frombuffer(blk[2:4].tobytes(), "<f2")[0].astype(F32)
    ints = [int(v) for v in blk]
    scales = ints[4:16]
    qh = ints[16:48] if is_q5 else None
    qs = ints[48:176] if is_q5 else ints[16:144]

    def sm(s):
        if s < 4:
            return scales[s] & 63, scales[s + 4] & 63
        return ((scales[s + 4] & 15) | ((scales[s - 4] >> 6) << 4),
                (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4))
    y = []
    for j in range(4):
        sc1, m1 = sm(2 * j)
        sc2, m2 = sm(2 * j + 1)
        d1, mm1 = d * F32(sc1), dmin * F32(m1)
        d2, mm2 = d * F32(sc2), dmin * F32(m2)
        u1, u2 = 1 << (2 * j), 2 << (2 * j)
        lo, hi = [], []
        for l in range(32):
            q = qs[32 * j + l]
            a, b = q & 15, q >> 4
            if is_q5:
                a += 16 if qh[l] & u1 else 0
                b += 16 if qh[l] & u2 else 0
            lo.append(d1 * F32(a) - mm1)
            hi.append(d2 * F32(b) - mm2)
        y += lo + hi
    return np.array(y, dtype=F32)


def _scalar_q6_k_block(blk):
    ints = [int(v) for v in blk]
    ql, qh = ints[0:128], ints[128:192]
    sc = [int(v) for v in blk[192:208].view(np.int8)]
    d = np.frombuffer(blk[208:210].tobytes(), "<f2")[0].astype(F32)
    y = np.zeros(256, dtype=F32)
    for n in range(2):
        for l in range(32):
            i_s = l // 16
            L, H, S = ql[64 * n:], qh[32 * n:], sc[8 * n:]
            q1 = ((L[l] & 15) | (((H[l] >> 0) & 3) << 4)) - 32
            q2 = ((L[l + 32] & 15) | (((H[l] >> 2) & 3) << 4)) - 32
            q3 = ((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32
            q4 = ((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32
            y[128 * n + l] = d * F32(S[i_s + 0]) * F32(q1)
            y[128 * n + l + 32] = d * F32(S[i_s + 2]) * F32(q2)
            y[128 * n + l + 64] = d * F32(S[i_s + 4]) * F32(q3)
            y[128 * n + l + 96] = d * F32(S[i_s + 6]) * F32(q4)
    return y


def self_test(verbose=False):
    """Returns a list of (check, detail); raises AssertionError on a failure."""
    rng = np.random.default_rng(7)
    report = []
    # 1. vectorized dequant == literal per-element transcription, bit for bit
    for t, fn in ((GGML_Q4_K, _scalar_q4_k_block), (GGML_Q5_K, _scalar_q4_k_block),
                  (GGML_Q6_K, _scalar_q6_k_block)):
        raw = random_blocks(rng, t, 6)
        _, bsz = block_info(t)
        vec = dequantize(raw, t).view(np.uint32)
        lit = np.concatenate([fn(np.frombuffer(raw[i * bsz:(i + 1) * bsz], np.uint8))
                              for i in range(6)]).view(np.uint32)
        assert np.array_equal(vec, lit), "%s: vectorized != literal" % TYPES[t][0]
        report.append((TYPES[t][0], "vectorized == per-element transcription (6 random blocks)"))
    # Q8_0 / Q4_0 by hand on one block
    blk = np.zeros(34, np.uint8)
    blk[0:2] = np.array([0.5], "<f2").view(np.uint8)
    blk[2:] = np.arange(-16, 16).astype(np.int8).view(np.uint8)
    assert np.array_equal(deq_q8_0(blk.tobytes()), 0.5 * np.arange(-16, 16, dtype=F32))
    blk = np.zeros(18, np.uint8)
    blk[0:2] = np.array([2.0], "<f2").view(np.uint8)
    blk[2:] = np.arange(16) | ((15 - np.arange(16)) << 4)
    want = 2.0 * np.concatenate([np.arange(16) - 8, (15 - np.arange(16)) - 8]).astype(F32)
    assert np.array_equal(deq_q4_0(blk.tobytes()), want)
    report.append(("Q8_0/Q4_0", "hand-made blocks"))
    # 2. scale packing round trip over all 64 x 64 values
    sc = rng.integers(0, 64, (512, 8))
    mn = rng.integers(0, 64, (512, 8))
    sc[0], mn[0] = 63, 63
    s2, m2 = k_scale_min(k_pack_scale_min(sc, mn))
    assert np.array_equal(s2, sc) and np.array_equal(m2, mn)
    report.append(("K scales", "pack/unpack round trip"))
    # 3. quantizers: round trip error bounded by the format's resolution
    x = rng.standard_normal((8, 512)) * np.exp(rng.uniform(-3, 3, (8, 1)))
    for name, rel in (("q8_0", 0.006), ("q4_0", 0.13), ("q4_k", 0.08), ("q5_k", 0.04), ("q6_k", 0.02),
                      ("f16", 1e-3), ("bf16", 8e-3)):
        y = dequantize(quantize(x, name), name).reshape(x.shape).astype(np.float64)
        e = float((np.abs(y - x).max(axis=1) / np.abs(x).max(axis=1)).max())
        assert e < rel, "%s round trip error %.3g >= %.3g" % (name, e, rel)
        report.append((name, "quantize->dequantize max err %.3g of row max (bound %.2g)" % (e, rel)))
    z = np.zeros((2, 256))
    for name in ("q8_0", "q4_0", "q4_k", "q5_k", "q6_k"):
        assert not dequantize(quantize(z, name), name).any(), name
    # 4. bf16 activations: ties to even both ways, a denormal to zero, and the file's bf16
    # quantizer (bit arithmetic) agreeing with the frexp form on normal values
    hand = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -(1 + 2.0 ** -8), 1 + 2.0 ** -8 + 2.0 ** -20, 2.0 ** -130, 3.0])
    want = np.array([1.0, 1 + 2.0 ** -6, -1.0, 1 + 2.0 ** -7, 0.0, 3.0])
    assert np.array_equal(round_bf16_activations(hand), want), round_bf16_activations(hand)
    y = dequantize(quantize(x, "bf16"), "bf16").reshape(x.shape).astype(np.float64)
    assert np.array_equal(round_bf16_activations(x), y), "bf16 activations != the bf16 quantizer"
    report.append(("bf16 act", "ties to even, denormal to zero, == the file quantizer on 4096 values"))
    if verbose:
        for a, b in report:
            print("  %-10s %s" % (a, b))
    return report


if __name__ == "__main__":
    self_test(verbose=True)
    print("quants self-test ok")


# --------------------------------------------------------------------------
# int8 activations: what the Q8_0 / Q4_0 / K-quant int8 products multiply (docs/performance.md)

def act_block(t):
    """Activation values per scale for the int8 products on weights of type t: 32 for Q8_0 and
    Q4_0 (Q8_0-style blocks), 256 for the K-quants (Q8_K-style super-blocks); None for the rest."""
    t = type_id(t)
    if t in (GGML_Q8_0, GGML_Q4_0):
        return QK
    if t in (GGML_Q4_K, GGML_Q5_K, GGML_Q6_K):
        return QK_K
    return None


def quantize_activations(x, block):
    """x [..., n] (n a multiple of block) as the int8 products see it: per block of each row,
    in float32 arithmetic, d = max|x| / 127, q = round_half_even(x * (1 / d)) (q = 0 where d = 0),
    |q| <= 127; returns q d in float64, the exact value each integer product is scaled by
    (sum_i w_i q_i d = sum_i w_i (q_i d) exactly)."""
    x32 = np.asarray(x, dtype=np.float64).astype(F32)
    xb = x32.reshape(-1, block)
    amax = np.max(np.abs(xb), axis=1)
    d = (amax / F32(127.0)).astype(F32)
    inv = np.where(d > 0, F32(1.0) / np.where(d > 0, d, F32(1.0)), F32(0.0)).astype(F32)
    q = np.rint(xb * inv[:, None])                  # float32 product, ties to even
    return (q.astype(np.float64) * d.astype(np.float64)[:, None]).reshape(np.shape(x))


# --------------------------------------------------------------------------
# bf16 activations: what the BF16 prompt products on vdpbf16ps multiply (docs/performance.md)

def round_bf16_activations(x):
    """x [...] as the bf16 products see it: each value first held as float32 (the engine's
    activations), then rounded to bfloat16's 8 significant bits, to nearest with ties to even;
    a float32 denormal (|x| < 2^-126) becomes zero, as vcvtneps2bf16 makes it. Returns float64
    (every bf16 value is exact there). From the format: x = m 2^e with 0.5 <= |m| < 1
    (frexp), kept as rint(m 2^8) 2^(e - 8)."""
    x32 = np.asarray(x, dtype=np.float64).astype(F32).astype(np.float64)
    m, e = np.frexp(x32)
    r = np.ldexp(np.rint(np.ldexp(m, 8)), e - 8)
    return np.where(np.abs(x32) < 2.0 ** -126, 0.0 * x32, r)
