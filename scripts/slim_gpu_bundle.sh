#!/usr/bin/env bash
# Shrink .gpu/ (built by ../shared/tools/make_gpu_bundle.sh) so that it fits the device tool's
# carry limit: the working tree plus what is carried must stay under 64 MiB, and .gpu's wheels
# (numpy alone is 18 MB, zip-compressed) pushed it over once perf/results had grown.
# The wheels are unpacked into one xz archive (about half their size) that .gpu/env.sh extracts
# into its venv instead of pip-installing them; installing a wheel with --no-compile --target
# into an empty site-packages is the same unpacking.
# It also marks the image's scipy and scikit-learn absent in that venv: both are built for numpy 2,
# and since 2026-12-02 the image's transformers imports scikit-learn when it finds it (diffusers ->
# peft -> transformers.generation), which fails under the numpy 1.26 the Python backend needs.
# A .pth line sets sys.modules[name] = None: find_spec then answers None and import raises ImportError.
# Since 2026-12-04 the tracked tree (31 MB) plus .gpu (51 MB built, 38 MB after the above) went over
# the limit again, so it also drops numpy's own tests, strips the debug symbols of rapidjson's .so
# and of tritonserver's executable and library (strip --strip-unneeded; the stripped server ran the
# H200 scheduler ladder that day), and packs both archives with xz -9: .gpu comes to ~34 MB, and
# replaces ICU's data library with a stub (below): ~27 MB; ~26.5 MB since diffusers' unused pipelines
# are pruned (below, session 42).
#
#   bash scripts/slim_gpu_bundle.sh                   (from the checkout root, after make_gpu_bundle.sh)
#   WITH_FRONTEND=1 bash scripts/slim_gpu_bundle.sh   (also the front end's packages: below)
set -euo pipefail
cd "$(dirname "$0")/.."
G=.gpu
if [ -f $G/site.txz ] && [ ! -d $G/whl ]; then
    echo "slim_gpu_bundle: $G is already slim ($(du -sh $G | cut -f1))"; exit 0
fi
[ -d $G/whl ] || { echo "slim_gpu_bundle: no $G/whl; build the bundle first: bash ../shared/tools/make_gpu_bundle.sh" >&2; exit 1; }
grep -q '^python3 -m pip install .*\$_G/whl/\*\.whl' $G/env.sh || {
    echo "slim_gpu_bundle: $G/env.sh has no 'python3 -m pip install ... \$_G/whl/*.whl' line to replace" >&2; exit 1; }
# The device image has no ftfy, which diffusers' Wan pipelines call when they clean a prompt
# (building tiny-wan-i2v there raised NameError: name 'ftfy' is not defined, 2026-12-04).
python3 -m pip download -q --no-deps -d $G/whl ftfy wcwidth
# WITH_FRONTEND=1: the front end's packages that the device image lacks (FastAPI, Starlette,
# pydantic, uvicorn, python-multipart and their own needs; the image has anyio, click, h11, idna and
# annotated-doc; typing-extensions comes too, as pydantic needs 4.16: ../.library/device/KINDS.md),
# for `perf/accel_bench.py --frontend` (accel rows ROW@fe). They add ~2 MB, which puts the tree
# plus .gpu over the device tool's 64 MiB (session 42: 38 MB tracked + 28.6 MB): for such a call,
# move perf/results' training sample PNGs (3.8 MB) out of the checkout and back afterwards.
if [ "${WITH_FRONTEND:-0}" = 1 ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d $G/whl \
        fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
        typing-inspection==0.4.5 typing-extensions==4.16.0 opentelemetry-api==1.45.3 uvicorn==0.55.0 \
        python-multipart==0.0.34
fi
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
for wheel in $G/whl/*.whl; do
    echo "slim_gpu_bundle: unpacking $(basename "$wheel")"
    python3 -m zipfile -e "$wheel" "$site"
done
find "$site/numpy" -type d -name tests -prune -exec rm -rf {} +
# diffusers' pipelines of families we do not serve (13 of its 16 MB of pipelines) and its modular
# pipelines (3.7 MB), to make room for the front end's packages: kept are the pipelines our adapters
# and perf/ import (PixArt-Sigma, FLUX.1, SD3, Wan2.1 / 2.2, Qwen-Image) and stable_diffusion, which
# they import from. diffusers imports both lazily, so the rest are never read (checked on the CPU
# host with a copy pruned so, 2026-12-05: every models/tiny-* loads with
# DiffusionPipeline.from_pretrained, and the tiny PixArt and Wan pipelines generate; on the GPU host,
# session 42's front-end calls ran full-size PixArt, raw and served, from the pruned bundle).
rm -rf "$site/diffusers/modular_pipelines"
for pipeline in "$site"/diffusers/pipelines/*/; do
    case "$(basename "$pipeline")" in
        pixart_alpha|flux|stable_diffusion_3|wan|qwenimage|stable_diffusion) ;;
        *) rm -rf "$pipeline" ;;
    esac
done
strip --strip-unneeded "$site"/rapidjson*.so
echo "slim_gpu_bundle: packing $(du -sh "$site" | cut -f1) into $G/site.txz (xz -9, ~40 s)"
XZ_OPT=-9 tar cJf $G/site.txz -C "$site" .
server=$(mktemp -d)
trap 'rm -rf "$site" "$server"' EXIT
tar xJf $G/tritonserver.txz -C "$server"
strip --strip-unneeded "$server"/pytriton/tritonserver/bin/tritonserver "$server"/nvidia_pytriton.libs/libtritonserver-*.so
# ICU's data library (29 MB, 7 MB in xz) is there only because libxml2 links ICU, and Triton parses
# XML only for cloud-storage model repositories; a stub with its one symbol and soname takes its place.
icudata=$(ls "$server"/nvidia_pytriton.libs/libicudata-*.so.* 2>/dev/null || true)
if [ -n "$icudata" ] && command -v gcc >/dev/null; then
    echo "slim_gpu_bundle: replacing $(basename "$icudata") with a stub (ICU data is never loaded)"
    symbol=$(nm -D --defined-only "$icudata" | awk '/ R icudt[0-9]+_dat$/ {print $3}')
    echo "__attribute__((aligned(16))) const unsigned char $symbol[32] = {0};" > "$server/icudata_stub.c"
    gcc -shared -fPIC -Wl,-soname,"$(basename "$icudata")" -o "$icudata" "$server/icudata_stub.c"
    rm "$server/icudata_stub.c"
else
    echo "slim_gpu_bundle: keeping ICU's data library (no gcc here, or the wheel has none)"
fi
echo "slim_gpu_bundle: repacking $G/tritonserver.txz with its server stripped (xz -9, ~70 s)"
XZ_OPT=-9 tar cJf $G/tritonserver.txz -C "$server" .
HIDE='import sys; sys.modules.update(dict.fromkeys(("scipy", "sklearn")))'
sed -i "s|^python3 -m pip install .*\\\$_G/whl/\\*\\.whl.*\$|tar xJf \$_G/site.txz -C \$_SITE   # the wheels, unpacked (scripts/slim_gpu_bundle.sh)\necho '$HIDE' > \$_SITE/00_numpy2_only_absent.pth|" $G/env.sh
rm -rf $G/whl
echo "slim_gpu_bundle: $G is now $(du -sh $G | cut -f1)"
