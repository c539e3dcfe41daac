"""A throwaway CA with a server and a client certificate, in the file layout libnbd and
qemu read (``ca-cert.pem``, ``client-cert.pem``, ``client-key.pem``)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _issue(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_name: x509.Name,
    common_name: str,
    usage: x509.ObjectIdentifier,
    *,
    is_ca: bool = False,
    key: ec.EllipticCurvePrivateKey | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = key or ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if is_ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(ca_key, hashes.SHA256()), key


def make_pki(directory: Path) -> Path:
    """CA, server and client certificates under ``directory``; returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert, _ = _issue(
        ca_key,
        _name("reqcrypt test CA"),
        "reqcrypt test CA",
        ExtendedKeyUsageOID.SERVER_AUTH,
        is_ca=True,
        key=ca_key,
    )
    server_cert, server_key = _issue(
        ca_key, ca_cert.subject, "localhost", ExtendedKeyUsageOID.SERVER_AUTH
    )
    client_cert, client_key = _issue(
        ca_key, ca_cert.subject, "nbd-client", ExtendedKeyUsageOID.CLIENT_AUTH
    )
    pem = serialization.Encoding.PEM
    (directory / "ca-cert.pem").write_bytes(ca_cert.public_bytes(pem))
    (directory / "server-cert.pem").write_bytes(server_cert.public_bytes(pem))
    (directory / "server-key.pem").write_bytes(_key_pem(server_key))
    (directory / "client-cert.pem").write_bytes(client_cert.public_bytes(pem))
    (directory / "client-key.pem").write_bytes(_key_pem(client_key))
    return directory
