"""TLS parameters: a private CA (``ca_file``) and a client certificate (``cert_file``,
``key_file``) against a server that requires one."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import permit
from conftest import Server, unavailable


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _pki(dir: Path) -> None:
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=permit-test-ca", cwd=dir)
    for who, usage, san in (("server", "serverAuth", "subjectAltName=IP:127.0.0.1\n"), ("client", "clientAuth", "")):
        (dir / f"{who}.ext").write_text(f"basicConstraints=CA:FALSE\nextendedKeyUsage={usage}\n{san}")
        _openssl("req", *ec, "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj", f"/CN={who}", cwd=dir)
        _openssl(
            "x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{who}.pem", "-days", "1", "-extfile", f"{who}.ext", cwd=dir,
        )


def test_ca_file_and_client_certificate(name: str) -> None:
    if shutil.which("openssl") is None:
        unavailable("needs the openssl command to make test certificates (apt-get install openssl)")
    with tempfile.TemporaryDirectory() as temp:
        dir = Path(temp)
        _pki(dir)
        node = Server(
            dir / "data",
            ["--tls-cert", str(dir / "server.pem"), "--tls-key", str(dir / "server.key"), "--tls-client-ca", str(dir / "ca.pem")],
        )
        try:
            assert node.url.startswith("https://")
            with permit.Client(
                node.url, ca_file=str(dir / "ca.pem"), cert_file=str(dir / "client.pem"), key_file=str(dir / "client.key")
            ) as client, client.session() as session:
                with session.acquire(name, capacity=1) as p:
                    assert client.validate(name, p.token)
            # Without a client certificate the server refuses the handshake; without the CA
            # the client refuses the server's certificate. A certificate the client rejects is not retried.
            for options in ({"ca_file": str(dir / "ca.pem")}, {"cert_file": str(dir / "client.pem"), "key_file": str(dir / "client.key")}):
                with permit.Client(node.url, timeout=2.0, **options) as refused:  # type: ignore[arg-type]
                    with pytest.raises(permit.PermitError) as raised:
                        refused.semaphore(name)
                    assert raised.value.code in ("tls", "connection")
        finally:
            node.kill9()
