#!/usr/bin/env python3
"""tests/constraint/check_schemas.py — the grammar constraint against the
jsonschema package, on random schemas.

For each of N seeded random JSON schemas (the seed is printed; pass --seed to
replay): the C helper (constraint_check) compiles it and samples documents
token by token from its masks; every sampled document must parse as JSON and
validate. Python also writes valid documents of its own (compact, properties
in declared order), which the matcher must accept, and mutations of them,
which it must reject whenever jsonschema says they are invalid. A fixed list of
regexes is checked the same way against Python's re.fullmatch.

Usage: check_schemas.py HELPER [--count N] [--seed S]
Formats are checked with jsonschema's FormatChecker (date-time and time need
the rfc3339-validator package, which scripts/python-env.sh installs; without
it they go unchecked, so the script then refuses to run them: exit 77).
Exit 77 (skip) when jsonschema is not installed.
"""
import argparse
import json
import random
import re
import subprocess
import sys
import time

try:
    import jsonschema
except ImportError:
    print("jsonschema is not installed for this Python (set LOOM_TEST_PYTHON to one that has it): skipped")
    sys.exit(77)
if "date-time" not in jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers:
    print("rfc3339-validator is not installed, so jsonschema cannot check date-time (scripts/python-env.sh "
          "installs it): skipped")
    sys.exit(77)

# patterns for "pattern", each with strings that fully match it (the instance
# generator's valid values); they stay inside what both Python's re and
# ECMA-262 read the same way
PATTERNS = [
    (r"^[A-Z]{2}-\d{3}$", ["AB-123", "ZZ-000"]),
    (r"[a-c]+\.?", ["abc.", "a"]),
    (r"^(yes|no)$", ["yes", "no"]),
    (r'^"[^"\\]*"$', ['"q"', '""']),
    (r"a\\b\n", ["a\\b\n"]),
    (r"[^a-z]{1,3}", ["\t", "A\u0001", "\"\\"]),
    (r"^.{2}$", ["x\u001f", "é中"]),
    (r"\s\S", [" x", "\t\""]),
    (r"(?:\d{1,2}:)?\d\d", ["1:23", "45"]),
]
FORMATS = {
    "date": ["2024-02-28", "0001-12-31"], "time": ["23:59:59Z", "00:00:00.5+05:30"],
    "date-time": ["2020-04-30T12:00:00-01:00"], "uuid": ["123e4567-e89b-12d3-a456-426614174000"],
    "ipv4": ["192.168.0.1", "0.0.0.0"], "email": ["a.b@example.com", "x+y@d-1.org"],
}
BOUNDS = [-1000, -101, -15, -1, 0, 1, 7, 9, 10, 99, 101, 12345, 10**15]

WORDS = ["id", "name", "tags", "a b", "x\"y", "é", "count", "items", "ok", "nested", "k-1", "值"]


def rand_schema(r, depth, defs):
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const"]
    if depth < 3:
        kinds += ["object", "object", "array", "array", "anyOf", "oneOf", "types"]
    if defs and depth < 3:
        kinds.append("ref")
    k = r.choice(kinds)
    if k == "string":
        s = {"type": "string"}
        x = r.random()
        if x < 0.3:
            s["minLength"] = r.randint(0, 3)
            s["maxLength"] = s["minLength"] + r.randint(0, 5)
        elif x < 0.5:
            s["pattern"] = r.choice(PATTERNS)[0]
        elif x < 0.7:
            s["format"] = r.choice(sorted(FORMATS))
        return s
    if k in ("integer", "number"):
        return rand_bounds(r, {"type": k})
    if k in ("boolean", "null"):
        return {"type": k}
    if k == "enum":
        vals = r.sample([1, 2.5, "a", "b c", True, None, "é", [1, 2], {"k": 1}, -3, ""], r.randint(1, 4))
        s = {"enum": vals}
        if r.random() < 0.3:
            s["type"] = r.choice(["string", "integer", ["string", "null"]])
            if not any(fits(v, s["type"]) for v in vals):
                s["enum"].append("fallback")
                s["type"] = "string" if s["type"] == "integer" else s["type"]
        return s
    if k == "const":
        return {"const": r.choice([0, "fixed", False, None, {"a": [1]}, 7.25])}
    if k == "object":
        props = {}
        for w in r.sample(WORDS, r.randint(0, 4)):
            props[w] = rand_schema(r, depth + 1, defs)
        s = {"type": "object", "properties": props}
        s["required"] = [p for p in props if r.random() < 0.5]
        if r.random() < 0.7:
            s["additionalProperties"] = False
        return s
    if k == "array":
        s = {"type": "array", "items": rand_schema(r, depth + 1, defs)}
        if r.random() < 0.5:
            s["minItems"] = r.randint(0, 2)
        if r.random() < 0.5:
            s["maxItems"] = s.get("minItems", 0) + r.randint(0, 3)
        return s
    if k == "anyOf":
        return {"anyOf": [rand_schema(r, depth + 1, defs) for _ in range(r.randint(1, 3))]}
    if k == "oneOf":
        ts = r.sample(["string", "integer", "boolean", "null", "object", "array"], r.randint(1, 3))
        return {"oneOf": [{"type": t} for t in ts]}
    if k == "types":
        return {"type": r.sample(["string", "integer", "boolean", "null"], 2)}
    return {"$ref": "#/$defs/" + r.choice(sorted(defs))}


def rand_bounds(r, s):
    """Random minimum / maximum / exclusive bounds, integers (on integers
    sometimes not); sometimes none, sometimes one side."""
    if r.random() < 0.4:
        return s
    lo, hi = sorted(r.sample(BOUNDS, 2))
    if r.random() < 0.2:
        hi = lo
    sides = r.choice(["both", "both", "lo", "hi"])
    if sides != "hi":
        s["exclusiveMinimum" if r.random() < 0.3 and lo != hi else "minimum"] = lo
    if sides != "lo":
        s["exclusiveMaximum" if r.random() < 0.3 and lo != hi else "maximum"] = hi
    if s["type"] == "integer" and "exclusiveMinimum" in s and "exclusiveMaximum" in s and hi - lo < 2:
        s["maximum"] = s.pop("exclusiveMaximum")  # (9, 10) holds no integer: the engine refuses it by design
    if s["type"] == "integer" and r.random() < 0.2:
        for key in [k for k in s if k != "type"]:  # non-integer bounds on integers, widened
            s[key] = s[key] + (-0.5 if "inimum" in key else 0.25)
    return s


def decimal(x, places):
    """x rounded to `places` decimals, zero without a sign: the grammar writes
    one spelling of zero (test_grammar.c refuses "-0"), and rounding a small
    negative number gives -0.0, which json.dumps writes as "-0.0"."""
    return round(x, places) + 0.0


def in_bounds(r, s):
    """A value inside s's bounds (integer, or a number with a few decimals)."""
    lo = s.get("minimum", s.get("exclusiveMinimum", -10**6))
    hi = s.get("maximum", s.get("exclusiveMaximum", 10**6))
    for _ in range(100):
        v = r.randint(int(lo) - 1, int(hi) + 1)
        if s["type"] == "number" and r.random() < 0.5:
            v = decimal(v + r.random(), r.randint(1, 4))
        if validates(s, v):
            return v
    return None


def validates(s, v):
    return jsonschema.Draft202012Validator(s, format_checker=FORMAT_CHECKER).is_valid(v)


FORMAT_CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER


def fits(v, t):
    ts = t if isinstance(t, list) else [t]
    for x in ts:
        if x == "string" and isinstance(v, str):
            return True
        if x == "integer" and isinstance(v, int) and not isinstance(v, bool):
            return True
        if x == "null" and v is None:
            return True
    return False


def make_schema(r):
    defs = {}
    if r.random() < 0.3:
        defs["leaf"] = {"type": "object", "properties": {"v": {"type": "integer"}}, "required": ["v"],
                        "additionalProperties": False}
    s = rand_schema(r, 0, defs)
    if defs:
        s = dict(s)
        s["$defs"] = defs
    return s


def instance(r, s, root):
    """A document valid under s (None when this generator cannot write one)."""
    if "$ref" in s:
        return instance(r, root["$defs"][s["$ref"].split("/")[-1]], root)
    if "const" in s:
        return s["const"]
    if "enum" in s:
        vals = [v for v in s["enum"] if "type" not in s or fits(v, s["type"])]
        return r.choice(vals)
    if "anyOf" in s or "oneOf" in s:
        return instance(r, r.choice(s.get("anyOf") or s.get("oneOf")), root)
    t = s.get("type", "object")
    if isinstance(t, list):
        t = r.choice(t)
    if t == "string" and "pattern" in s:
        return r.choice(dict(PATTERNS)[s["pattern"]])
    if t == "string" and "format" in s:
        return r.choice(FORMATS[s["format"]])
    if t == "string":
        n = r.randint(s.get("minLength", 0), s.get("maxLength", s.get("minLength", 0) + 4))
        return "".join(r.choice("ab é\"\\\n中") for _ in range(n))
    if t in ("integer", "number") and any(k in s for k in ("minimum", "maximum", "exclusiveMinimum",
                                                            "exclusiveMaximum")):
        return in_bounds(r, s)
    if t == "integer":
        return r.randint(-1000, 1000)
    if t == "number":
        return r.choice([r.randint(-50, 50), decimal(r.uniform(-100, 100), 3)])
    if t == "boolean":
        return r.random() < 0.5
    if t == "null":
        return None
    if t == "array":
        lo = s.get("minItems", 0)
        hi = s.get("maxItems", lo + 3)
        return [instance(r, s.get("items", {"type": "integer"}), root) for _ in range(r.randint(lo, hi))]
    if t == "object":
        out = {}
        for k, sub in s.get("properties", {}).items():
            if k in s.get("required", []) or r.random() < 0.5:
                out[k] = instance(r, sub, root)
        return out
    return None


def mutations(r, doc_text):
    out = [doc_text[:-1], doc_text + "x", doc_text.replace(":", ";", 1), "[" + doc_text, doc_text + doc_text]
    if len(doc_text) > 2:
        i = r.randrange(len(doc_text))
        out.append(doc_text[:i] + r.choice("{}[],:\"0a") + doc_text[i + 1:])
    return out


REGEXES = [
    r"^[A-Z][a-z]{2,5}(-\d{3})?$", r"(?:ab|c)*x\.", r"\d+(\.\d+)?", r"(a|)b", r"[^a-c\]]+", r"[\w.-]+@[a-z]+\.com",
    r"(?P<y>\d{4})-(\d\d)", r"\s*\S+", r"(yes|no|maybe)", r"é+中?", r"[0-9a-f]{8}", r"a{2}b{,2}c{1,}", r"x{",
    r"\(\)\[\]\{\}", r"[A-Z]\W\D", r"[\S\d]+\W*", r".{3}", r"(\+|-)?[1-9][0-9]*", r"\x41\u00e9\t?",
    # repetitions of bodies that can match nothing, nested in repetitions
    r"((a*){0,3}b?)*", r"(a?)*c?", r"(|a)*b", r"(((a?){0,3}){0,3}){0,3}b", r"((a?){0,9}b?){0,9}c", r"(((a?)*)*b?)*c",
]


def check_regexes(proc, r, failures):
    """Samples of each regex must re.fullmatch it; strings that fullmatch must be accepted."""
    sampled = 0
    for rx in REGEXES:
        docs = [d for d in ["Abc", "Abc-123", "x.", "ababx.", "12.5", "b", "ab", "xyz", "a@b.com", "2024-01",
                            "  q", "maybe", "éé中", "deadbeef", "aabbc", "x{", "()[]{}", "Q!x", "a\nb", "-12",
                            "Aé\t", "aababb", "aaab", "aaaab", "abaabc", "aabbc", "aac", "bab"] if re.fullmatch(rx, d)]
        if re.search(r"\\[dDwWsS]", rx):  # shorthands are ASCII-only: a subset of Python's
            docs = [d for d in docs if d.isascii()]
        req = {"lang": "regex", "text": rx, "seed": r.randrange(1 << 62), "samples": 6, "docs": docs}
        proc.stdin.write(json.dumps(req) + "\n")
        proc.stdin.flush()
        res = json.loads(proc.stdout.readline())
        if not res["ok"]:
            failures.append(f"regex {rx!r}: refused: {res['error']}")
            continue
        for s in res["samples"]:
            sampled += 1
            s = bytes.fromhex(s).decode("utf-8")  # a UnicodeDecodeError is a failure too
            if not re.fullmatch(rx, s):
                failures.append(f"regex {rx!r}: sampled {s!r} does not match")
        for d, ok in zip(docs, res["accepts"]):
            if not ok:
                failures.append(f"regex {rx!r}: matching {d!r} was rejected")
    return sampled


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("helper")
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else int(time.time() * 1000) % 1_000_000_007
    print(f"seed {seed} (replay: --seed {seed})")
    r = random.Random(seed)
    proc = subprocess.Popen([a.helper], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    failures, sampled, accepted, rejected, unfinished = [], 0, 0, 0, 0
    for i in range(a.count):
        schema = make_schema(r)
        validator = jsonschema.Draft202012Validator(schema, format_checker=FORMAT_CHECKER)
        docs = []
        for _ in range(3):
            d = instance(r, schema, schema)
            # ensure_ascii=False: names and enum/const strings are matched as the
            # schema spells them (a \u escape of them is not accepted)
            docs.append(json.dumps(d, separators=(",", ":"), ensure_ascii=False))
        muts = [m for d in docs for m in mutations(r, d)]
        req = {"lang": "json_schema", "text": json.dumps(schema), "seed": r.randrange(1 << 62), "samples": 4,
               "docs": docs + muts}
        proc.stdin.write(json.dumps(req) + "\n")
        proc.stdin.flush()
        res = json.loads(proc.stdout.readline())
        where = f"schema {i}: {json.dumps(schema)}"
        if not res["ok"]:
            failures.append(f"{where}: refused: {res['error']}")
            continue
        if res["bad"]:
            failures.append(f"{where}: {res['bad']} samples hit a dead end or a mask/accept disagreement")
        unfinished += res["unfinished"]
        for s in res["samples"]:
            sampled += 1
            try:
                s = bytes.fromhex(s).decode("utf-8")
                validator.validate(json.loads(s))
            except Exception as e:  # noqa: BLE001 - any failure is a finding
                failures.append(f"{where}: sampled {s!r} does not validate: {str(e)[:200]}")
        for d, ok in zip(docs, res["accepts"][:len(docs)]):
            accepted += ok
            if not ok:
                failures.append(f"{where}: valid document {d!r} was rejected")
        for m, ok in zip(muts, res["accepts"][len(docs):]):
            try:
                valid = validator.is_valid(json.loads(m))
            except ValueError:
                valid = False
            if ok and not valid:
                failures.append(f"{where}: invalid document {m!r} was accepted")
            rejected += not ok
    rx_sampled = check_regexes(proc, r, failures)
    proc.stdin.close()
    proc.wait()
    for f in failures[:20]:
        print("FAIL", f)
    print(f"{a.count} schemas, {sampled} sampled documents validated ({unfinished} samples unfinished), "
          f"{accepted} valid documents accepted, {rejected} mutations rejected; {len(REGEXES)} regexes, "
          f"{rx_sampled} samples matched; {len(failures)} failures")
    return 1 if failures or sampled < a.count else 0


if __name__ == "__main__":
    sys.exit(main())
