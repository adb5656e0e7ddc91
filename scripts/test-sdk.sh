#!/bin/sh
# scripts/test-sdk.sh — prove the installed SDK is enough to write a plugin.
#
# Installs loom from BUILD_DIR into a temporary --destdir, copies
# examples/plugin-hello out of the source tree, builds it with make using
# only pkg-config (restricted to the installed loom-plugin.pc), then checks
# that the installed `loom` passes it through the conformance kit (`loom
# plugin-test --quick`), lists the hello sampler and validates a pipeline
# using it (and rejects an unknown key of it). Then builds examples/embed
# against the installed loom.pc and runs the hello sampler inside it: a
# sampler that does not declare candidates() receives whole rows for
# greedy and top-k requests.
#
# usage: scripts/test-sdk.sh BUILD_DIR [TEST_PLUGIN_DIR]
#   TEST_PLUGIN_DIR: the build's tests/plugin/good (tback, tsched, tcache);
#   without it the other slots use the real cpu/continuous/paged plugins.
# Exit 0 on success, 1 on any failure (with what failed on stderr).
set -eu

fail() { echo "test-sdk: FAIL: $*" >&2; exit 1; }

[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [TEST_PLUGIN_DIR]" >&2; exit 2; }
BUILD=$(cd "$1" && pwd)
TEST_PLUGINS=${2:-}
SRC=$(cd "$(dirname "$0")/.." && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/loom-sdk-XXXXXX")
trap 'rm -rf "$TMP"' EXIT INT TERM
DEST=$TMP/dest

echo "test-sdk: installing $BUILD into $DEST"
meson install -C "$BUILD" --destdir "$DEST" --no-rebuild >"$TMP/install.log" 2>&1 ||
    { cat "$TMP/install.log" >&2; fail "meson install"; }

LOOM=$(find "$DEST" -path '*/bin/loom' -type f | head -n 1)
PC=$(find "$DEST" -name loom-plugin.pc | head -n 1)
[ -x "$LOOM" ] || fail "no bin/loom installed"
[ -n "$PC" ] || fail "no loom-plugin.pc installed"
PCDIR=$(dirname "$PC")
INCDIR=$(dirname "$(find "$DEST" -path '*/include/loom/plugin.h' | head -n 1)")
[ -d "$INCDIR" ] || fail "loom/plugin.h not installed"
# Every public header of the source tree must be installed and compile on
# its own against the installed tree (a plugin of any kind needs them all).
for h in "$SRC"/include/loom/*.h; do
    name=$(basename "$h")
    [ -f "$INCDIR/$name" ] || fail "header loom/$name is not installed (list it in include/loom/meson.build)"
done
for h in "$SRC"/include/loom/*.h; do
    name=$(basename "$h")
    printf '#include "loom/%s"\nint main(void) { return 0; }\n' "$name" >"$TMP/hdr.c"
    ${CC:-cc} -std=c11 -fsyntax-only -I"$(dirname "$INCDIR")" "$TMP/hdr.c" 2>"$TMP/hdr.log" ||
        { cat "$TMP/hdr.log" >&2; fail "installed loom/$name does not compile on its own"; }
done

# pkg-config sees only the installed .pc; the sysroot maps its paths into DEST.
export PKG_CONFIG_LIBDIR="$PCDIR" PKG_CONFIG_PATH="" PKG_CONFIG_SYSROOT_DIR="$DEST"
CFLAGS_SDK=$(pkg-config --cflags loom-plugin) || fail "pkg-config --cflags loom-plugin"
case "$CFLAGS_SDK" in *"$SRC"*) fail "SDK cflags point into the source tree: $CFLAGS_SDK" ;; esac
PLUGINDIR=$(pkg-config --variable=plugindir loom-plugin)
[ -n "$PLUGINDIR" ] || fail "loom-plugin.pc has no plugindir variable"
echo "test-sdk: cflags $CFLAGS_SDK; plugindir $PLUGINDIR"

cp -R "$SRC/examples/plugin-hello" "$TMP/hello"
rm -rf "$TMP/hello/build"
make -s -C "$TMP/hello" OUT="$TMP/hello/out" >"$TMP/make.log" 2>&1 ||
    { cat "$TMP/make.log" >&2; fail "building the example against the installed SDK"; }
[ -f "$TMP/hello/out/loom-sampler-hello.so" ] || fail "example produced no loom-sampler-hello.so"

# The example must pass the conformance kit, as docs/plugin-guide.md tells
# every plugin author to (--quick: a fifth of the iterations).
"$LOOM" plugin-test "$TMP/hello/out/loom-sampler-hello.so" --quick >"$TMP/plugin-test.txt" 2>&1 ||
    { cat "$TMP/plugin-test.txt" >&2; fail "loom plugin-test: the hello example fails the conformance kit"; }
grep -q 'sampler hello-topk: sample.candidates' "$TMP/plugin-test.txt" ||
    { cat "$TMP/plugin-test.txt" >&2; fail "loom plugin-test did not test both hello components"; }

PLUGIN_PATH="$TMP/hello/out"
[ -n "$TEST_PLUGINS" ] && PLUGIN_PATH="$PLUGIN_PATH:$TEST_PLUGINS"
export LOOM_PLUGIN_PATH="$PLUGIN_PATH"
unset LOOM_PLUGIN_PATH_ONLY

"$LOOM" plugins >"$TMP/plugins.txt" 2>&1 || { cat "$TMP/plugins.txt" >&2; fail "loom plugins"; }
grep -Eq '^sampler +hello +1\.0\.0 +2\.[0-9]+ ' "$TMP/plugins.txt" ||
    { cat "$TMP/plugins.txt" >&2; fail "'loom plugins' does not list the hello sampler"; }
"$LOOM" plugins --params >"$TMP/params.txt" 2>&1 || fail "loom plugins --params"
grep -q 'greeting' "$TMP/params.txt" || fail "'loom plugins --params' lacks hello's greeting"

if [ -n "$TEST_PLUGINS" ]; then
    BACKEND=tback SCHEDULER=tsched CACHE=tcache CACHE_SIZE=""
else
    # a small pool: sized from free memory it would take most of the machine
    BACKEND=cpu SCHEDULER=continuous CACHE=paged CACHE_SIZE=", num_blocks: 256"
fi
cat >"$TMP/hello.yaml" <<YAML
model: {format: dummy, shape: tiny}
backend: {plugin: $BACKEND}
scheduler: {plugin: $SCHEDULER}
cache: {plugin: $CACHE$CACHE_SIZE}
sampler: {plugin: hello, greeting: "hi from the SDK test"}
YAML
"$LOOM" check "$TMP/hello.yaml" >"$TMP/check.txt" 2>&1 ||
    { cat "$TMP/check.txt" >&2; fail "loom check with sampler: {plugin: hello}"; }
grep -q "plugin: hello  # $TMP/hello/out/loom-sampler-hello.so" "$TMP/check.txt" ||
    { cat "$TMP/check.txt" >&2; fail "resolved config does not show the hello plugin's file"; }

if "$LOOM" check "$TMP/hello.yaml" --set sampler.greting=x >"$TMP/bad.txt" 2>&1; then
    fail "loom check accepted an unknown key of the hello sampler"
fi
grep -q "sampler.greting: unknown key; did you mean 'greeting'" "$TMP/bad.txt" ||
    { cat "$TMP/bad.txt" >&2; fail "unknown-key message for the hello sampler"; }

# A program that embeds libloom, built with `pkg-config loom` only.
PC2=$(find "$DEST" -name loom.pc | head -n 1)
[ -n "$PC2" ] || fail "no loom.pc installed"
LIBDIR=$(dirname "$(find "$DEST" -name 'libloom.so*' | head -n 1)")
cp -R "$SRC/examples/embed" "$TMP/embed"
rm -rf "$TMP/embed/build"
# A sanitized libloom needs its runtime first in the program that loads it.
EMBED_CFLAGS="-O2 -g" EMBED_LDFLAGS=""
if ldd "$(find "$LIBDIR" -name 'libloom.so*' | head -n 1)" | grep -q libasan; then
    EMBED_CFLAGS="-O1 -g -fsanitize=address,undefined" EMBED_LDFLAGS="-fsanitize=address,undefined"
fi
make -s -C "$TMP/embed" OUT="$TMP/embed/out" CFLAGS="$EMBED_CFLAGS" LDFLAGS="$EMBED_LDFLAGS" \
    >"$TMP/make-embed.log" 2>&1 ||
    { cat "$TMP/make-embed.log" >&2; fail "building examples/embed against the installed loom.pc"; }
[ -x "$TMP/embed/out/embed" ] || fail "examples/embed produced no program"
embed() { LD_LIBRARY_PATH="$LIBDIR" "$TMP/embed/out/embed" "$@"; }

if [ -z "$TEST_PLUGINS" ]; then
    # The embedded engine runs the out-of-tree sampler. One that does not
    # declare candidates() gets whole rows for greedy and top-k requests
    # (the cpu backend could reduce them: it has forward_topk); one that
    # declares them gets candidate rows, so the check can see a difference.
    for args in "--temperature 0" "--temperature 0.8 --top-k 5 --seed 3"; do
        # shellcheck disable=SC2086
        embed "$TMP/hello.yaml" --tokens 1,2,3,4 --max-tokens 6 $args --set engine.log_level=info \
            >"$TMP/embed.txt" 2>&1 || { cat "$TMP/embed.txt" >&2; fail "embed with the hello sampler ($args)"; }
        grep -q 'whole rows: 1 of width 256 (vocab 256)' "$TMP/embed.txt" ||
            { cat "$TMP/embed.txt" >&2; fail "hello sampler saw no whole rows ($args)"; }
        if grep -q 'candidate rows' "$TMP/embed.txt"; then
            cat "$TMP/embed.txt" >&2; fail "hello (no candidates() declared) was handed candidate rows ($args)"
        fi
        grep -q 'generated 6' "$TMP/embed.txt" || { cat "$TMP/embed.txt" >&2; fail "embed did not generate 6 tokens"; }
    done
    embed "$TMP/hello.yaml" --tokens 1,2,3,4 --max-tokens 6 --set sampler.plugin=hello-topk \
        --set engine.log_level=info >"$TMP/embed.txt" 2>&1 || { cat "$TMP/embed.txt" >&2; fail "embed, hello-topk"; }
    grep -q 'candidate rows: 1 of width 1 (vocab 256)' "$TMP/embed.txt" ||
        { cat "$TMP/embed.txt" >&2; fail "hello-topk (candidates() declared) got no candidate rows"; }
fi
if embed "$TMP/hello.yaml" --tokens 1,2 --set engine.nope=1 >"$TMP/embed.txt" 2>&1; then
    fail "embed accepted an unknown pipeline key"
fi
grep -q "engine.nope" "$TMP/embed.txt" || { cat "$TMP/embed.txt" >&2; fail "embed's error does not name the key"; }

echo "test-sdk: OK (installed loom lists and loads the out-of-tree hello plugin; examples/embed builds against loom.pc)"
