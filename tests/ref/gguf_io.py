"""gguf_io.py - a small, independent GGUF v3 reader and writer (numpy only).

Owns: the GGUF container format of docs/models.md section 5 (header, typed
metadata including arrays and arrays of strings, tensor infos, alignment,
data section) and reading / writing tensors of every type quants.py handles
(F32, F16, BF16, F64, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K): quantized data is kept as
raw blocks in the file and dequantized (to float32 values, returned as float64)
on read.
Does not: know anything about a model architecture (see qwen35_ref.py,
models_ref.py) or the block formats themselves (see quants.py).

Shapes: a GGUF tensor with ne = {ne0, ne1, ...} (ne0 contiguous) is returned
as a numpy array of shape (..., ne1, ne0), i.e. the reversed ne, so a weight
with ne = {in, out} becomes W[out, in] and y = W @ x.
"""

import struct

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quants  # noqa: E402

GGUF_MAGIC = 0x46554747  # b"GGUF" read as a little-endian u32
GGUF_DEFAULT_ALIGNMENT = 32

# metadata value types (section 5)
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32 = 0, 1, 2, 3, 4, 5
T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 6, 7, 8, 9
T_UINT64, T_INT64, T_FLOAT64 = 10, 11, 12

# scalar value type -> struct format (little-endian)
_SCALAR_FMT = {
    T_UINT8: "<B", T_INT8: "<b", T_UINT16: "<H", T_INT16: "<h",
    T_UINT32: "<I", T_INT32: "<i", T_FLOAT32: "<f", T_BOOL: "<B",
    T_UINT64: "<Q", T_INT64: "<q", T_FLOAT64: "<d",
}
# scalar value type -> numpy dtype (for fast decoding of numeric arrays)
_SCALAR_NP = {
    T_UINT8: "<u1", T_INT8: "<i1", T_UINT16: "<u2", T_INT16: "<i2",
    T_UINT32: "<u4", T_INT32: "<i4", T_FLOAT32: "<f4", T_BOOL: "<u1",
    T_UINT64: "<u8", T_INT64: "<i8", T_FLOAT64: "<f8",
}
TYPE_NAMES = {
    T_UINT8: "UINT8", T_INT8: "INT8", T_UINT16: "UINT16", T_INT16: "INT16",
    T_UINT32: "UINT32", T_INT32: "INT32", T_FLOAT32: "FLOAT32", T_BOOL: "BOOL",
    T_STRING: "STRING", T_ARRAY: "ARRAY", T_UINT64: "UINT64", T_INT64: "INT64",
    T_FLOAT64: "FLOAT64",
}

# ggml tensor types this module handles: id -> (name, block elements, block bytes)
GGML_F32, GGML_F16, GGML_Q8_0, GGML_F64, GGML_BF16 = 0, 1, 8, 28, 30
GGML_Q4_0, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K = 2, 12, 13, 14
GGML_TYPES = dict(quants.TYPES)
# dtype name (lower case) -> ggml type id
DTYPE_IDS = dict(quants.NAME_TO_ID)


def align_up(n, a):
    return (n + a - 1) // a * a


class WeightArray(np.ndarray):
    """A decoded tensor that remembers its GGUF type (ggml_type) and tensor name (gguf_name),
    which the reference's int8 and bf16 activation modes read (qwen35_ref.linear); views of it
    (one expert's slice) keep both."""

    def __array_finalize__(self, obj):
        self.ggml_type = getattr(obj, "ggml_type", None)
        self.gguf_name = getattr(obj, "gguf_name", None)


# --------------------------------------------------------------------------
# scalar conversions

def bf16_bits_to_f32(bits):
    """uint16 array of bf16 bit patterns -> float32 (f32_bits = bf16 << 16)."""
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16_bits(x):
    """float array -> uint16 bf16 bit patterns, round to nearest even (NaN kept NaN)."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)  # keep it a quiet NaN
    return rounded


def round_to_dtype(x, dtype):
    """The float64 values a tensor of `dtype` would hold after storing x."""
    x = np.asarray(x, dtype=np.float64)
    if dtype == "f32":
        return x.astype(np.float32).astype(np.float64)
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float64)
    if dtype == "bf16":
        return bf16_bits_to_f32(f32_to_bf16_bits(x)).astype(np.float64)
    if dtype == "f64":
        return x.copy()
    if dtype in DTYPE_IDS:
        return quants.dequantize(quants.quantize(x, dtype), dtype).astype(np.float64).reshape(x.shape)
    raise ValueError("unknown dtype %r" % dtype)


# --------------------------------------------------------------------------
# reader

class GGUFError(ValueError):
    pass


class TensorInfo:
    """One tensor-info record: name, ne (ggml order), ggml type, data offset."""

    def __init__(self, name, ne, ggml_type, offset):
        self.name = name
        self.ne = tuple(ne)
        self.ggml_type = ggml_type
        self.offset = offset  # relative to the data section

    @property
    def shape(self):
        """numpy shape = reversed ne."""
        return tuple(reversed(self.ne))

    @property
    def n_elements(self):
        n = 1
        for d in self.ne:
            n *= d
        return n

    @property
    def n_bytes(self):
        if self.ggml_type not in GGML_TYPES:
            raise GGUFError("tensor %s: unsupported ggml type %d" % (self.name, self.ggml_type))
        _, blk, bsz = GGML_TYPES[self.ggml_type]
        if self.ne and self.ne[0] % blk:
            raise GGUFError("tensor %s: ne[0]=%d not a multiple of block %d" % (self.name, self.ne[0], blk))
        return self.n_elements // blk * bsz

    @property
    def type_name(self):
        return GGML_TYPES.get(self.ggml_type, ("type%d" % self.ggml_type,))[0]

    def __repr__(self):
        return "TensorInfo(%r, ne=%r, %s, off=%d)" % (self.name, self.ne, self.type_name, self.offset)


class _Cursor:
    """Bounds-checked little-endian cursor over a bytes-like object."""

    def __init__(self, buf):
        self.buf = buf
        self.pos = 0

    def take(self, n):
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError("truncated file: need %d bytes at offset %d (size %d)" % (n, self.pos, len(self.buf)))
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, vtype):
        fmt = _SCALAR_FMT[vtype]
        v = struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]
        return bool(v) if vtype == T_BOOL else v

    def u32(self):
        return self.scalar(T_UINT32)

    def u64(self):
        return self.scalar(T_UINT64)

    def string(self):
        n = self.u64()
        return bytes(self.take(n)).decode("utf-8")

    def value(self, vtype):
        if vtype == T_STRING:
            return self.string()
        if vtype == T_ARRAY:
            etype = self.u32()
            count = self.u64()
            if etype in _SCALAR_NP:
                size = np.dtype(_SCALAR_NP[etype]).itemsize
                raw = self.take(count * size)
                arr = np.frombuffer(raw, dtype=_SCALAR_NP[etype], count=count)
                if etype == T_BOOL:
                    return [bool(v) for v in arr]
                if etype in (T_FLOAT32, T_FLOAT64):
                    return [float(v) for v in arr]
                return [int(v) for v in arr]
            if etype in (T_STRING, T_ARRAY):
                return [self.value(etype) for _ in range(count)]
            raise GGUFError("bad array element type %d" % etype)
        if vtype in _SCALAR_FMT:
            return self.scalar(vtype)
        raise GGUFError("bad metadata value type %d" % vtype)


class GGUFReader:
    """Parses a whole GGUF file into memory.

    kv:       dict key -> Python value (int, float, bool, str, or list of these)
    kv_types: dict key -> value type id (for arrays: (T_ARRAY, element type))
    tensors:  dict name -> TensorInfo, in file order
    """

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            self.buf = f.read()
        c = _Cursor(self.buf)
        magic = c.u32()
        if magic != GGUF_MAGIC:
            raise GGUFError("%s: not a GGUF file (magic 0x%08x)" % (path, magic))
        self.version = c.u32()
        if self.version not in (2, 3):
            raise GGUFError("%s: unsupported GGUF version %d" % (path, self.version))
        n_tensors = c.u64()
        n_kv = c.u64()
        self.kv = {}
        self.kv_types = {}
        for _ in range(n_kv):
            key = c.string()
            vtype = c.u32()
            if vtype == T_ARRAY:
                # peek the element type for kv_types, then parse
                save = c.pos
                etype = c.u32()
                c.pos = save
                self.kv_types[key] = (T_ARRAY, etype)
            else:
                self.kv_types[key] = vtype
            if key in self.kv:
                raise GGUFError("duplicate metadata key %r" % key)
            self.kv[key] = c.value(vtype)
        self.tensors = {}
        for _ in range(n_tensors):
            name = c.string()
            n_dims = c.u32()
            if n_dims > 4:
                raise GGUFError("tensor %s: n_dims %d > 4" % (name, n_dims))
            ne = [c.u64() for _ in range(n_dims)]
            gtype = c.u32()
            off = c.u64()
            if name in self.tensors:
                raise GGUFError("duplicate tensor %r" % name)
            self.tensors[name] = TensorInfo(name, ne, gtype, off)
        self.alignment = int(self.kv.get("general.alignment", GGUF_DEFAULT_ALIGNMENT))
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise GGUFError("bad general.alignment %d" % self.alignment)
        self.data_start = align_up(c.pos, self.alignment)
        for ti in self.tensors.values():
            if ti.offset % self.alignment:
                raise GGUFError("tensor %s: offset %d not aligned" % (ti.name, ti.offset))
            if ti.ggml_type in GGML_TYPES and self.data_start + ti.offset + ti.n_bytes > len(self.buf):
                raise GGUFError("tensor %s: data past end of file" % ti.name)

    def get(self, key, default=None):
        return self.kv.get(key, default)

    def raw(self, name):
        """The tensor's bytes."""
        ti = self.tensors[name]
        start = self.data_start + ti.offset
        return self.buf[start:start + ti.n_bytes]

    def tensor(self, name):
        """Tensor decoded to float64, numpy shape = reversed ne, as a WeightArray (its type
        in .ggml_type)."""
        ti = self.tensors[name]
        raw = self.raw(name)
        n = ti.n_elements
        t = ti.ggml_type
        if t == GGML_F64:
            a = np.frombuffer(raw, dtype="<f8", count=n).astype(np.float64)
        elif t in GGML_TYPES:
            a = quants.dequantize(raw, t, n).astype(np.float64)
        else:
            raise GGUFError("tensor %s: unsupported ggml type %s" % (name, ti.type_name))
        w = a.reshape(ti.shape).view(WeightArray)
        w.ggml_type = t
        w.gguf_name = name
        return w

    def tensor_f32(self, name):
        """Tensor dequantized to float32 (exactly the values an f32 engine holds), flat in
        memory order."""
        ti = self.tensors[name]
        if ti.ggml_type == GGML_F64 or ti.ggml_type not in GGML_TYPES:
            raise GGUFError("tensor %s: type %s has no float32 form" % (name, ti.type_name))
        return quants.dequantize(self.raw(name), ti.ggml_type, ti.n_elements)


# --------------------------------------------------------------------------
# writer

def _pack_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _pack_value(vtype, value):
    if vtype == T_STRING:
        return _pack_string(value)
    if vtype == T_BOOL:
        return struct.pack("<B", 1 if value else 0)
    if vtype in _SCALAR_FMT:
        return struct.pack(_SCALAR_FMT[vtype], value)
    raise ValueError("bad scalar value type %d" % vtype)


def _pack_array(etype, values):
    """values: a list; for etype T_ARRAY each element is (inner_etype, list)."""
    out = [struct.pack("<IQ", etype, len(values))]
    if etype == T_ARRAY:
        for inner_t, inner_v in values:
            out.append(_pack_array(inner_t, inner_v))
    elif etype in _SCALAR_NP and etype != T_BOOL:
        out.append(np.asarray(values, dtype=_SCALAR_NP[etype]).tobytes())
    else:
        for v in values:
            out.append(_pack_value(etype, v))
    return b"".join(out)


class GGUFWriter:
    """Collects metadata and tensors, then writes a GGUF v3 file.

    w = GGUFWriter(); w.add_u32("k", 1); w.add_tensor("t", arr, "f16"); w.write(path)
    Metadata and tensors are written in insertion order.
    """

    def __init__(self, alignment=GGUF_DEFAULT_ALIGNMENT):
        self.kv = []  # (key, vtype, value, etype)
        self.tensors = []  # (name, ne, ggml_type, bytes)
        self.alignment = alignment
        if alignment != GGUF_DEFAULT_ALIGNMENT:
            self.add_u32("general.alignment", alignment)

    def _add(self, key, vtype, value, etype=None):
        if any(k == key for k, _, _, _ in self.kv):
            raise ValueError("duplicate key %r" % key)
        self.kv.append((key, vtype, value, etype))

    def add(self, key, vtype, value):
        self._add(key, vtype, value)

    def add_u8(self, k, v): self._add(k, T_UINT8, v)
    def add_i8(self, k, v): self._add(k, T_INT8, v)
    def add_u16(self, k, v): self._add(k, T_UINT16, v)
    def add_i16(self, k, v): self._add(k, T_INT16, v)
    def add_u32(self, k, v): self._add(k, T_UINT32, v)
    def add_i32(self, k, v): self._add(k, T_INT32, v)
    def add_u64(self, k, v): self._add(k, T_UINT64, v)
    def add_i64(self, k, v): self._add(k, T_INT64, v)
    def add_f32(self, k, v): self._add(k, T_FLOAT32, v)
    def add_f64(self, k, v): self._add(k, T_FLOAT64, v)
    def add_bool(self, k, v): self._add(k, T_BOOL, bool(v))
    def add_string(self, k, v): self._add(k, T_STRING, v)

    def add_array(self, key, etype, values):
        """Array of etype; for etype == T_ARRAY pass a list of (inner_etype, list)."""
        self._add(key, T_ARRAY, list(values), etype)

    def add_tensor(self, name, array, dtype="f32"):
        """array: numpy-shaped (reversed ne); dtype: f32 | f16 | bf16 | f64 | q8_0 | q4_0 |
        q4_k | q5_k | q6_k (the quantized ones need ne[0] a multiple of the block)."""
        a = np.asarray(array, dtype=np.float64)
        if a.ndim < 1 or a.ndim > 4:
            raise ValueError("tensor %s: %d dims" % (name, a.ndim))
        if dtype not in DTYPE_IDS:
            raise ValueError("unknown dtype %r" % dtype)
        try:
            data = quants.quantize(a, dtype)
        except ValueError as e:
            raise ValueError("tensor %s: %s" % (name, e))
        self.add_raw_tensor(name, tuple(reversed(a.shape)), DTYPE_IDS[dtype], data)

    def add_raw_tensor(self, name, ne, ggml_type, data):
        """A tensor given as ggml ne (ne[0] fastest), type id and its raw bytes."""
        if any(n == name for n, _, _, _ in self.tensors):
            raise ValueError("duplicate tensor %r" % name)
        ne = tuple(int(v) for v in ne)
        if not 1 <= len(ne) <= 4:
            raise ValueError("tensor %s: %d dims" % (name, len(ne)))
        n = 1
        for v in ne:
            n *= v
        blk, bsz = GGML_TYPES[ggml_type][1:]
        if ne[0] % blk or len(data) != n // blk * bsz:
            raise ValueError("tensor %s: %d bytes do not fit ne %r of type %s" % (
                name, len(data), ne, GGML_TYPES[ggml_type][0]))
        self.tensors.append((name, ne, ggml_type, bytes(data)))

    def to_bytes(self):
        head = [struct.pack("<IIQQ", GGUF_MAGIC, 3, len(self.tensors), len(self.kv))]
        for key, vtype, value, etype in self.kv:
            head.append(_pack_string(key))
            head.append(struct.pack("<I", vtype))
            if vtype == T_ARRAY:
                head.append(_pack_array(etype, value))
            else:
                head.append(_pack_value(vtype, value))
        offsets = []
        off = 0
        for _, _, _, data in self.tensors:
            offsets.append(off)
            off = align_up(off + len(data), self.alignment)
        for (name, ne, gtype, _), o in zip(self.tensors, offsets):
            head.append(_pack_string(name))
            head.append(struct.pack("<I", len(ne)))
            head.append(struct.pack("<%dQ" % len(ne), *ne))
            head.append(struct.pack("<IQ", gtype, o))
        out = bytearray(b"".join(head))
        out += b"\0" * (align_up(len(out), self.alignment) - len(out))
        data_start = len(out)
        for (_, _, _, data), o in zip(self.tensors, offsets):
            out += b"\0" * (data_start + o - len(out))
            out += data
        out += b"\0" * (align_up(len(out) - data_start, self.alignment) - (len(out) - data_start))
        return bytes(out)

    def write(self, path):
        with open(path, "wb") as f:
            f.write(self.to_bytes())


# --------------------------------------------------------------------------

def _selftest():
    """Round-trip every value type and the three float tensor types."""
    import os
    import tempfile
    w = GGUFWriter(alignment=64)
    w.add_u8("a.u8", 200)
    w.add_i8("a.i8", -100)
    w.add_u16("a.u16", 60000)
    w.add_i16("a.i16", -30000)
    w.add_u32("a.u32", 4000000000)
    w.add_i32("a.i32", -2000000000)
    w.add_u64("a.u64", 2 ** 63 + 5)
    w.add_i64("a.i64", -(2 ** 62))
    w.add_f32("a.f32", 1.5)
    w.add_f64("a.f64", 1e-300)
    w.add_bool("a.bool", True)
    w.add_string("a.str", "h\u00e9llo \u0120")
    w.add_array("a.arr_str", T_STRING, ["x", "", "\u010a"])
    w.add_array("a.arr_bool", T_BOOL, [True, False, True])
    w.add_array("a.arr_i32", T_INT32, [1, -2, 3])
    w.add_array("a.arr_f32", T_FLOAT32, [0.5, -0.25])
    w.add_array("a.arr_arr", T_ARRAY, [(T_UINT8, [1, 2]), (T_STRING, ["q"])])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 7))
    for dt in ("f32", "f16", "bf16", "f64"):
        w.add_tensor("t." + dt, x, dt)
    w.add_tensor("t.vec", x[0, 0], "f32")
    fd, path = tempfile.mkstemp(suffix=".gguf")
    os.close(fd)
    try:
        w.write(path)
        r = GGUFReader(path)
    finally:
        os.unlink(path)
    assert r.alignment == 64 and r.data_start % 64 == 0
    exp = {"a.u8": 200, "a.i8": -100, "a.u16": 60000, "a.i16": -30000, "a.u32": 4000000000,
           "a.i32": -2000000000, "a.u64": 2 ** 63 + 5, "a.i64": -(2 ** 62), "a.f32": 1.5,
           "a.f64": 1e-300, "a.bool": True, "a.str": "h\u00e9llo \u0120",
           "a.arr_str": ["x", "", "\u010a"], "a.arr_bool": [True, False, True],
           "a.arr_i32": [1, -2, 3], "a.arr_f32": [0.5, -0.25], "a.arr_arr": [[1, 2], ["q"]]}
    for k, v in exp.items():
        assert r.kv[k] == v, (k, r.kv[k], v)
    assert r.kv_types["a.arr_str"] == (T_ARRAY, T_STRING)
    for dt in ("f32", "f16", "bf16", "f64"):
        ti = r.tensors["t." + dt]
        assert ti.ne == (7, 5, 3), ti.ne
        got = r.tensor("t." + dt)
        assert got.shape == (3, 5, 7)
        assert np.array_equal(got, round_to_dtype(x, dt)), dt
    assert r.tensor("t.vec").shape == (7,)
    # bf16 rounding: nearest even
    b = f32_to_bf16_bits(np.array([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -2.0]))
    assert list(b) == [0x3F80, 0x3F82, 0xC000], [hex(v) for v in b]
    # quantized tensors: stored as raw blocks, read back as their dequantized values
    w = GGUFWriter()
    y = rng.standard_normal((2, 3, 512))
    raws = {}
    for dt in ("q8_0", "q4_0", "q4_k", "q5_k", "q6_k"):
        w.add_tensor("q." + dt, y, dt)
        raws[dt] = quants.quantize(y, dt)
    fd, path = tempfile.mkstemp(suffix=".gguf")
    os.close(fd)
    try:
        w.write(path)
        r = GGUFReader(path)
    finally:
        os.unlink(path)
    for dt in ("q8_0", "q4_0", "q4_k", "q5_k", "q6_k"):
        ti = r.tensors["q." + dt]
        assert ti.ne == (512, 3, 2) and ti.type_name == dt.upper(), ti
        assert r.raw("q." + dt) == raws[dt], dt
        got = r.tensor("q." + dt)
        assert got.shape == (2, 3, 512)
        assert np.array_equal(got, round_to_dtype(y, dt)), dt
        assert np.array_equal(r.tensor_f32("q." + dt), got.reshape(-1).astype(np.float32)), dt
    return True


if __name__ == "__main__":
    _selftest()
    print("gguf_io self-test ok")
