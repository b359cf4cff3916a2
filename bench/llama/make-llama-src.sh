#!/usr/bin/env bash
# Make bench/llama/llama-cpp-src.tar.xz: llama.cpp's sources as vendored in the PyPI sdist of
# llama-cpp-python 0.3.36 (llama.cpp commit 0c1e570), pruned to what a CPU-only build of the
# `llama-bench` target needs (about 3.5 MB instead of the sdist's 76 MB). Needs network (PyPI).
#   bash bench/llama/make-llama-src.sh          # -> llama-cpp-src.tar.xz (CPU backend only)
#   CUDA=1 bash bench/llama/make-llama-src.sh   # -> llama-cpp-cuda-src.tar.xz (ggml-cuda kept too)
# What is removed: docs, models (test vocabularies), tests, examples, pocs, benches, media, the
# Python conversion scripts and gguf-py, the web UI and server, and every ggml backend but
# ggml-cpu. Nothing is edited: the CMake files are llama.cpp's own, and every directory they add
# with the options in build-llama-bench.sh is kept (vendor/, tools/* other than ui and server).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
VER=0.3.36
SHA=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
python3 - "$T" "$VER" <<'EOF'
import json, sys, urllib.parse, urllib.request
t, ver = sys.argv[1], sys.argv[2]
meta = "https://pypi.org/pypi/llama-cpp-python/json"
d = json.load(urllib.request.urlopen(meta))
u = [x for x in d["releases"][ver] if x["packagetype"] == "sdist"][0]
url = urllib.parse.urljoin(meta, u["url"])
print("fetching", url, u["size"], "bytes", file=sys.stderr)
with urllib.request.urlopen(url) as r, open(f"{t}/sdist.tar.gz", "wb") as f:
    while b := r.read(1 << 20):
        f.write(b)
EOF
echo "$SHA  $T/sdist.tar.gz" | sha256sum -c -
tar xzf "$T/sdist.tar.gz" -C "$T"
L="$T/llama_cpp_python-$VER/vendor/llama.cpp"
COMMIT=$(git -C "$L" rev-parse HEAD 2>/dev/null || echo 0c1e57098bba43ac29e6e3b677cdceebdd22334f)
mkdir -p "$T/out"
cp -a "$L" "$T/out/llama.cpp"
cd "$T/out/llama.cpp"
rm -rf .git .gitmodules .github .devops .gemini .pi docs models tests examples pocs benches media \
  conversion gguf-py scripts skills grammars requirements ci licenses ./*.py tools/ui tools/server
KEEP="ggml/src/ggml-cpu/"
[ "${CUDA:-0}" = 1 ] && KEEP="$KEEP ggml/src/ggml-cuda/"
for d in ggml/src/ggml-*/; do case " $KEEP " in *" $d "*) ;; *) rm -rf "$d" ;; esac; done
echo "llama.cpp commit $COMMIT, vendor/llama.cpp of the PyPI sdist llama_cpp_python-$VER.tar.gz (sha256 $SHA), pruned by tarfa's bench/llama/make-llama-src.sh" > TARFA-SOURCE.txt
cd "$T/out"
NAME=llama-cpp-src.tar.xz
[ "${CUDA:-0}" = 1 ] && NAME=llama-cpp-cuda-src.tar.xz
tar -cf - --sort=name --owner=0 --group=0 --numeric-owner --mtime=2026-10-01 llama.cpp | xz -9 -T0 > "$HERE/$NAME"
ls -l "$HERE/$NAME"
sha256sum "$HERE/$NAME"
