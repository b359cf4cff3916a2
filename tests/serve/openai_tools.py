#!/usr/bin/env python3
"""Tool calls through the real `openai` client: tarfa serve on the scripted model
(fixtures/hf/make_scripted.py: its greedy reply is a reasoning block, "Let me check." and a
get_weather call in Qwen3's Hermes format). Whole and streamed, the client reads the same call,
the reasoning apart and the content before the call; finish_reason is "tool_calls"; without
tools (or with tool_choice "none") the reply is content, as written. Run by
tests/serve_openai.rs; exits non-zero on the first mismatch, saying which.

    python3 tests/serve/openai_tools.py BASE_URL MODEL_ID
"""
import json
import sys

import openai

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}]
CALL = '{"city": "Paris", "days": 3}'
REASONING = "The user asks for the weather in Paris."
WRITTEN = ("<think>\n" + REASONING + "\n</think>\n\nLet me check.\n<tool_call>\n"
           '{"name": "get_weather", "arguments": ' + CALL + "}\n</tool_call>")


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def main() -> int:
    base, model = sys.argv[1], sys.argv[2]
    c = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
    msgs = [{"role": "user", "content": "What's the weather in Paris?"}]

    # Whole: the call, its arguments as the model wrote them, the content before it.
    r = c.chat.completions.create(model=model, messages=msgs, tools=TOOLS, temperature=0)
    m = r.choices[0].message
    check(r.choices[0].finish_reason == "tool_calls", f"finish {r}")
    check(m.content == "Let me check.", f"content {m.content!r}")
    reasoning = (m.model_extra or {}).get("reasoning_content")
    check(reasoning == REASONING, f"reasoning {reasoning!r}")
    check(len(m.tool_calls) == 1, f"tool_calls {m.tool_calls}")
    call = m.tool_calls[0]
    check(call.type == "function" and call.function.name == "get_weather", f"call {call}")
    check(call.function.arguments == CALL, f"arguments {call.function.arguments!r}")
    check(json.loads(call.function.arguments) == {"city": "Paris", "days": 3}, "arguments JSON")
    check(call.id.startswith("call_"), f"id {call.id}")

    # Streamed: the deltas add up to the same message, call and finish.
    s = c.chat.completions.create(model=model, messages=msgs, tools=TOOLS, temperature=0,
                                  stream=True)
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in s:
        for ch in chunk.choices:
            d = ch.delta
            content += d.content or ""
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            for tc in d.tool_calls or []:
                e = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                e["id"] = tc.id or e["id"]
                if tc.function:
                    e["name"] += tc.function.name or ""
                    e["arguments"] += tc.function.arguments or ""
            finish = ch.finish_reason or finish
    check(finish == "tool_calls", f"streamed finish {finish}")
    check(content == "Let me check.", f"streamed content {content!r}")
    check(reasoning == REASONING, f"streamed reasoning {reasoning!r}")
    check(list(calls) == [0], f"streamed calls {calls}")
    check(calls[0] == {"id": call.id, "name": "get_weather", "arguments": CALL},
          f"streamed call {calls[0]} against {call}")

    # The same request again: the same bytes, the call's id included.
    again = c.chat.completions.create(model=model, messages=msgs, tools=TOOLS, temperature=0)
    check(again.choices[0].message.tool_calls[0].id == call.id, "the call's id changed")

    # The next turn, as a tool-calling loop sends it: the assistant message as the client read it
    # (its content null where a reply is only a call: here it is "Let me check.") and the tool's
    # result. Taken; the model's call this turn gets an id of its own.
    for content in [m.content, None]:
        turn = m.model_dump(exclude_none=True)
        turn["content"] = content
        follow = msgs + [turn, {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
        r2 = c.chat.completions.create(model=model, messages=follow, tools=TOOLS, temperature=0)
        c2 = r2.choices[0].message.tool_calls
        check(r2.choices[0].finish_reason == "tool_calls" and len(c2) == 1, f"turn 2: {r2}")
        check(c2[0].function.arguments == CALL, f"turn 2 arguments {c2[0]}")
        check(c2[0].id != call.id, f"turn 2's call has turn 1's id {call.id}")
        check(r2.usage.prompt_tokens > r.usage.prompt_tokens, f"turn 2's prompt {r2.usage}")

    # No tools, or tool_choice "none": the reply is content, as the model wrote it.
    for extra in [{}, {"tools": TOOLS, "tool_choice": "none"}]:
        r = c.chat.completions.create(model=model, messages=msgs, temperature=0, **extra)
        m = r.choices[0].message
        check(r.choices[0].finish_reason == "stop", f"{extra}: finish {r}")
        check(not m.tool_calls, f"{extra}: tool_calls {m.tool_calls}")
        check(m.content == WRITTEN.split("</think>\n\n", 1)[1], f"{extra}: content {m.content!r}")

    # A call cut short by max_tokens is content, finish "length".
    r = c.chat.completions.create(model=model, messages=msgs, tools=TOOLS, temperature=0,
                                  max_tokens=6)
    check(r.choices[0].finish_reason == "length", f"cut: finish {r}")
    check(not r.choices[0].message.tool_calls, f"cut: {r}")
    check(r.choices[0].message.content == "Let me check.\n<tool_call>\n" + '{"name": "get_weather", "arguments": ' + CALL + "}\n",
          f"cut: content {r.choices[0].message.content!r}")

    # A forced call is refused by name: the model is never forced.
    try:
        c.chat.completions.create(model=model, messages=msgs, tools=TOOLS,
                                  tool_choice="required")
        check(False, "tool_choice required was taken")
    except openai.BadRequestError as e:
        check(e.body.get("param") == "tool_choice", f"param {e.body}")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
