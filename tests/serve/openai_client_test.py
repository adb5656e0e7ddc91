#!/usr/bin/env python3
"""tests/serve/openai_client_test.py — `loom serve` as the official `openai`
Python client sees it, on SmolLM2 (LOOM_TEST_MODEL): chat and completions,
whole and streamed (with the usage chunk), logprobs, n with a seed, stop
strings, echo (scoring a text with max_tokens 0), cached prompt tokens in
usage, vLLM's /tokenize and /detokenize, tool calls (whole and streamed, the
model made to answer a call by the test sampler "lazy"'s script, since
SmolLM2-135M does not call tools on its own; tool_choice required and a
named function held to the schema by the grammar constraint), and the client's typed errors
(BadRequestError naming the parameter, NotFoundError). Each response is also
validated with `jsonschema` against the shape the OpenAI API documents.

It starts the servers itself (--port 0) and stops them with SIGTERM (exit 0
is a check too). Each check prints one line, "ok" or "FAIL" and its name; the
last line is Criterion's synthesis line, so scripts/count_tests.py counts
every check as a test case. Run by tests/serve/openai_client_test.sh, which
skips when the model or the packages are missing (scripts/python-env.sh makes
the environment). Greedy and short: a few seconds on two cores.
"""
import argparse
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback
import urllib.error
import urllib.request

import jsonschema
import openai

USAGE = {
    "type": "object",
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {
        "prompt_tokens": {"type": "integer", "minimum": 1},
        "completion_tokens": {"type": "integer", "minimum": 0},
        "total_tokens": {"type": "integer"},
        "prompt_tokens_details": {
            "type": "object",
            "required": ["cached_tokens"],
            "properties": {"cached_tokens": {"type": "integer", "minimum": 0}},
        },
    },
}
FINISH = {"enum": ["stop", "length"]}
CHAT = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "object": {"const": "chat.completion"},
        "choices": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["index", "message", "finish_reason"],
                "properties": {
                    "message": {
                        "type": "object",
                        "required": ["role", "content"],
                        "properties": {"role": {"const": "assistant"}, "content": {"type": "string"}},
                    },
                    "finish_reason": FINISH,
                },
            },
        },
        "usage": USAGE,
    },
}
COMPLETION_LOGPROBS = {
    "type": "object",
    "required": ["tokens", "token_logprobs", "top_logprobs", "text_offset"],
    "properties": {
        "tokens": {"type": "array", "items": {"type": "string"}},
        "token_logprobs": {"type": "array", "items": {"type": ["number", "null"], "maximum": 0}},
        "top_logprobs": {"type": "array", "items": {"type": ["object", "null"]}},
        "text_offset": {"type": "array", "items": {"type": "integer", "minimum": 0}},
    },
}
COMPLETION = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "object": {"const": "text_completion"},
        "choices": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["index", "text", "finish_reason"],
                "properties": {
                    "text": {"type": "string"},
                    "finish_reason": FINISH,
                    "logprobs": {"anyOf": [{"type": "null"}, COMPLETION_LOGPROBS]},
                },
            },
        },
        "usage": USAGE,
    },
}
TOKENIZE = {
    "type": "object",
    "required": ["tokens", "count", "max_model_len"],
    "properties": {
        "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "count": {"type": "integer"},
        "max_model_len": {"type": "integer"},
    },
}
ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {"message": {"type": "string"}, "code": {"type": "integer"}},
        }
    },
}

SYSTEM = ("You are a careful assistant. Answer every question in one short sentence, without lists, "
          "and never invent facts you do not know.")
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


class Checks:
    """Named checks: each prints one line; failures are counted, not raised."""

    def __init__(self):
        self.passed = self.failed = 0

    def run(self, name, fn):
        try:
            fn()
            self.passed += 1
            print(f"ok   {name}", flush=True)
        except Exception as e:  # a failed check is reported, the others still run
            self.failed += 1
            where = traceback.extract_tb(e.__traceback__)[-1]
            print(f"FAIL {name}: {type(e).__name__}: {e} (line {where.lineno})", flush=True)


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def raises(exc_type, fn, param=None, needle=None):
    """fn() raises exc_type, naming `param` and saying `needle`."""
    try:
        fn()
    except exc_type as e:
        expect(param is None or e.param == param, f"param {e.param!r}, expected {param!r}: {e.message}")
        expect(needle is None or needle in e.message, f"{e.message!r} lacks {needle!r}")
        expect(e.status_code == e.body.get("code", e.status_code), f"code {e.body} vs status {e.status_code}")
        return
    raise AssertionError(f"no {exc_type.__name__}")


def post_json(base, path, body):
    """A POST outside the OpenAI client (vLLM's routes): (status, JSON)."""
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def start_server(loom, source, *extra):
    log = tempfile.TemporaryFile(mode="w+")  # the server's request log: a file, never a pipe that fills
    # weights in their GGUF blocks (smol.yaml asks for f32, for the C tests' exact texts): several
    # times faster on a CPU, and every check here compares the server with itself
    # the grammar constraint keeps tool_choice required / named
    proc = subprocess.Popen([loom, "serve", "tests/constraint/data/smol.yaml", "--port", "0", "--set",
                             "backend.weight_dtype=gguf", *extra], cwd=source,
                            stdout=subprocess.PIPE, stderr=log, text=True)
    line = proc.stdout.readline()
    if "listening on http://" not in line:
        proc.kill()
        log.seek(0)
        sys.exit(f"loom serve did not start: {line!r}; its stderr:\n{log.read()[-2000:]}")
    return proc, line.strip().rsplit(" ", 1)[-1]


def chat_checks(c, client, model):
    def whole():
        r = client.chat.completions.create(model=model, messages=FRANCE, temperature=0, max_tokens=12)
        jsonschema.validate(r.model_dump(), CHAT)
        u = r.usage
        expect(r.choices[0].message.content and 0 < u.completion_tokens <= 12, r)
        expect(u.total_tokens == u.prompt_tokens + u.completion_tokens, u)

    c.run("chat: a greedy answer in OpenAI's shape", whole)

    def stream():
        ref = client.chat.completions.create(model=model, messages=FRANCE, temperature=0, max_tokens=12)
        chunks = list(client.chat.completions.create(model=model, messages=FRANCE, temperature=0, max_tokens=12,
                                                     stream=True, stream_options={"include_usage": True}))
        expect(chunks[0].choices[0].delta.role == "assistant", "the first delta carries the role")
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        expect(text == ref.choices[0].message.content, f"{text!r} vs {ref.choices[0].message.content!r}")
        expect(chunks[-1].choices == [] and chunks[-1].usage is not None, "the last chunk is the usage")
        u = chunks[-1].usage
        expect(u.completion_tokens == ref.usage.completion_tokens and u.prompt_tokens == ref.usage.prompt_tokens,
               f"{u} vs {ref.usage}")
        expect(u.prompt_tokens_details.cached_tokens > 0, "the same prompt again comes from the prefix cache")

    c.run("chat: stream equals the whole answer, usage chunk last", stream)

    def logprobs():
        r = client.chat.completions.create(model=model, messages=FRANCE, temperature=0, max_tokens=4,
                                           logprobs=True, top_logprobs=2)
        content = r.choices[0].logprobs.content
        expect(len(content) == r.usage.completion_tokens, f"{len(content)} entries, {r.usage}")
        for e in content:
            expect(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob, e)
            expect(abs(e.top_logprobs[0].logprob - e.logprob) < 1e-4, "greedy: the chosen token is the top one")
            expect(bytes(e.bytes).decode("utf-8", "replace") == e.token or "\ufffd" in e.token, e)

    c.run("chat: logprobs with top_logprobs and bytes", logprobs)

    def cached():
        msgs = lambda q: [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
        client.chat.completions.create(model=model, messages=msgs("What is 2 + 2?"), max_tokens=1)
        r = client.chat.completions.create(model=model, messages=msgs("What is 3 + 3?"), max_tokens=1)
        n = r.usage.prompt_tokens_details.cached_tokens
        expect(n >= 32 and n % 16 == 0 and n < r.usage.prompt_tokens, f"cached_tokens {n} of {r.usage}")

    c.run("chat: a shared system prompt is reported as cached_tokens", cached)


def completion_checks(c, client, model):
    prompt = "The capital of France is"

    def logprobs():
        r = client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=4, logprobs=2)
        jsonschema.validate(r.model_dump(), COMPLETION)
        lp = r.choices[0].logprobs
        expect(len(lp.tokens) == r.usage.completion_tokens == 4, f"{lp.tokens} {r.usage}")
        expect("".join(lp.tokens) == r.choices[0].text, f"{lp.tokens} vs {r.choices[0].text!r}")
        expect(all(len(t) == 2 for t in lp.top_logprobs), lp.top_logprobs)

    c.run("completions: logprobs, tokens spell the text", logprobs)

    def stream():
        ref = client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=6)
        chunks = list(client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=6, stream=True,
                                                stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        expect(text == ref.choices[0].text, f"{text!r} vs {ref.choices[0].text!r}")
        expect(chunks[-1].usage.completion_tokens == ref.usage.completion_tokens, chunks[-1].usage)

    c.run("completions: stream with usage equals the whole answer", stream)

    def n_seed():
        a = client.completions.create(model=model, prompt=prompt, n=2, seed=7, max_tokens=5, temperature=1)
        b = client.completions.create(model=model, prompt=prompt, n=2, seed=7, max_tokens=5, temperature=1)
        expect(len(a.choices) == 2 and [ch.index for ch in a.choices] == [0, 1], a.choices)
        expect([ch.text for ch in a.choices] == [ch.text for ch in b.choices], "a seed repeats its samples")

    c.run("completions: n = 2 with a seed repeats", n_seed)

    def stop():
        r = client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=12, stop=["."])
        expect("." not in r.choices[0].text and r.choices[0].finish_reason == "stop", r.choices[0])

    c.run("completions: a stop string ends the text before it", stop)

    def echo_score():
        r = client.completions.create(model=model, prompt=prompt, max_tokens=0, echo=True, logprobs=1)
        jsonschema.validate(r.model_dump(), COMPLETION)
        lp = r.choices[0].logprobs
        expect(r.choices[0].text == prompt, r.choices[0].text)
        expect(lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, "the first token has no logprob")
        expect(all(x < 0 for x in lp.token_logprobs[1:]), lp.token_logprobs)
        expect(len(lp.tokens) == r.usage.prompt_tokens and r.usage.completion_tokens == 0, r.usage)

    c.run("completions: echo with max_tokens 0 scores the prompt", echo_score)

    def echo_stream():
        ref = client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=3)
        chunks = list(client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=3, echo=True,
                                                stream=True))
        expect(chunks[0].choices[0].text == prompt, "the echo is the first chunk")
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        expect(text == prompt + ref.choices[0].text, text)

    c.run("completions: echo in a stream comes first", echo_stream)


def route_checks(c, base, model):
    def tokenize():
        st, t = post_json(base, "/tokenize", {"model": model, "prompt": "Hello, world"})
        expect(st == 200, t)
        jsonschema.validate(t, TOKENIZE)
        st, d = post_json(base, "/detokenize", {"model": model, "tokens": t["tokens"]})
        expect(st == 200 and d["prompt"] == "Hello, world", d)
        st, m = post_json(base, "/tokenize", {"messages": FRANCE})
        expect(st == 200 and m["count"] > t["count"], m)

    c.run("tokenize / detokenize round trip", tokenize)

    def errors():
        st, e = post_json(base, "/detokenize", {"tokens": [1, 10 ** 9]})
        jsonschema.validate(e, ERROR)
        expect(st == 400 and e["error"]["param"] == "tokens" and "tokens[1]" in e["error"]["message"], e)
        st, e = post_json(base, "/tokenize", {"prompt": 42})
        expect(st == 400 and e["error"]["param"] == "prompt", e)

    c.run("tokenize / detokenize errors name the field", errors)


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call><|im_end|>'
ROME = [{"role": "user", "content": "What is the weather in Rome?"}]


def tool_checks(c, loom, source, base):
    """A second server whose sampler answers CALL_TEXT (its ids, read with
    special tokens parsed, from /tokenize of a server started so)."""
    special, sbase = start_server(loom, source, "--parse-special-tokens")
    try:  # whatever /tokenize does, this server does not outlive the call
        st, t = post_json(sbase, "/tokenize", {"prompt": CALL_TEXT})
    finally:
        special.send_signal(signal.SIGTERM)
        try:
            special.wait(timeout=60)
        except subprocess.TimeoutExpired:
            special.kill()
            special.wait()
    ok = st == 200 and bool(t.get("tokens"))
    c.run("tools: /tokenize of the scripted call answers its tokens", lambda: expect(ok, f"status {st}: {t}"))
    if not ok:
        return  # the tool checks need the script
    script = ",".join(map(str, t["tokens"]))
    proc, tbase = start_server(loom, source, "--set", "sampler.plugin=lazy", "--set", f"sampler.script={script}")
    client = openai.OpenAI(api_key="unused", base_url=tbase + "/v1", max_retries=0, timeout=120)
    try:
        def whole():
            r = client.chat.completions.create(model=model_of(client), messages=ROME, tools=WEATHER, max_tokens=60)
            ch = r.choices[0]
            expect(ch.finish_reason == "tool_calls" and ch.message.content is None, ch)
            call = ch.message.tool_calls[0]
            expect(call.type == "function" and call.function.name == "get_weather", call)
            args = json.loads(call.function.arguments)
            jsonschema.validate(args, WEATHER[0]["function"]["parameters"])
            expect(args == {"city": "Rome"}, args)
            # the call fed back: the assistant's tool_calls and the tool's result render (and generate)
            back = ROME + [ch.message.model_dump(exclude_none=True),
                           {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
            r2 = client.chat.completions.create(model=model_of(client), messages=back, tools=WEATHER, max_tokens=1)
            expect(r2.usage.prompt_tokens > r.usage.prompt_tokens, (r.usage, r2.usage))

        c.run("tools: a call comes back as tool_calls, arguments valid for the schema", whole)

        def stream():
            chunks = list(client.chat.completions.create(model=model_of(client), messages=ROME, tools=WEATHER,
                                                         max_tokens=60, stream=True))
            content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            calls = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
            expect(content == "", f"the call's text went out as content: {content!r}")
            expect(len(calls) == 1 and calls[0].function.name == "get_weather", calls)
            expect(json.loads(calls[0].function.arguments) == {"city": "Rome"}, calls[0])
            expect(chunks[-1].choices[0].finish_reason == "tool_calls", chunks[-1])

        c.run("tools: streamed, the call is a tool_calls delta", stream)

        def none():
            r = client.chat.completions.create(model=model_of(client), messages=ROME, tools=WEATHER,
                                               tool_choice="none", max_tokens=8)
            m = r.choices[0].message
            expect(m.tool_calls is None and m.content.startswith("<tool"), r)

        c.run("tools: tool_choice none leaves the text as content", none)
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    c.run("the scripted server exits 0 on SIGTERM", lambda: expect(rc == 0, f"exit status {rc}"))


FORCED_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["city", "unit"],
        "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 24},
                       "unit": {"enum": ["celsius", "fahrenheit"]},
                       "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "required": ["a", "b"], "additionalProperties": False,
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in FORCED_TOOLS}


def forced_tool_checks(c, client, model):
    """tool_choice required / named on SmolLM2, which rarely calls tools by
    itself: the constraint makes every answer a call whose arguments
    validate against the function's schema."""
    def required():
        for seed in range(6):
            r = client.chat.completions.create(model=model, messages=ROME, tools=FORCED_TOOLS, tool_choice="required",
                                               parallel_tool_calls=False, max_tokens=200, temperature=1.0, seed=seed)
            ch = r.choices[0]
            expect(ch.finish_reason == "tool_calls" and len(ch.message.tool_calls) == 1, ch)
            call = ch.message.tool_calls[0].function
            jsonschema.validate(json.loads(call.arguments), PARAMS[call.name])

    c.run("tools: tool_choice required makes a call valid for its schema (6 seeds, temperature 1)", required)

    named = {"type": "function", "function": {"name": "add"}}

    def named_whole_and_stream():
        r = client.chat.completions.create(model=model, messages=ROME, tools=FORCED_TOOLS, tool_choice=named,
                                           max_tokens=200, temperature=0)
        ch = r.choices[0]
        expect(ch.finish_reason == "stop" and ch.message.content is None, ch)
        args = ch.message.tool_calls[0].function.arguments
        jsonschema.validate(json.loads(args), PARAMS["add"])
        chunks = list(client.chat.completions.create(model=model, messages=ROME, tools=FORCED_TOOLS,
                                                     tool_choice=named, max_tokens=200, temperature=0, stream=True))
        deltas = [tc for k in chunks if k.choices for tc in (k.choices[0].delta.tool_calls or [])]
        expect(len(deltas) > 2, f"the arguments came in one piece: {deltas}")
        expect(deltas[0].function.name == "add" and deltas[0].id, deltas[0])
        streamed = "".join(d.function.arguments or "" for d in deltas)
        expect(streamed == args, (streamed, args))
        expect(chunks[-1].choices[0].finish_reason == "stop", chunks[-1])

    c.run("tools: a named tool_choice answers its arguments, streamed piece by piece the same", named_whole_and_stream)


def model_of(client):
    return client.models.list().data[0].id


def error_checks(c, client, model):
    c.run("error: temperature out of range is a BadRequestError naming it", lambda: raises(
        openai.BadRequestError, lambda: client.chat.completions.create(model=model, messages=FRANCE, temperature=7e3),
        "temperature", "'temperature' must be"))
    c.run("error: unknown model is a NotFoundError", lambda: raises(
        openai.NotFoundError, lambda: client.completions.create(model="gpt-4", prompt="x"), "model", "gpt-4"))
    c.run("error: max_tokens past the context is a BadRequestError", lambda: raises(
        openai.BadRequestError, lambda: client.completions.create(model=model, prompt="x", max_tokens=100000),
        None, "lower max_tokens"))
    c.run("error: tool_choice naming a function not offered is a BadRequestError", lambda: raises(
        openai.BadRequestError, lambda: client.chat.completions.create(
            model=model, messages=FRANCE, tools=WEATHER,
            tool_choice={"type": "function", "function": {"name": "get_time"}}),
        "tool_choice", "does not offer"))
    c.run("error: a tool without a name is a BadRequestError", lambda: raises(
        openai.BadRequestError, lambda: client.chat.completions.create(
            model=model, messages=FRANCE, tools=[{"type": "function", "function": {"parameters": {}}}]),
        "tools", "tools[0].function.name"))
    c.run("error: max_tokens 0 without echo is a BadRequestError", lambda: raises(
        openai.BadRequestError, lambda: client.completions.create(model=model, prompt="x", max_tokens=0),
        "max_tokens"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loom", required=True, help="the loom binary")
    ap.add_argument("--source", required=True, help="the source tree (tests/constraint/data/smol.yaml)")
    args = ap.parse_args()
    proc, base = start_server(args.loom, args.source)
    c = Checks()
    try:
        client = openai.OpenAI(api_key="unused", base_url=base + "/v1", max_retries=0, timeout=120)
        models = client.models.list().data
        c.run("models: one model, listed", lambda: expect(len(models) == 1, models))
        model = models[0].id
        chat_checks(c, client, model)
        completion_checks(c, client, model)
        route_checks(c, base, model)
        error_checks(c, client, model)
        forced_tool_checks(c, client, model)
        tool_checks(c, args.loom, args.source, base)
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    c.run("the server exits 0 on SIGTERM", lambda: expect(rc == 0, f"exit status {rc}"))
    print(f"openai {openai.__version__}, jsonschema {importlib.metadata.version('jsonschema')}")
    print(f"Synthesis: Tested: {c.passed + c.failed} | Passing: {c.passed} | Failing: {c.failed} | Crashing: 0")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
