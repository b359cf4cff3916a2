#!/usr/bin/env python3
"""An independent JNF v1 reader, written from spec/JNF_V1.md alone (not from the Rust code).

    python3 tests/jnf_reader.py PATH...     # a .jnf file or a model directory (with manifest.json)

Prints a summary per path; exits 1 on any violation of the spec, 2 when it could not run. Checks
the header page, footer, index (region records, expert records, string table), every MUST it can
check from the bytes (alignment, bounds, placement, zero padding and reserved bytes, dtype length
rule, roles, provenance, canonical strings), every hash (SHA-256 with hashlib; BLAKE3 with the
`blake3` PyPI package when it is importable, otherwise SHA-256 only, and it says so), the expert
digests and root digests of §5.4, and a model directory's manifest.json (§8.1: its digest over
canonical JSON -- RFC 8785 JCS, integers kept exact, §8.1.2 -- its rules, every listed file's size
and root digests, no unlisted file).

Standard library only, plus the optional `blake3` package. `--json` prints one JSON document.
`--digest` prints the §8.1.2 digest of each JSON text on stdin (one per line); `--canonical
FILE...` writes the canonical bytes of each JSON file's content (top-level `digest` left out).
"""

import hashlib
import json
import math
import os
import re
import struct
import sys

try:
    import blake3 as _blake3

    def b3(data):
        return _blake3.blake3(data).digest()

    HAVE_BLAKE3 = True
except ImportError:  # SHA-256 only
    b3 = None
    HAVE_BLAKE3 = False

ALIGN = 4096
MAGIC = b"\x89JNF\r\n\x1a\n"
FOOTER_MAGIC = b"\x89JNFEND\n"
FOOTER_LEN = 160
REGION_LEN = 288
EXPERT_LEN = 96
NONE = 0xFFFFFFFF
U64 = (1 << 64) - 1
MAX_INDEX_LEN = 1 << 30
MAX_REGIONS = 1 << 22
MAX_STRING_LEN = 4096
MAX_EXPERT_REGIONS = 8
MAX_RANK = 8
MAX_MANIFEST_LEN = 512 << 20
LOCK_NAME = ".tarfa-convert.lock"

# §4: code -> (name, block elems, block bytes)
DTYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
    0x10000: ("BOOL", 1, 1), 0x10001: ("U8", 1, 1), 0x10002: ("U16", 1, 2),
    0x10003: ("U32", 1, 4), 0x10004: ("U64", 1, 8), 0x10005: ("F8_E4M3", 1, 1),
    0x10006: ("F8_E5M2", 1, 1), 0x10007: ("F8_E8M0", 1, 1), 0x10008: ("F8_E4M3FNUZ", 1, 1),
    0x10009: ("F8_E5M2FNUZ", 1, 1), 0x1000A: ("F4", 2, 1), 0x1000B: ("F6_E2M3", 4, 3),
    0x1000C: ("F6_E3M2", 4, 3), 0x1000D: ("C64", 1, 8),
}
ROLES = ["tensor", "gate_up", "gate", "up", "down", "gate_up_bias", "gate_bias", "up_bias",
         "down_bias"]


class Violation(Exception):
    """A breach of the spec: `kind` is the spec's Violation name."""

    def __init__(self, kind, detail):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


def align_up(v):
    r = (v + ALIGN - 1) // ALIGN * ALIGN
    if r > U64:
        raise OverflowError
    return r


def byte_len(code, shape):
    """§4 length rule; None when it is breached (row not whole blocks, or u64 overflow)."""
    _, be, bb = DTYPES[code]
    row = shape[-1] if shape else 1
    if row % be:
        return None
    elems = 1
    for d in shape:  # each partial product d0 x ... x dk must fit in u64 (§4)
        elems *= d
        if elems > U64:
            return None
    n = elems // be * bb
    return n if n <= U64 else None


def is_source_path(p):
    """§5.1, the source-path rule, for `src_file` and the manifest's source paths alike: not
    empty, no NUL, no leading '/' or '\\'; split at '/' and '\\', no component empty, '.' or
    '..', or holding ':'."""
    if not isinstance(p, str) or not p or "\0" in p or p[0] in "/\\":
        return False
    return not any(c in ("", ".", "..") or ":" in c for c in re.split(r"[/\\]", p))


def u32(b, o):
    return struct.unpack_from("<I", b, o)[0]


def u64(b, o):
    return struct.unpack_from("<Q", b, o)[0]


def check_hash(kind, what, data, sha, blake):
    """BLAKE3 first (when available), then SHA-256, as §9.3 orders them."""
    if HAVE_BLAKE3 and b3(data) != blake:
        raise Violation(kind, f"{what}: blake3 mismatch")
    if sha is not None and hashlib.sha256(data).digest() != sha:
        raise Violation(kind, f"{what}: sha256 mismatch")


class JnfFile:
    """Reads and checks one JNF file: structure on open, every data byte in verify_data."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat_is_reg(st.st_mode):
                raise Violation("NotRegular", f"{path} is not a regular file")
            self.size = st.st_size
            if self.size < ALIGN:
                raise Violation("FileTooShort", f"{self.size} bytes")
            self.header = f.read(ALIGN)
            self.check_header()
            if self.size % ALIGN or self.size < ALIGN + FOOTER_LEN:
                raise Violation("NoFooter", f"length {self.size} is not a multiple of 4096")
            f.seek(self.size - FOOTER_LEN)
            self.footer = f.read(FOOTER_LEN)
            self.check_footer()
            f.seek(self.index_offset)
            self.index = f.read(self.index_len)
            self.check_index()

    # §2.1
    def check_header(self):
        h = self.header
        if h[:8] != MAGIC:
            raise Violation("BadMagic", repr(h[:8]))
        self.major, self.minor = struct.unpack_from("<HH", h, 8)
        if self.major != 1:
            raise Violation("UnsupportedMajor", str(self.major))
        if HAVE_BLAKE3 and b3(h[:48]) != h[48:80]:
            raise Violation("HeaderHashMismatch", "header_blake3")
        self.required_flags, self.optional_flags = struct.unpack_from("<QQ", h, 16)
        if self.required_flags:
            raise Violation("UnknownRequiredFlags", hex(self.required_flags))
        reserved = [(12, 16), (44, 48)] + ([(80, ALIGN)] if self.minor == 0 else [])
        for a, b in reserved:
            if any(h[a:b]):
                raise Violation("NonZeroReserved", f"header bytes {a}..{b}")
        self.layer_first, self.layer_count, self.epl = struct.unpack_from("<III", h, 32)
        if self.layer_count * self.epl > MAX_REGIONS:
            raise Violation("LimitExceeded", "grid over 2^22")
        if self.layer_count == 0 and (self.layer_first or self.epl):
            raise Violation("EmptyFileLayerFields", "a file of no layers has layer_first 0, experts 0")
        if self.layer_first + self.layer_count >= NONE:
            raise Violation("LimitExceeded", "layer range reaches NONE")

    # §2.2
    def check_footer(self):
        ft = self.footer
        if ft[:8] != FOOTER_MAGIC:
            raise Violation("NoFooter", "no footer magic")
        if HAVE_BLAKE3 and b3(self.header + ft[:128]) != ft[128:160]:
            raise Violation("FooterHashMismatch", "footer_blake3")
        if any(ft[104:128]):
            raise Violation("NonZeroReserved", "footer bytes 104..128")
        file_len, self.index_offset, self.index_len = struct.unpack_from("<QQQ", ft, 8)
        self.R, self.E = struct.unpack_from("<II", ft, 32)
        if file_len != self.size:
            raise Violation("FileLenMismatch", f"footer says {file_len}, file is {self.size}")
        if self.index_offset % ALIGN:
            raise Violation("Misaligned", f"index_offset {self.index_offset}")
        try:
            end = align_up(self.index_offset + self.index_len + FOOTER_LEN)
        except OverflowError:
            end = None
        if self.index_offset < ALIGN or end != self.size:
            raise Violation("IndexPlacement", "index does not end the file")
        if self.index_len > MAX_INDEX_LEN:
            raise Violation("LimitExceeded", "index_len")
        if self.R > MAX_REGIONS:
            raise Violation("LimitExceeded", "region_count")
        if REGION_LEN * self.R + EXPERT_LEN * self.E > self.index_len:
            raise Violation("LimitExceeded", "records do not fit in the index")
        if self.E != self.layer_count * self.epl:
            raise Violation("BadExpert", f"expert_count {self.E} is not the grid")

    # §5
    def check_index(self):
        ix = self.index
        check_hash("IndexHashMismatch", "index", ix, self.footer[72:104], self.footer[40:72])
        table = ix[REGION_LEN * self.R + EXPERT_LEN * self.E:]
        seen = {}  # string -> (offset, len), for the canonical form of §5.3
        cursor = 0

        def take(ref, ri, field):
            nonlocal cursor
            off, ln = ref
            if off + ln > len(table) or ln > MAX_STRING_LEN:
                raise Violation("StringOutOfBounds", f"region {ri} {field}")
            try:
                s = table[off:off + ln].decode("utf-8")
            except UnicodeDecodeError:
                raise Violation("BadUtf8", f"region {ri} {field}")
            if ln == 0:
                if off:
                    raise Violation("NonCanonicalStrings", f"region {ri} {field}: empty not (0,0)")
                return s
            if s in seen:
                if seen[s] != ref:
                    raise Violation("NonCanonicalStrings", f"region {ri} {field}: repeat")
                return s
            if off != cursor:
                raise Violation("NonCanonicalStrings", f"region {ri} {field}: not at {cursor}")
            cursor += ln
            seen[s] = ref
            return s

        self.regions = []
        names = set()
        expected = ALIGN
        for i in range(self.R):
            b = ix[i * REGION_LEN:(i + 1) * REGION_LEN]
            r = {
                "offset": u64(b, 0), "length": u64(b, 8), "dtype": u32(b, 16), "ndim": u32(b, 20),
                "shape": list(struct.unpack_from("<8Q", b, 24)), "layer": u32(b, 88),
                "expert": u32(b, 92), "role": u32(b, 96),
                "src_dtype": u32(b, 124), "src_ndim": u32(b, 128), "src_begin": u64(b, 136),
                "src_end": u64(b, 144), "src_shape": list(struct.unpack_from("<8Q", b, 152)),
                "sha256": b[216:248], "blake3": b[248:280],
            }
            if any(b[132:136]) or any(b[280:288]):
                raise Violation("NonZeroReserved", f"region record {i}")
            name = take(struct.unpack_from("<II", b, 100), i, "name")
            if name == "" or "\0" in name:
                raise Violation("BadName", f"region {i}")
            if name in names:
                raise Violation("DuplicateName", name)
            names.add(name)
            r["name"] = name
            # §3 placement
            if r["offset"] % ALIGN:
                raise Violation("Misaligned", f"region {i} '{name}' offset")
            try:
                end = align_up(r["offset"] + r["length"])
            except OverflowError:
                end = None
            if r["offset"] > self.index_offset or end is None or end > self.index_offset:
                raise Violation("RegionOutOfFile", f"region {i} '{name}'")
            if r["offset"] != expected:
                raise Violation("RegionPlacement", f"region {i} '{name}' at {r['offset']}, "
                                f"expected {expected}")
            expected = end
            # §4 type
            if r["dtype"] not in DTYPES:
                raise Violation("UnknownDtype", f"region {i} code {r['dtype']}")
            if r["ndim"] > MAX_RANK or any(r["shape"][r["ndim"]:]):
                raise Violation("BadShape", f"region {i} '{name}' rank")
            shape = r["shape"][:r["ndim"]]
            if byte_len(r["dtype"], shape) != r["length"]:
                raise Violation("BadShape", f"region {i} '{name}' {shape} vs {r['length']} bytes")
            # §5.1 role
            role, layer, expert = r["role"], r["layer"], r["expert"]
            if role >= len(ROLES):
                raise Violation("BadRegionRole", f"region {i} role {role}")
            if layer != NONE and not (self.layer_first <= layer
                                      < self.layer_first + self.layer_count):
                raise Violation("BadRegionRole", f"region {i} layer {layer} not in file")
            if role == 0 and expert != NONE:
                raise Violation("BadRegionRole", f"region {i}: a plain tensor names an expert")
            if role != 0 and (layer == NONE or expert >= self.epl):
                raise Violation("BadRegionRole", f"region {i}: projection without layer/expert")
            src_file = take(struct.unpack_from("<II", b, 108), i, "source file")
            src_tensor = take(struct.unpack_from("<II", b, 116), i, "source tensor")
            self.check_provenance(r, i, src_file, src_tensor)
            r["src_file"], r["src_tensor"] = src_file, src_tensor
            self.regions.append(r)
        if expected != self.index_offset:
            raise Violation("IndexPlacement", f"index at {self.index_offset}, expected {expected}")
        if cursor != len(table):
            raise Violation("NonCanonicalStrings", "unreferenced string-table bytes")

        # §5.2 expert records
        self.experts = []
        owned = [False] * self.R
        at = REGION_LEN * self.R
        for k in range(self.E):
            b = ix[at + k * EXPERT_LEN:at + (k + 1) * EXPERT_LEN]
            e = {"layer": u32(b, 0), "expert": u32(b, 4), "first": u32(b, 8),
                 "count": u32(b, 12), "extent_offset": u64(b, 16), "extent_len": u64(b, 24),
                 "sha256": b[32:64], "blake3": b[64:96]}
            self.check_expert(e, k, owned)
            if self.experts and e["first"] <= self.experts[-1]["first"]:
                raise Violation("BadExpert", f"record {k}: extents not in grid order")
            self.experts.append(e)
        for i, r in enumerate(self.regions):
            if r["role"] != 0 and not owned[i]:
                raise Violation("BadRegionRole", f"region {i}: projection no expert lists")

    def check_provenance(self, r, i, src_file, src_tensor):
        def bad(d):
            raise Violation("BadProvenance", f"region {i} '{r['name']}': {d}")

        if r["src_dtype"] != r["dtype"]:
            bad("src_dtype differs")
        if r["src_ndim"] > MAX_RANK or any(r["src_shape"][r["src_ndim"]:]):
            bad("src rank")
        if src_file == "":
            if src_tensor or r["src_begin"] or r["src_end"] or r["src_ndim"]:
                bad("no-source form with source fields")
            return
        if not is_source_path(src_file):
            bad(f"src_file {src_file!r} is not a plain relative path")
        if not src_tensor:
            bad("empty src_tensor")
        if r["src_end"] < r["src_begin"] or r["src_end"] - r["src_begin"] != r["length"]:
            bad("source range length")
        n = byte_len(r["dtype"], r["src_shape"][:r["src_ndim"]])
        if n is None or n < r["length"]:
            bad("source shape cannot hold the region")

    def check_expert(self, e, k, owned):
        def bad(d):
            raise Violation("BadExpert", f"record {k} (layer {e['layer']}, expert "
                            f"{e['expert']}): {d}")

        epl = max(self.epl, 1)
        if (e["layer"], e["expert"]) != (self.layer_first + k // epl, k % epl):
            bad("not its grid position")
        if not 1 <= e["count"] <= MAX_EXPERT_REGIONS:
            bad("region_count")
        first, end = e["first"], e["first"] + e["count"]
        if end > self.R:
            bad("regions past R")
        prev, has = 0, set()
        for ri in range(first, end):
            r = self.regions[ri]
            if owned[ri]:
                bad(f"region {ri} shared")
            owned[ri] = True
            if (r["layer"], r["expert"]) != (e["layer"], e["expert"]) or r["role"] == 0:
                bad(f"region {ri} is not a projection of this expert")
            if r["role"] <= prev:
                bad("roles not strictly increasing")
            prev = r["role"]
            has.add(r["role"])
        if 1 in has and (2 in has or 3 in has):
            bad("gate_up beside gate/up")
        if 5 in has and (6 in has or 7 in has):
            bad("gate_up_bias beside gate_bias/up_bias")
        if not has & {1, 2, 3, 4}:
            bad("biases only")
        regs = self.regions[first:end]
        ext_end = align_up(regs[-1]["offset"] + regs[-1]["length"])
        if e["extent_offset"] != regs[0]["offset"] or e["extent_len"] != ext_end - regs[0]["offset"]:
            bad("extent fields")
        d = expert_digest(regs)
        if HAVE_BLAKE3 and d["blake3"] != e["blake3"]:
            raise Violation("ExpertDigestMismatch", f"layer {e['layer']} expert {e['expert']} blake3")
        if d["sha256"] != e["sha256"]:
            raise Violation("ExpertDigestMismatch", f"layer {e['layer']} expert {e['expert']} sha256")

    def verify_data(self):
        """§5.4 region hashes and §3 zero padding: reads every byte."""
        with open(self.path, "rb") as f:
            for i, r in enumerate(self.regions):
                f.seek(r["offset"])
                data = f.read(r["length"])
                check_hash("RegionHashMismatch", f"region {i} '{r['name']}'", data,
                           r["sha256"], r["blake3"])
                pad = f.read(align_up(r["offset"] + r["length"]) - r["offset"] - r["length"])
                if any(pad):
                    raise Violation("NonZeroPadding", f"after region {i} '{r['name']}'")
            f.seek(self.index_offset + self.index_len)
            pad = f.read(self.size - FOOTER_LEN - self.index_offset - self.index_len)
            if any(pad):
                raise Violation("NonZeroPadding", "after the index")

    def root_digest(self):
        data = self.header + self.footer[:128]
        return {"sha256": hashlib.sha256(data).hexdigest(),
                "blake3": self.footer[128:160].hex()}


def expert_digest(regs):
    """§5.4: H("JNF1-expert\\0" || (role u32, length u64, H(region)) per region)."""
    out = {}
    for algo in ("sha256", "blake3"):
        if algo == "blake3" and not HAVE_BLAKE3:
            continue
        buf = b"JNF1-expert\0" + b"".join(
            struct.pack("<IQ", r["role"], r["length"]) + r[algo] for r in regs)
        out[algo] = hashlib.sha256(buf).digest() if algo == "sha256" else b3(buf)
    return out


def stat_is_reg(mode):
    import stat
    return stat.S_ISREG(mode)


# ---- §8.1 manifest -------------------------------------------------------------------------

class _NegZero(float):
    pass


def _parse_int(s):
    # §8.1.2: integers in [-2^63, 2^64) stay exact; `-0` and integers past that range are f64s.
    if s == "-0":
        return -0.0
    v = int(s)
    if -(1 << 63) <= v <= U64:
        return v
    return _parse_float(s)


def _parse_float(s):
    v = float(s)
    if not math.isfinite(v):
        raise ValueError(f"number {s} is out of range")
    return v


def _no_constants(s):
    raise ValueError(f"{s} is not JSON")


def _pairs(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"duplicate key {k!r}")
        d[k] = v
    return d


def canon_number(v):
    """A finite f64 as ECMAScript's Number.prototype.toString writes it (RFC 8785 3.2.2.3, §8.1.2):
    the shortest digits s (k of them) that read back as v, v = 0.s x 10^n; then `s` and n-k zeros
    when k <= n <= 21, `ss.ss` when 0 < n <= 21, `0.000s` when -6 < n <= 0, else `s.sse+X` or
    `se-X` (`e`, a sign, no leading zeros). Both zeros are `0`."""
    if v == 0:
        return "0"
    sign = "-" if v < 0 else ""
    # repr gives the shortest round-trip digits (the closest, ties to even); normalise them
    mant, _, exp = repr(abs(v)).partition("e")
    ip, _, fp = mant.partition(".")
    allds = ip + fp
    lead = len(allds) - len(allds.lstrip("0"))
    s = allds.lstrip("0").rstrip("0")
    n = len(ip) + int(exp or 0) - lead
    k = len(s)
    if k <= n <= 21:
        return sign + s + "0" * (n - k)
    if 0 < n <= 21:
        return sign + s[:n] + "." + s[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + s
    e = n - 1
    es = f"e+{e}" if e >= 0 else f"e-{-e}"
    if k == 1:
        return f"{sign}{s}{es}"
    return f"{sign}{s[0]}.{s[1:]}{es}"


def canon_string(v):
    """A string as RFC 8785 3.2.2.2 (ECMAScript JSON.stringify) writes it."""
    out = ['"']
    for c in v:
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif ord(c) < 0x20:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
            "\r": "\\r"}


def canon(v):
    """§8.1.2 canonical JSON: RFC 8785 (JCS) -- members sorted by the UTF-16 code units of their
    keys, no whitespace, ECMAScript strings and numbers -- except that integers stay exact."""
    if isinstance(v, dict):
        keys = sorted(v, key=lambda k: k.encode("utf-16-be"))
        return "{" + ",".join(canon_string(k) + ":" + canon(v[k]) for k in keys) + "}"
    if isinstance(v, list):
        return "[" + ",".join(canon(x) for x in v) + "]"
    if isinstance(v, str):
        return canon_string(v)
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "null"
    if isinstance(v, int):
        return str(v)
    return canon_number(v)


def manifest_digest(obj):
    content = {k: x for k, x in obj.items() if k != "digest"}
    try:
        text = canon(content).encode("utf-8")
    except UnicodeEncodeError:  # an escaped lone surrogate
        raise Violation("Manifest", "a string holds a lone surrogate")
    return hashlib.sha256(text).hexdigest()


def parse_json(text):
    """JSON as §8.1.2 reads it: duplicate keys refused, numbers typed as serde_json types them."""
    return json.loads(text, object_pairs_hook=_pairs, parse_int=_parse_int,
                      parse_float=_parse_float, parse_constant=_no_constants)


HEX64 = re.compile(r"[0-9a-f]{64}")


def check_manifest(dirpath):
    """Returns the parsed manifest; raises Violation("Manifest", ...) on any breach of §8.1."""
    path = os.path.join(dirpath, "manifest.json")

    def bad(d):
        raise Violation("Manifest", d)

    st = os.stat(path)
    if not stat_is_reg(st.st_mode) or st.st_size > MAX_MANIFEST_LEN:
        bad("not a regular file of at most 512 MiB")
    with open(path, "rb") as f:
        raw = f.read(MAX_MANIFEST_LEN + 1)
    try:
        m = parse_json(raw.decode("utf-8"))
    except ValueError as e:
        bad(f"not valid JSON: {e}")
    if not isinstance(m, dict) or not isinstance(m.get("digest"), str):
        bad("no digest")
    if m["digest"] != manifest_digest(m):
        bad(f"digest mismatch: recorded {m['digest']}, content {manifest_digest(m)}")
    if m.get("format") != "jnf-model":
        bad("format")
    fv = m.get("format_version")
    if not (isinstance(fv, list) and len(fv) == 2 and fv[0] == 1):
        bad("format_version")
    arch = m.get("architecture", {})
    if arch.get("source_format") not in ("safetensors", "gguf", "synthetic"):
        bad("source_format")
    for s in m.get("conversion", {}).get("sources", []):
        p = s.get("path", "")
        if not is_source_path(p):
            bad(f"source path {p!r} is not a plain relative path")
        for h in ("sha256", "header_sha256"):
            if s.get(h) is not None and not HEX64.fullmatch(s[h]):
                bad(f"source {p!r} {h}")
    source_paths = [s.get("path") for s in m.get("conversion", {}).get("sources", [])]
    if len(set(source_paths)) != len(source_paths):
        bad("a source is listed twice")
    names, file_layers, trunks = set(), set(), 0
    for f in m.get("files", []):
        p = f["path"]
        if (not p or any(c in p for c in "/\\\0") or p.startswith(".")
                or p == "manifest.json" or p in names):
            bad(f"file name {p!r}")
        names.add(p)
        if not HEX64.fullmatch(f["sha256"]) or not HEX64.fullmatch(f["blake3"]):
            bad(f"file {p!r} hashes")
        reads = f.get("sources")
        if reads is not None:
            if f["kind"] == "aux":
                bad(f"file {p!r}: an aux file has no sources")
            seen = set()
            for r in reads:
                if r["path"] not in source_paths or r["path"] in seen:
                    bad(f"file {p!r}: source {r['path']!r} unlisted or listed twice")
                seen.add(r["path"])
                if not HEX64.fullmatch(r["tensors_blake3"]):
                    bad(f"file {p!r}: source {r['path']!r} tensors_blake3")
        kind, layer = f["kind"], f.get("layer")
        if kind == "layer" and layer is not None and p == f"layer-{layer:05d}.jnf":
            file_layers.add(layer)
        elif kind == "trunk" and layer is None and p == "trunk.jnf":
            trunks += 1
        elif kind == "aux" and layer is None and not p.endswith(".jnf"):
            pass
        else:
            bad(f"file {p!r}: kind {kind} layer {layer}")
    if trunks > 1:
        bad("more than one trunk")
    layers = m.get("layers", [])
    if any(a >= b for a, b in zip(layers, layers[1:])) or set(layers) != file_layers:
        bad("layers")
    if any(l >= arch.get("num_layers", 0) for l in layers):
        bad("layer not below num_layers")
    aux = {f["path"] for f in m["files"] if f["kind"] == "aux"}
    if any(t not in aux for t in m.get("tokenizer", [])):
        bad("tokenizer file not an aux entry")
    return m


def identity(s):
    return (s.get("size"), s.get("mtime_ns"), s.get("ctime_ns"))


def check_generations(m):
    """§8.2: every file's record of a source file names the identity the conversion records
    (where it records none, the first file's): otherwise the model mixes two versions of it."""
    for s in m["conversion"]["sources"]:
        reads = [(f, r) for f in m["files"] for r in (f.get("sources") or [])
                 if r["path"] == s["path"]]
        ref = identity(s)
        if ref[1] is None and ref[2] is None:
            if not reads:
                continue
            ref = identity(reads[0][1])
        for f, r in reads:
            if identity(r) != ref:
                raise Violation("MixedSources", f"{f['path']}: source {s['path']!r} recorded "
                                f"as {identity(r)}, the conversion's is {ref}")


def check_dir(dirpath, out):
    m = check_manifest(dirpath)
    out["manifest_digest"] = m["digest"]
    check_generations(m)
    listed = {f["path"] for f in m["files"]}
    for name in sorted(os.listdir(dirpath)):
        if name not in listed and name not in ("manifest.json", LOCK_NAME):
            raise Violation("ExtraFile", name)
    files = []
    for f in m["files"]:
        p = os.path.join(dirpath, f["path"])
        if not os.path.isfile(p):
            raise Violation("MissingFile", f["path"])
        if os.path.getsize(p) != f["size"]:
            raise Violation("SizeMismatch", f["path"])
        if f["kind"] == "aux":
            with open(p, "rb") as fh:
                data = fh.read()
            check_hash("AuxHashMismatch", f["path"], data, bytes.fromhex(f["sha256"]),
                       bytes.fromhex(f["blake3"]))
            files.append({"path": f["path"], "kind": "aux"})
            continue
        s = check_jnf(p)
        if s["root_sha256"] != f["sha256"] or (HAVE_BLAKE3 and s["root_blake3"] != f["blake3"]):
            raise Violation("RootDigestMismatch", f["path"])
        if f.get("sources") is not None and HAVE_BLAKE3:
            recorded = {r["path"]: r["tensors_blake3"] for r in f["sources"]}
            if recorded != s["tensors_blake3"]:
                raise Violation("SourceRecordMismatch", f"{f['path']}: the source tensors the "
                                "manifest records are not the file's")
        want = (0, 0) if f["kind"] == "trunk" else (f["layer"], 1)
        if (s["layer_first"], s["layer_count"]) != want:
            raise Violation("Manifest", f"{f['path']}: header layers do not match the entry")
        files.append(s)
    out["files"] = files


def tensors_blake3(regions):
    """§8.1 files[].sources[].tensors_blake3: per source file, BLAKE3 of its regions' 32-byte
    BLAKE3s in index order (regions without a source left out)."""
    per = {}
    for r in regions:
        if r["src_file"]:
            per[r["src_file"]] = per.get(r["src_file"], b"") + bytes(r["blake3"])
    return {p: b3(b).hex() for p, b in per.items()} if HAVE_BLAKE3 else {}


def check_jnf(path):
    j = JnfFile(path)
    j.verify_data()
    root = j.root_digest()
    return {"path": os.path.basename(path), "layer_first": j.layer_first,
            "layer_count": j.layer_count, "experts_per_layer": j.epl, "regions": j.R,
            "experts": j.E, "root_sha256": root["sha256"], "root_blake3": root["blake3"],
            "tensors_blake3": tensors_blake3(j.regions)}


def main(argv):
    if argv[:1] == ["--digest"]:  # the §8.1.2 digest of each JSON text on stdin, one per line
        for line in sys.stdin:
            try:
                print(manifest_digest(parse_json(line)))
            except (ValueError, Violation) as e:
                print(f"refused: {e}")
        return 0
    if argv[:1] == ["--canonical"]:  # the §8.1.2 canonical bytes of each JSON file, no digest
        for p in argv[1:]:
            with open(p, "rb") as f:
                obj = parse_json(f.read().decode("utf-8"))
            if isinstance(obj, dict):
                obj = {k: x for k, x in obj.items() if k != "digest"}
            sys.stdout.buffer.write(canon(obj).encode("utf-8"))
        return 0
    as_json = "--json" in argv
    paths = [a for a in argv if a != "--json"]
    if not paths:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    if not HAVE_BLAKE3:
        print("note: the blake3 package is not importable: BLAKE3 hashes not checked, "
              "SHA-256 only", file=sys.stderr)
    results, failed = [], False
    for p in paths:
        out = {"path": p, "blake3_checked": HAVE_BLAKE3}
        try:
            if os.path.isdir(p):
                check_dir(p, out)
            else:
                out.update(check_jnf(p))
            out["ok"] = True
        except Violation as e:
            out.update(ok=False, violation=e.kind, detail=str(e))
            failed = True
        except (OSError, struct.error, KeyError, TypeError, AttributeError) as e:
            out.update(ok=False, violation="Unreadable", detail=f"{type(e).__name__}: {e}")
            failed = True
        results.append(out)
        if not as_json:
            if not out["ok"]:
                print(f"{p}: INVALID {out['detail']}")
            elif "files" in out:
                print(f"{p}: ok, manifest digest {out['manifest_digest']}")
                for s in out["files"]:
                    if s.get("kind") == "aux":
                        print(f"  {s['path']}: aux ok")
                    else:
                        print(f"  {s['path']}: ok, {s['regions']} regions, {s['experts']} experts,"
                              f" root sha256 {s['root_sha256']}")
            else:
                print(f"{p}: ok, layers {out['layer_first']}+{out['layer_count']}, "
                      f"{out['regions']} regions, {out['experts']} experts, "
                      f"root sha256 {out['root_sha256']} blake3 {out['root_blake3']}")
    if as_json:
        print(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
