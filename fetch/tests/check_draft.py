#!/usr/bin/env python3
"""Load a draft GGUF with the gguf PyPI package and hold it to its source.

usage: check_draft.py DRAFT SOURCE_PART... 

Every tensor of the draft must be in one of the source parts with the same type, shape and
bytes; the draft's key/values must be the first part's minus split.*, with equal values.
Prints one line `ok: N tensors, M key/values` or exits 1 naming the first difference.
"""
import sys

import numpy as np
from gguf import GGUFReader


def raw(field):
    return [np.asarray(p).tobytes() for p in field.parts[3:]] if field.parts else []


def main():
    draft = GGUFReader(sys.argv[1])
    parts = [GGUFReader(p) for p in sys.argv[2:]]
    source = {}
    for r in parts:
        for t in r.tensors:
            source[t.name] = t
    for t in draft.tensors:
        s = source.get(t.name)
        if s is None:
            sys.exit(f"draft tensor {t.name} is in no source part")
        if t.tensor_type != s.tensor_type or list(t.shape) != list(s.shape):
            sys.exit(f"{t.name}: type/shape {t.tensor_type}/{list(t.shape)} vs {s.tensor_type}/{list(s.shape)}")
        if np.asarray(t.data).tobytes() != np.asarray(s.data).tobytes():
            sys.exit(f"{t.name}: bytes differ")
    skip = ("GGUF.",)
    want = {k: raw(f) for k, f in parts[0].fields.items() if not k.startswith("split.") and not k.startswith(skip)}
    got = {k: raw(f) for k, f in draft.fields.items() if not k.startswith(skip)}
    if set(want) != set(got):
        sys.exit(f"key/values differ: missing {sorted(set(want) - set(got))}, extra {sorted(set(got) - set(want))}")
    for k in want:
        if want[k] != got[k]:
            sys.exit(f"key {k}: value differs")
    print(f"ok: {len(draft.tensors)} tensors, {len(got)} key/values")


if __name__ == "__main__":
    main()
