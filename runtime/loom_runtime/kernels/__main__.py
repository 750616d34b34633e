"""`python -m loom_runtime.kernels`: compile Loom's CPU kernels for this machine unless built."""

from __future__ import annotations

import sys

from loom_runtime.kernels.build import build, library_path


def main() -> int:
    target = library_path()
    if target.exists():
        print(f"Loom's CPU kernels: up to date at {target}")
        return 0
    print(f"Loom's CPU kernels: compiling into {target} (~15 s)", flush=True)
    build(target)
    print(f"Loom's CPU kernels: built {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
