"""Build the 2:4 kernel library (``sparse24.cu``) for sm90 GPUs (sm_90a): ``python -m sparsebert.kernels.build``.

No GPU and no CUDA install needed: CUDA 13.0's compiler (matching torch's cu130 wheels) and CUTLASS 4.2's headers
come as wheels from PyPI into a cache (about 105 MB, once), then nvcc compiles (about 4 minutes on 2 cores, needs
``g++``). The library links the CUDA runtime statically and no torch headers, so it serves any torch build. The
result is written atomically to ``sparsebert.kernels.sparse24_library()`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from . import SOURCE_DIR, kernel_dir, sparse24_library

WHEELS = (
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cutlass==4.2.0.0",
)
# CUTLASS 3+ needs C++17 and relaxed constexpr; -DNDEBUG drops its device asserts; sm_90a enables Hopper's wgmma.
NVCC_FLAGS = ("-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-arch=sm_90a", "-shared",
              "-Xcompiler", "-fPIC", "-cudart", "static")


def toolchain(cache: Path) -> tuple[Path, Path]:
    """The CUDA root and CUTLASS's source root, unpacked from PyPI wheels into ``cache`` once."""
    root = cache / "root"
    cuda, cutlass = root / "nvidia" / "cu13", root / "cutlass_library" / "source"
    done = root / ".complete"  # written last: a half-unpacked toolchain is unpacked again
    if not done.exists():
        wheels = cache / "wheels"
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheels),
                        *WHEELS], check=True)
        for wheel in sorted(wheels.glob("*.whl")):
            with zipfile.ZipFile(wheel) as z:
                z.extractall(root)
        for tool in [*(cuda / "bin").iterdir(), *(cuda / "nvvm" / "bin").iterdir()]:
            if tool.is_file():
                tool.chmod(0o755)
        done.touch()
    return cuda, cutlass


def nvcc_command(cuda: Path, cutlass: Path, source: Path, out: Path) -> list[str]:
    return [str(cuda / "bin" / "nvcc"), *NVCC_FLAGS, f"-I{cuda / 'include'}", "-isystem",
            str(cuda / "include" / "cccl"), f"-I{cutlass / 'include'}", f"-I{cutlass / 'tools' / 'util' / 'include'}",
            f"-L{cuda / 'lib'}", str(source), "-o", str(out)]


def build(out: Path, cache: Path) -> Path:
    cuda, cutlass = toolchain(cache)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        subprocess.run(nvcc_command(cuda, cutlass, SOURCE_DIR / "sparse24.cu", tmp), check=True)
        os.replace(tmp, out)  # a failed build leaves no library a later run would load
    finally:
        tmp.unlink(missing_ok=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=sparse24_library())
    p.add_argument("--cache", type=Path, default=kernel_dir() / "toolchain",
                   help="where the compiler and CUTLASS wheels are unpacked")
    args = p.parse_args()
    try:
        print(f"built {build(args.out, args.cache)}")
    except (subprocess.CalledProcessError, OSError, zipfile.BadZipFile) as e:
        sys.exit(f"sparsebert.kernels.build: {e}")


if __name__ == "__main__":
    main()
