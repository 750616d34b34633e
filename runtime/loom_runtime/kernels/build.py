"""Compile Loom's CPU kernels into the per-machine cache (`python -m loom_runtime.kernels`).

The cache key covers the sources, the compiler flags, torch's version and this CPU's feature
flags (the code is built with -march=native), so a copy of the cache on another CPU rebuilds
instead of running instructions that CPU lacks. A finished build is moved into place in one
rename: a process never loads a half-written library.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import tempfile
from pathlib import Path

import torch

SOURCES = ("paged_decode.cpp",)
# -ffast-math lets the compiler vectorise the softmax's exp (glibc's vector expf) and reorder
# the sums; the kernel keeps every sum's order fixed per sequence, so results stay batch-invariant.
FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp")
BUILD_TIMEOUT_S = 600
NAME = "loom_kernels"
CACHE_ENV = "LOOM_KERNEL_CACHE"


def cache_root() -> Path:
    default = Path.home() / ".cache" / "loom" / "kernels"
    return Path(os.environ.get(CACHE_ENV) or default)


def cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def key() -> str:
    h = hashlib.sha256()
    for name in SOURCES:
        h.update((Path(__file__).parent / name).read_bytes())
    for part in (*FLAGS, torch.__version__, platform.machine(), cpu_flags()):
        h.update(part.encode())
    return h.hexdigest()[:16]


def library_path() -> Path:
    return cache_root() / key() / f"{NAME}.so"


def build(target: Path) -> None:
    from torch.utils.cpp_extension import load

    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=target.parent))
    try:
        load(
            NAME,
            [str(Path(__file__).parent / name) for name in SOURCES],
            extra_cflags=list(FLAGS),
            extra_ldflags=["-fopenmp"],
            build_directory=str(work),
            is_python_module=False,
        )
        os.replace(work / f"{NAME}.so", target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
