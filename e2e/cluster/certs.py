"""Certificates for the e2e control plane: one CA, the API server's serving cert, client certs.

Owns the PKI files under one directory, made with the openssl CLI; never reused across
clusters and never written outside the directory it is given.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVER_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
SERVER_IPS = ("127.0.0.1", "10.96.0.1")


@dataclass(frozen=True)
class Pki:
    """Paths of the files the control plane and its clients need."""

    root: Path

    def path(self, name: str) -> Path:
        return self.root / name

    @property
    def ca(self) -> Path:
        return self.path("ca.crt")

    @property
    def front_proxy_ca(self) -> Path:
        return self.path("front-proxy-ca.crt")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(root: Path, name: str, subject: str) -> None:
    _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=root)
    _openssl(
        "req", "-x509", "-new", "-nodes", "-key", f"{name}.key", "-sha256", "-days", "30",
        "-subj", subject, "-out", f"{name}.crt", cwd=root,
    )  # fmt: skip


def _signed(
    root: Path, name: str, subject: str, ca: str, *, server_ips: tuple[str, ...] = ()
) -> None:
    _openssl("genrsa", "-out", f"{name}.key", "2048", cwd=root)
    _openssl(
        "req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=root
    )
    ext = root / f"{name}.ext"
    lines = ["basicConstraints=CA:FALSE", "keyUsage=digitalSignature,keyEncipherment"]
    if server_ips:
        alt = [f"DNS:{n}" for n in SERVER_NAMES] + [f"IP:{ip}" for ip in server_ips]
        lines += ["extendedKeyUsage=serverAuth", "subjectAltName=" + ",".join(alt)]
    else:
        lines.append("extendedKeyUsage=clientAuth")
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
        "-CAcreateserial", "-out", f"{name}.crt", "-days", "30", "-sha256", "-extfile", ext.name,
        cwd=root,
    )  # fmt: skip


def make_pki(root: Path, extra_ips: tuple[str, ...] = ()) -> Pki:
    """Writes a fresh PKI into `root` (created) and returns its paths; the API server's
    certificate also names `extra_ips` (a real node's address)."""
    root.mkdir(parents=True, exist_ok=True)
    _ca(root, "ca", "/CN=loom-e2e-ca")
    _ca(root, "front-proxy-ca", "/CN=loom-e2e-front-proxy-ca")
    _signed(root, "apiserver", "/CN=kube-apiserver", "ca", server_ips=(*SERVER_IPS, *extra_ips))
    _signed(root, "admin", "/O=system:masters/CN=loom-e2e-admin", "ca")
    _signed(root, "front-proxy-client", "/CN=front-proxy-client", "front-proxy-ca")
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=root)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=root)
    return Pki(root)
