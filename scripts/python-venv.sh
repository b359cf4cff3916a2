# Sourced by scripts/test.sh (bash, set -euo pipefail): the tests' Python, in a venv.
# gguf-py cross-checks (gguf/tests/gguf_py_agreement.rs) need the format's own Python library;
# the second JNF reader (tests/jnf_reader.py, run by tests/python_reader.rs) checks BLAKE3 with
# the blake3 package; tarfa serve's client tests (tests/serve_openai.rs) use the openai package,
# and its chat page's test (tests/serve_page.rs) drives Chromium with selenium.
# They go into a venv of their own, never into the system's Python (Debian 12
# and Ubuntu 23.04 on refuse that: PEP 668, "externally-managed-environment"), and the venv's
# python3 comes first on PATH for the tests, which call python3. Debian's python3 makes a venv
# only with its python3-venv package, installed here as root.
TARFA_VENV_DIR=${TARFA_VENV:-$HOME/.cache/tarfa/venv}
if [ ! -x "$TARFA_VENV_DIR/bin/python3" ]; then
  if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y python3 python3-venv
    else
      echo "error: python3 with its venv module is needed (Debian/Ubuntu: apt-get install python3 python3-venv, as root)" >&2
      exit 2
    fi
  fi
  echo "== making the tests' Python venv: $TARFA_VENV_DIR"
  python3 -m venv "$TARFA_VENV_DIR"
fi
export PATH="$TARFA_VENV_DIR/bin:$PATH"
if ! python3 -c 'import gguf, numpy, blake3, openai, selenium' >/dev/null 2>&1; then
  python3 -m pip install --quiet --disable-pip-version-check gguf numpy blake3 openai selenium
fi

