#!/usr/bin/env python3
"""tarfa serve against the real `openai` client (issue 25): chat and completions, streaming and
not, usage, stop strings, seeds, errors. Run by tests/serve_openai.rs with the server's base URL
and the text `tarfa run` printed for the rendered chat prompt; exits non-zero on the first
mismatch, saying which.

    python3 tests/serve/openai_client.py BASE_URL MODEL_ID EXPECTED_CHAT_TEXT_FILE
"""
import sys

import openai


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def main() -> int:
    base, model, expected_file = sys.argv[1], sys.argv[2], sys.argv[3]
    expected = open(expected_file, encoding="utf-8").read()
    c = openai.OpenAI(base_url=base + "/v1", api_key="k3y", max_retries=0)
    msgs = [{"role": "user", "content": "Hi"}]

    models = c.models.list()
    check([m.id for m in models.data] == [model], f"models {models}")

    # Chat, whole: the text tarfa run gives for the rendered prompt; usage counts it.
    r = c.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0)
    check(r.choices[0].message.role == "assistant", f"role {r}")
    check(r.choices[0].message.content == expected, f"chat text {r.choices[0].message.content!r} != {expected!r}")
    check(r.choices[0].finish_reason == "length", f"finish {r}")
    check(r.usage.completion_tokens == 12, f"usage {r.usage}")
    check(r.usage.total_tokens == r.usage.prompt_tokens + 12, f"usage {r.usage}")
    check(r.system_fingerprint.startswith("tarfa-"), f"fingerprint {r.system_fingerprint}")

    # Chat, streamed: a role chunk, the same text in deltas, a finish chunk, the usage chunk.
    s = c.chat.completions.create(
        model=model, messages=msgs, max_tokens=12, stream=True,
        stream_options={"include_usage": True}, seed=7,
    )
    chunks = list(s)
    check(chunks[0].choices[0].delta.role == "assistant", f"first chunk {chunks[0]}")
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    check(text == expected, f"streamed {text!r} != {expected!r}")
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    check(finishes[-1] == "length" and all(f is None for f in finishes[:-1]), f"finishes {finishes}")
    check(chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12, f"usage chunk {chunks[-1]}")

    # A stop string: the text ends before it.
    stop = expected[3:5]
    r = c.chat.completions.create(model=model, messages=msgs, max_tokens=12, stop=[stop])
    check(r.choices[0].message.content == expected[: expected.find(stop)], f"stop {r}")
    check(r.choices[0].finish_reason == "stop", f"stop finish {r}")

    # Completions, whole and streamed, the same text.
    r = c.completions.create(model=model, prompt="The quick brown fox", max_tokens=8)
    s = c.completions.create(model=model, prompt="The quick brown fox", max_tokens=8, stream=True)
    check("".join(ch.choices[0].text for ch in s if ch.choices) == r.choices[0].text, "completions stream")
    check(r.usage.completion_tokens == 8, f"completions usage {r.usage}")

    # Errors as the client types them: 400 naming the field, 404 for another model, 401 without
    # the key.
    try:
        c.chat.completions.create(model=model, messages=msgs, presence_penalty=0.5)
        check(False, "presence_penalty 0.5 was taken")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body.get("param") == "presence_penalty", f"penalty {e.body}")

    # Sampled with a seed: the same text twice; logprobs as the client types them.
    a = c.chat.completions.create(model=model, messages=msgs, max_tokens=10, temperature=1.2, seed=3)
    b = c.chat.completions.create(model=model, messages=msgs, max_tokens=10, temperature=1.2, seed=3)
    check(a.choices[0].message.content == b.choices[0].message.content, "seeded sampling differs")
    r = c.chat.completions.create(model=model, messages=msgs, max_tokens=3, logprobs=True, top_logprobs=2)
    lp = r.choices[0].logprobs.content
    check(len(lp) == 3 and all(len(t.top_logprobs) == 2 for t in lp), f"logprobs {lp}")
    check(all(t.logprob >= t.top_logprobs[1].logprob for t in lp), f"greedy logprobs {lp}")
    try:
        c.chat.completions.create(model=model, messages=msgs, extra_body={"frobnicate": 1})
        check(False, "an unknown field was taken")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "frobnicate", f"unknown field {e.body}")
    try:
        c.chat.completions.create(model="not-this-one", messages=msgs)
        check(False, "another model was taken")
    except openai.NotFoundError as e:
        check(e.status_code == 404, f"model {e}")
    anon = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
    try:
        anon.models.list()
        check(False, "a wrong key was taken")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, f"key {e}")
    # Still serving.
    r = c.chat.completions.create(model=model, messages=msgs, max_tokens=2)
    check(r.usage.completion_tokens == 2, "after the errors")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
