# Sourced first by the scripts that run on the GPU machine (staged beside
# them in .cudarun by tools/gpu/stage.sh): enters the staged directory and
# sets R (the repository root there), OUT (created; the run tool's $OUT, or
# /tmp/strata-gpu-out) and the paths of the staged libraries (the image
# lacks Strata's Debian ones) and of UCX's transport plugins.
cd "$(dirname "${BASH_SOURCE[0]}")" || exit 1
R=$(cd .. && pwd)
OUT=${OUT:-/tmp/strata-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64
export UCX_MODULE_DIR=$PWD/lib/ucx
# The Qwen3 tokenizer travels xz-packed (stage.sh); unpack it once.
if [ -f qwen3-tokenizer.tar.xz ] && [ ! -d qwen3-tokenizer ]; then tar -xJf qwen3-tokenizer.tar.xz; fi
