#!/usr/bin/env python3
"""List C functions longer than a limit, so a long one is seen before it grows.

Usage: scripts/long-functions.py [--quiet] MAX PATH...

Each PATH is a file or a folder (searched for .c, .h, .cu, .cuh, .cpp). A
function's length is counted in lines from the line that names it to the line
of its closing brace, both included. Prints one line per function over MAX,
longest first, as `LINES path:line name`, then a summary line
`N functions over MAX lines (of M)`; with --quiet only the summary. Exits 1
when any function is over MAX, 0 otherwise, so CI can call it as a check.

The scanner is deliberately small: it strips comments, string and character
literals and preprocessor lines, then takes every top-level `{` whose text
before it ends in `)` (or `) const`, attributes, a K&R-free C11 signature) as a
function body. Initialisers (`= {`), struct/union/enum bodies and
`extern "C" {` / `namespace x {` blocks are not functions; the last two are
looked into.
"""
import os
import re
import sys

EXTS = (".c", ".h", ".cu", ".cuh", ".cpp")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")
CONTROL = {"if", "for", "while", "switch", "return", "sizeof", "do", "else"}


def strip(text):
    """Blank comments, literals and preprocessor lines, keeping newlines."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if line_start and c == "#":
            # A directive runs to an unescaped newline.
            while i < n and not (text[i] == "\n" and text[i - 1] != "\\"):
                out.append("\n" if text[i] == "\n" else " ")
                i += 1
            continue
        line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join("\n" if ch == "\n" else " " for ch in text[i:j]))
            i = j
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            lit = text[i:j]
            out.append(c + "".join("\n" if ch == "\n" else " " for ch in lit[1:-1]) + c)
            i = j
            continue
        if c == "\n":
            line_start = True
        out.append(c)
        i += 1
    return "".join(out)


def name_before(head):
    """The function name in a signature `... name(args) attrs`, or None."""
    head = head.rstrip()
    # Trailing qualifiers/attributes after the parameter list.
    while True:
        m = re.search(r"(const|noexcept|override|__attribute__\s*\(\(.*\)\))\s*$", head)
        if not m:
            break
        head = head[: m.start()].rstrip()
    if not head.endswith(")"):
        return None
    depth = 0
    for k in range(len(head) - 1, -1, -1):
        if head[k] == ")":
            depth += 1
        elif head[k] == "(":
            depth -= 1
            if depth == 0:
                m = IDENT.search(head[:k].rstrip())
                if not m or m.group(0) in CONTROL:
                    return None
                return m.group(0)
    return None


def functions(path):
    """Yield (name, first line, last line) for each function defined in path."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = strip(f.read())
    depth = 0
    stack = []          # one entry per open brace: (kind, name, start line)
    last_stmt = 0       # offset just after the last top-level ; } or {
    line = 1
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == "{":
            kind, name, start = "block", None, line
            if all(k == "scope" for k, _, _ in stack):
                head = text[last_stmt:i]
                name = name_before(head)
                if re.search(r"(extern\s*\"\s*\"|namespace(\s+\w+)?)\s*$", head):
                    kind = "scope"
                elif name and not re.search(r"=\s*$", head) and \
                        not re.search(r"\b(struct|union|enum)\b[^()]*$", head):
                    kind = "func"
                    # The function starts on the line that names it.
                    m = re.search(r"\b" + re.escape(name) + r"\s*\(", head)
                    start = line - head[m.start():].count("\n")
                last_stmt = i + 1
            stack.append((kind, name, start))
            depth += 1
        elif c == "}":
            if stack:
                kind, name, start = stack.pop()
                if kind == "func":
                    yield name, start, line
            if all(k == "scope" for k, _, _ in stack):
                last_stmt = i + 1
        elif c == ";" and all(k == "scope" for k, _, _ in stack):
            last_stmt = i + 1


def files(paths):
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, names in os.walk(p):
                dirs.sort()
                for n in sorted(names):
                    if n.endswith(EXTS):
                        yield os.path.join(root, n)
        else:
            yield p


def main(argv):
    quiet = "--quiet" in argv
    args = [a for a in argv if a != "--quiet"]
    if len(args) < 2 or not args[0].isdigit():
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    limit = int(args[0])
    total, over = 0, []
    for path in files(args[1:]):
        for name, first, last in functions(path):
            total += 1
            length = last - first + 1
            if length > limit:
                over.append((length, path, first, name))
    over.sort(key=lambda r: (-r[0], r[1], r[2]))
    if not quiet:
        for length, path, first, name in over:
            print(f"{length:5d} {path}:{first} {name}")
    print(f"{len(over)} functions over {limit} lines (of {total})")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
