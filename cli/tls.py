"""A private CA and a certificate for the control plane, made with `openssl` (argv, no shell):
for `gpuctl up --tls` and for tests. A real fleet brings its own, from its PKI."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import click


@dataclass(frozen=True)
class Certificates:
    ca: Path  # what clients trust (--ca-file)
    cert: Path  # the server's (--tls-cert)
    key: Path  # its private key (--tls-key)


def make_certificates(directory: Path, hosts=("127.0.0.1", "localhost"), days: int = 365):
    """A CA and a server certificate for `hosts` in `directory`, made once and then reused."""
    made = Certificates(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    if all(p.exists() for p in (made.ca, made.cert, made.key)):
        return made
    openssl = shutil.which("openssl")
    if openssl is None:
        raise click.ClickException("openssl is needed to make a CA for --tls (apt install openssl)")
    directory.mkdir(parents=True, exist_ok=True)
    names = ",".join(f"IP:{h}" if h.replace(".", "").isdigit() else f"DNS:{h}" for h in hosts)
    extensions = directory / "server.ext"
    extensions.write_text(
        f"subjectAltName={names}\nextendedKeyUsage=serverAuth\n"
        "keyUsage=critical,digitalSignature\nbasicConstraints=critical,CA:FALSE\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ca_key = directory / "ca.key"
    csr = directory / "server.csr"
    steps = [
        [openssl, "req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(made.ca),
         "-days", str(days), "-subj", "/CN=gpufleet CA",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        [openssl, "req", *ec, "-keyout", str(made.key), "-out", str(csr),
         "-subj", "/CN=gpufleet control plane"],
        [openssl, "x509", "-req", "-in", str(csr), "-CA", str(made.ca), "-CAkey", str(ca_key),
         "-CAcreateserial", "-out", str(made.cert), "-days", str(days),
         "-extfile", str(extensions)],
    ]  # fmt: skip
    for argv in steps:
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise click.ClickException(f"openssl failed: {done.stderr.strip()[-500:]}")
    for secret in (ca_key, made.key):
        secret.chmod(0o600)
    return made
