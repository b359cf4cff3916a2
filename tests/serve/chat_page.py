#!/usr/bin/env python3
"""tarfa serve's chat page (GET /, issue 25) in headless Chromium, driven through chromedriver by
selenium as a person would use it: set the API key and max tokens, type "Hi", send; type a second
message (Shift+Enter for a new line, Enter to send); then a request the server refuses. Run by
tests/serve_page.rs.

    python3 tests/serve/chat_page.py BASE_URL API_KEY EXPECTED_FILE [--max-tokens N]
                                     [--reasoning] [--screenshot PATH]

EXPECTED_FILE holds the text `tarfa run` prints for the prompt the chat template renders for
[{"role": "user", "content": "Hi"}], N tokens long. The first answer read off the page must be
those bytes; the second must be the API's answer to the whole conversation, its prompt as long as
the conversation's (so the page sent its history). With --reasoning the template opens a <think>
block the answer never closes: the expected text is the answer's reasoning, shown apart, and its
content is empty; only the first turn is taken. Exits non-zero on the first mismatch, saying
which; prints "ok" otherwise.
"""
import argparse
import json
import re
import sys
import tempfile
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

# Debian's chromium and chromium-driver packages (tarfa_testtools::CHROMIUM, CHROMEDRIVER).
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# The page's size, CSS pixels (and the screenshot's).
WIDTH, HEIGHT = 1000, 700
# The longest wait for anything on the page (the fixture answers in well under a second).
WAIT_S = 60
SECOND = "Say more\nplease"


class Failed(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failed(what)


def api(base, key, route, body=None):
    """The JSON the server answers to a request of its own."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        base + route,
        data=data,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=WAIT_S) as r:
        return json.load(r)


def chat(base, key, messages, max_tokens):
    """The API's answer to `messages`, greedy: its text and its prompt's length in tokens."""
    r = api(base, key, "/v1/chat/completions", {
        "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": False,
    })
    return r["choices"][0]["message"]["content"], r["usage"]["prompt_tokens"]


def browser(profile):
    o = webdriver.ChromeOptions()
    o.binary_location = CHROMIUM
    for a in [
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}",
    ]:
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=o)
    # The window's size includes what a browser draws around the page: grow it by that much.
    inner = d.execute_script("return [window.innerWidth, window.innerHeight]")
    d.set_window_size(2 * WIDTH - inner[0], 2 * HEIGHT - inner[1])
    return d


def text(d, el):
    """An element's text exactly (textContent; selenium's .text is what is rendered, its white
    space collapsed)."""
    return d.execute_script("return arguments[0].textContent", el)


def by_id(d, id):
    return text(d, d.find_element(By.ID, id))


def wait(d, what, cond):
    try:
        return WebDriverWait(d, WAIT_S, poll_frequency=0.05).until(cond)
    except TimeoutException:
        shown = d.execute_script("return document.body.innerText")
        raise Failed(f"{what}: not within {WAIT_S} s; the page shows:\n{shown}")


def answers(d, count):
    """The assistant messages once there are `count` and the last one's stream has ended."""
    def done(d):
        boxes = d.find_elements(By.CSS_SELECTOR, ".message.assistant")
        if len(boxes) == count and boxes[-1].get_dom_attribute("data-done") == "true":
            return boxes
        return False
    return wait(d, f"answer {count} ends", done)


def part(d, box, cls):
    return text(d, box.find_element(By.CSS_SELECTOR, "." + cls))


def open_page(d, args, model):
    """Load the page, give it the key and max tokens; the message box."""
    d.get(args.base + "/")
    # The style applied (its hash is in the policy), and without the key the page says so.
    overflow = d.execute_script(
        "return getComputedStyle(document.getElementById('messages')).overflowY")
    check(overflow == "auto", f"the page's style did not apply (overflow-y {overflow!r})")
    wait(d, "the page says the key is needed", lambda d: "401" in by_id(d, "status"))
    d.find_element(By.ID, "api-key").send_keys(args.key)
    wait(d, "the header shows the manifest digest",
         lambda d: by_id(d, "digest") == model["manifest_digest"])
    check(by_id(d, "model") == model["id"], f"the header's model {by_id(d, 'model')!r}")
    check(by_id(d, "status") == "", f"the status still says {by_id(d, 'status')!r}")
    limit = d.find_element(By.ID, "max-tokens")
    limit.clear()
    limit.send_keys(str(args.max_tokens))
    return d.find_element(By.ID, "input")


def first_turn(d, args, model, expected):
    """ "Hi", sent with the Send button: the answer (or with --reasoning its reasoning) is
    `expected`, with its figures."""
    d.find_element(By.ID, "input").send_keys("Hi")
    d.find_element(By.ID, "send").click()
    first = answers(d, 1)[0]
    check(part(d, first, "error") == "", f"turn 1 failed: {part(d, first, 'error')}")
    block = first.find_element(By.CSS_SELECTOR, ".reasoning-block")
    content, reasoning = part(d, first, "content"), part(d, first, "reasoning")
    if args.reasoning:
        check(reasoning == expected, f"turn 1's reasoning {reasoning!r} != tarfa run's {expected!r}")
        check(content == "", f"turn 1's content {content!r}: all of it is reasoning")
        check(block.is_displayed() and block.get_dom_attribute("open") is not None,
              "the reasoning is not shown (an answer without content keeps it open)")
        summary = text(d, block.find_element(By.TAG_NAME, "summary"))
        check(summary == "Reasoning", f"the reasoning's label {summary!r}")
    else:
        check(content == expected, f"turn 1's answer {content!r} != tarfa run's {expected!r}")
        check(reasoning == "" and not block.is_displayed(), f"turn 1's reasoning {reasoning!r}")
    stats = first.find_element(By.CSS_SELECTOR, ".stats")
    figures = text(d, stats)
    check(stats.get_dom_attribute("data-tokens") == str(args.max_tokens), f"token count: {figures}")
    check(re.search(r"\b\d+\.\d tokens/s\b", figures) is not None, f"no tokens/s: {figures!r}")
    check(float(stats.get_dom_attribute("data-tokens-per-second")) > 0, f"tokens/s: {figures}")
    check("first token in" in figures, f"no time to first token: {figures!r}")
    check(by_id(d, "fingerprint") == model["system_fingerprint"],
          f"the header's fingerprint {by_id(d, 'fingerprint')!r}")


def second_turn(d, args, box, expected):
    """Shift+Enter is a new line, not a send; Enter sends. The answer is the API's for the whole
    conversation, and so is the prompt's length, which shows the history was sent (the fixture's
    text may be the same without it). Returns the conversation."""
    box.send_keys("Say more")
    box.send_keys(Keys.SHIFT, Keys.ENTER)
    box.send_keys("please")
    check(box.get_property("value") == SECOND, f"Shift+Enter: {box.get_property('value')!r}")
    check(len(d.find_elements(By.CSS_SELECTOR, ".message.user")) == 1, "Shift+Enter sent")
    box.send_keys(Keys.ENTER)
    boxes = answers(d, 2)
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": expected},
        {"role": "user", "content": SECOND},
    ]
    want, want_prompt = chat(args.base, args.key, history, args.max_tokens)
    _, alone_prompt = chat(args.base, args.key, history[2:], args.max_tokens)
    check(want_prompt > alone_prompt,
          f"prompt tokens {want_prompt} with the history, {alone_prompt} without")
    check(part(d, boxes[1], "error") == "", f"turn 2 failed: {part(d, boxes[1], 'error')}")
    got = part(d, boxes[1], "content")
    check(got == want, f"turn 2's answer {got!r} != the API's for the conversation {want!r}")
    stats = boxes[1].find_element(By.CSS_SELECTOR, ".stats")
    sent = stats.get_dom_attribute("data-prompt-tokens")
    check(sent == str(want_prompt), f"turn 2's prompt was {sent} tokens, not the conversation's "
          f"{want_prompt} (the message alone: {alone_prompt}): {text(d, stats)}")
    check(part(d, boxes[0], "content") == expected, "turn 1's answer changed")
    users = [part(d, u, "content") for u in d.find_elements(By.CSS_SELECTOR, ".message.user")]
    check(users == ["Hi", SECOND], f"the user's messages on the page: {users!r}")
    check(box.get_property("value") == "", "the message box was not cleared")
    return history


def refused_turn(d, args, box):
    """max_tokens 0: the page shows the server's message, leaves the turn out of the conversation
    and gives its text back."""
    try:
        chat(args.base, args.key, [{"role": "user", "content": "Hi"}], 0)
        raise Failed("max_tokens 0 was taken")
    except urllib.error.HTTPError as e:
        refusal = json.load(e)["error"]["message"]
    count = len(d.find_elements(By.CSS_SELECTOR, ".message.assistant"))
    limit = d.find_element(By.ID, "max-tokens")
    limit.clear()
    limit.send_keys("0")
    box.send_keys("Hi", Keys.ENTER)
    last = answers(d, count + 1)[count]
    shown = part(d, last, "error")
    check(refusal in shown and "400" in shown, f"the refusal {refusal!r} shown as {shown!r}")
    user = d.find_elements(By.CSS_SELECTOR, ".message.user")[-1]
    check("left-out" in user.get_dom_attribute("class"), "the refused turn is not marked left out")
    check(box.get_property("value") == "Hi", "the refused message was not given back")


def run(args):
    with open(args.expected, "rb") as f:
        expected = f.read().decode("utf-8")
    model = api(args.base, args.key, "/v1/models")["data"][0]
    with tempfile.TemporaryDirectory() as profile:
        d = browser(profile)
        try:
            box = open_page(d, args, model)
            first_turn(d, args, model, expected)
            if not args.reasoning:
                second_turn(d, args, box, expected)
            if args.screenshot:
                check(d.save_screenshot(args.screenshot), f"screenshot {args.screenshot}")
            refused_turn(d, args, box)
            # Nothing the policy refused, no script error.
            bad = [e["message"] for e in d.get_log("browser")
                   if any(w in e["message"] for w in ("Content Security Policy", "Refused", "Uncaught"))]
            check(not bad, "the console says:\n" + "\n".join(bad))
        finally:
            d.quit()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base")
    p.add_argument("key")
    p.add_argument("expected")
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--reasoning", action="store_true")
    p.add_argument("--screenshot")
    args = p.parse_args()
    try:
        run(args)
    except Failed as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
