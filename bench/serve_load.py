#!/usr/bin/env python3
"""Load an OpenAI-compatible completions server and record what it answered (issue 25).

    serve_load.py BASE_URL --concurrency C --requests R --max-tokens N [--prompt-tokens P]
                  [--vocab V] [--seed S] [--extra JSON] [--label L] [--out FILE.json]
                  [--compare FILE.json [--report-only]]

Sends R streamed `POST BASE_URL/v1/completions`, C in flight at once, each a prompt of P token
ids drawn from 1..min(1000, V-1) by a generator seeded with S: the same R prompts for any server
and any C, so request i is the same request in every run. The body is
`{"prompt": [ids], "max_tokens": N, "temperature": 0, "ignore_eos": true, "stream": true,
"stream_options": {"include_usage": true}}` plus --extra's fields: greedy, and exactly N tokens
whatever the model draws (llama-server samples unless told temperature 0; tarfa refuses a field
it does not take, so llama-server's own fields, e.g. `{"cache_prompt": false}`, go in --extra).

Per request: TTFT (from sending the request to the first chunk with non-empty text), the
completion time, the completion tokens (the usage chunk's, else the count of text chunks) and
the text. Aggregate tokens/s = the sum of completion tokens / the wall time from the first
request sent to the last one finished. One summary line on stdout; --out writes the JSON (every
request's prompt, text, times). --compare FILE.json: exit 1, naming the first request whose text
differs from FILE.json's request of the same index (--report-only: say so, exit 0); a failed
request or an unusable FILE.json exits 2.

Standard library only (http.client, threads): the GPU machine has no network and no `openai`.
"""

import argparse
import http.client
import json
import math
import random
import statistics
import sys
import threading
import time
import urllib.parse


def die(msg: str) -> None:
    """A failed load or an unusable file: exit 2, apart from a texts-differ exit 1."""
    print(f"serve_load: {msg}", file=sys.stderr)
    sys.exit(2)


def prompts(count: int, length: int, seed: int, vocab: int) -> list[list[int]]:
    """The fixed prompts: request i gets the i-th list whatever the concurrency."""
    rng = random.Random(seed)
    top = min(1000, vocab - 1)
    return [[rng.randint(1, top) for _ in range(length)] for _ in range(count)]


def one_request(url: urllib.parse.SplitResult, body: dict, timeout: float) -> dict:
    """Send one streamed completion; read its server-sent events to `data: [DONE]`."""
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=timeout)
    path = url.path.rstrip("/") + "/v1/completions"
    payload = json.dumps(body).encode()
    start = time.perf_counter()
    ttft = None
    chunks = 0
    text = []
    usage = None
    finish = None
    try:
        conn.request("POST", path, body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read(2000).decode(errors='replace')}")
        done = False
        while not done:
            line = resp.readline()
            if not line:
                raise RuntimeError("the stream ended before data: [DONE]")
            line = line.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators, `:` keep-alive comments
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                continue
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(f"error event: {event['error']}")
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                piece = choice.get("text") or ""
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - start
                    chunks += 1
                    text.append(piece)
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
    finally:
        conn.close()
    end = time.perf_counter() - start
    tokens = usage.get("completion_tokens") if usage else None
    return {
        "ttft_s": ttft,
        "total_s": end,
        "completion_tokens": tokens if tokens is not None else chunks,
        "tokens_from": "usage" if tokens is not None else "chunks",
        "text_chunks": chunks,
        "finish_reason": finish,
        "usage": usage,
        "text": "".join(text),
    }


def run_load(base: str, ps: list[list[int]], args, extra: dict) -> tuple[list[dict], float]:
    url = urllib.parse.urlsplit(base)
    results: list = [None] * len(ps)
    next_index = [0]
    lock = threading.Lock()
    errors = []

    def worker() -> None:
        while True:
            with lock:
                i = next_index[0]
                if i >= len(ps) or errors:
                    return
                next_index[0] += 1
            body = {"prompt": ps[i], "max_tokens": args.max_tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
            body.update(extra)
            sent = time.perf_counter()
            try:
                r = one_request(url, body, args.timeout)
            except Exception as e:  # noqa: BLE001 - reported with its request, then the run fails
                with lock:
                    errors.append(f"request {i}: {e}")
                return
            r.update(index=i, prompt=ps[i], sent_s=sent - t0)
            results[i] = r

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        die("; ".join(errors[:5]))
    return results, wall


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of values."""
    s = sorted(values)
    return s[min(len(s), max(1, math.ceil(q * len(s)))) - 1]


def compare(mine: list[dict], path: str, label: str, report_only: bool) -> int:
    other = json.load(open(path))
    theirs = {r["index"]: r for r in other["requests"]}
    differ = []
    for r in mine:
        o = theirs.get(r["index"])
        if o is None:
            continue  # the other run sent fewer requests: only the shared ones are compared
        if o["prompt"] != r["prompt"]:
            die(f"request {r['index']} had another prompt in {path}: not comparable")
        if o["text"] != r["text"]:
            differ.append((r["index"], o["text"], r["text"]))
    shared = sum(1 for r in mine if r["index"] in theirs)
    if shared == 0:
        die(f"no request of this run is in {path}")
    what = f"{label} against {other.get('label', path)}"
    if not differ:
        print(f"texts identical: {what}: all {shared} shared requests, byte for byte")
        return 0
    i, a, b = differ[0]
    print(f"TEXTS DIFFER: {what}: {len(differ)} of {shared} requests; first request {i}:\n"
          f"  {path}: {a[:160]!r}\n  this run: {b[:160]!r}")
    return 0 if report_only else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base_url", help="e.g. http://127.0.0.1:8089")
    ap.add_argument("--concurrency", type=int, required=True)
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--max-tokens", type=int, required=True)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=1001, help="ids drawn from 1..min(1000, VOCAB-1)")
    ap.add_argument("--seed", type=int, default=25)
    ap.add_argument("--extra", default="{}", help="JSON object merged into every request body")
    ap.add_argument("--label", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--compare", default=None, help="a JSON written by --out")
    ap.add_argument("--report-only", action="store_true", help="--compare reports, never fails")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a request may take")
    args = ap.parse_args()
    if args.concurrency < 1 or args.requests < 1 or args.max_tokens < 1 or args.prompt_tokens < 1:
        ap.error("--concurrency, --requests, --max-tokens and --prompt-tokens must be at least 1")
    if args.vocab < 2:
        ap.error("--vocab must be at least 2")
    extra = json.loads(args.extra)
    if not isinstance(extra, dict):
        ap.error("--extra must be a JSON object")
    label = args.label or f"c{args.concurrency}"
    ps = prompts(args.requests, args.prompt_tokens, args.seed, args.vocab)
    results, wall = run_load(args.base_url, ps, args, extra)
    short = [r["index"] for r in results if r["completion_tokens"] != args.max_tokens]
    if short:
        print(f"WARNING: {len(short)} requests did not generate {args.max_tokens} tokens (first: "
              f"{short[0]}, {results[short[0]]['completion_tokens']} from {results[short[0]]['tokens_from']})",
              file=sys.stderr)
    ttfts = [r["ttft_s"] for r in results if r["ttft_s"] is not None]
    if len(ttfts) < len(results):
        print(f"WARNING: {len(results) - len(ttfts)} requests streamed no text", file=sys.stderr)
    tokens = sum(r["completion_tokens"] for r in results)
    summary = {
        "label": label,
        "base_url": args.base_url,
        "concurrency": args.concurrency,
        "requests": args.requests,
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "seed": args.seed,
        "vocab": args.vocab,
        "extra": extra,
        "wall_s": wall,
        "completion_tokens": tokens,
        "aggregate_tokens_per_s": tokens / wall,
        "ttft_median_s": statistics.median(ttfts) if ttfts else None,
        "ttft_p90_s": pct(ttfts, 0.9) if ttfts else None,
        "total_median_s": statistics.median(r["total_s"] for r in results),
    }
    ms = lambda v: "n/a" if v is None else f"{v * 1e3:.1f} ms"  # noqa: E731
    print(f"{label}: {args.requests} requests, concurrency {args.concurrency}, {args.prompt_tokens} prompt + "
          f"{args.max_tokens} tokens: TTFT median {ms(summary['ttft_median_s'])}, p90 {ms(summary['ttft_p90_s'])}; "
          f"{tokens} tokens in {wall:.2f} s = {summary['aggregate_tokens_per_s']:.1f} tokens/s aggregate")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**summary, "requests": results}, f, indent=1)
    rc = 0
    if args.compare:
        rc = compare(results, args.compare, label, args.report_only)
    sys.exit(rc)


if __name__ == "__main__":
    main()
