#!/usr/bin/env bash
# Builds bench/cutlass24/build/libsparse24.so for H100 (sm_90a) on any x86-64 Linux machine, GPU or not: the CUDA
# 13.0 compiler and CUTLASS's headers come as wheels from PyPI into a cache, nothing is installed system-wide.
# Usage: bash bench/cutlass24/build.sh   (needs g++ and ~10 minutes on 2 cores; CUDA 13.0 matches torch's cu130)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${SPARSEBERT_CUDA_CACHE:-$HOME/.cache/sparsebert-cuda13}"
out="$here/build"
mkdir -p "$cache/whl" "$out"
if [ ! -x "$cache/root/nvidia/cu13/bin/nvcc" ] || [ ! -d "$cache/root/cutlass_library" ]; then
  python3 -m pip download --no-deps --quiet -d "$cache/whl" \
    nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 \
    nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cutlass==4.2.0.0
  for wheel in "$cache"/whl/*.whl; do python3 -m zipfile -e "$wheel" "$cache/root"; done
  chmod +x "$cache"/root/nvidia/cu13/bin/* "$cache"/root/nvidia/cu13/nvvm/bin/*
fi
cuda="$cache/root/nvidia/cu13"
cutlass="$cache/root/cutlass_library/source"
# --expt-relaxed-constexpr and C++17 are what CUTLASS 3+ needs; -DNDEBUG drops its device asserts.
"$cuda/bin/nvcc" -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -arch=sm_90a \
  -I"$cuda/include" -isystem "$cuda/include/cccl" -I"$cutlass/include" -I"$cutlass/tools/util/include" \
  -shared -Xcompiler -fPIC -cudart static -L"$cuda/lib" \
  "$here/sparse24.cu" -o "$out/libsparse24.so.tmp"
mv "$out/libsparse24.so.tmp" "$out/libsparse24.so"
echo "built $out/libsparse24.so"
