"""Self-signed TLS material for the emulator: the SDK refuses bearer tokens over plain HTTP."""

from __future__ import annotations

import datetime
import ipaddress
import os
import tempfile
from pathlib import Path

PRIVATE_MODE = 0o600


def write_private(path: Path, data: str | bytes) -> Path:
    """Write a secret file atomically, owner-only from its first byte.

    The temporary file is created 0600 (``mkstemp``), so no other user can open it even for a moment;
    replacing the target also replaces a pre-existing file that had a wider mode.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, PRIVATE_MODE)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def make_private(path: Path) -> Path:
    """Fix the mode of an existing secret file (one written by an older version or by hand)."""
    if path.stat().st_mode & 0o077:
        path.chmod(PRIVATE_MODE)
    return path


def ensure_self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """Create (once) a CA-less self-signed certificate valid for 127.0.0.1 and localhost.

    Returns ``(cert_path, key_path)``. The certificate doubles as the CA bundle that
    clients pass as ``connection_verify``, so TLS verification stays on.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    cert_path = directory / "ca.pem"
    key_path = directory / "key.pem"
    if cert_path.exists() and key_path.exists():
        make_private(key_path)
        return cert_path, key_path
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "airflow-azureml-emulator")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    write_private(
        key_path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path
