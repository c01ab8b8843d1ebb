"""A private CA and the controller's server certificate (``understudy credentials tls``).

For a cluster without a CA of its own: a self-signed CA (``ca.pem``; its key ``ca.key`` stays
with the operator) and a server certificate for the controller's names and addresses
(``server.pem``, ``server.key``), signed by it. The controller serves with the certificate
(``--tls-cert``, ``--tls-key``); agents, the gateway, SDK clients and the testbed verify it with
``--ca-file ca.pem``. Keys are ECDSA P-256, written 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from controller.credentials import write_private

logger = logging.getLogger(__name__)

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
SERVER_CERT = "server.pem"
SERVER_KEY = "server.key"
CA_DAYS = 3650
SERVER_DAYS = 825
"""The longest validity clients accept for a server certificate (Apple's rule, now common)."""


@dataclass(frozen=True)
class TlsFiles:
    """The files :func:`make_ca_and_server_cert` wrote."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


def make_ca_and_server_cert(directory: Path, hosts: Sequence[str],
                            name: str = "understudy") -> TlsFiles:
    """Write a new CA and a server certificate for ``hosts`` (names or IP addresses).

    A CA already in ``directory`` is reused (its clients keep trusting the new certificate).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not hosts:
        raise ValueError("a server certificate needs at least one host name or address")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    files = TlsFiles(directory / CA_CERT, directory / CA_KEY, directory / SERVER_CERT,
                     directory / SERVER_KEY)
    now = datetime.datetime.now(datetime.UTC)
    if files.ca_cert.exists() and files.ca_key.exists():
        ca_key = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
        logger.info("reusing the CA in %s", files.ca_cert)
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
        ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
                   .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
                   .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                   .add_extension(x509.KeyUsage(
                       digital_signature=True, key_cert_sign=True, crl_sign=True,
                       content_commitment=False, key_encipherment=False,
                       data_encipherment=False, key_agreement=False, encipher_only=False,
                       decipher_only=False), critical=True)
                   .add_extension(x509.SubjectKeyIdentifier.from_public_key(
                       ca_key.public_key()), critical=False)
                   .sign(ca_key, hashes.SHA256()))
        write_private(files.ca_key, _pem_key(ca_key))
        files.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=SERVER_DAYS))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_cert.public_key()), critical=False)  # type: ignore[arg-type]
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    write_private(files.server_key, _pem_key(key))
    files.server_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    logger.info("server certificate for %s written to %s (CA %s)", ", ".join(hosts),
                files.server_cert, files.ca_cert)
    return files


def _pem_key(key: object) -> str:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(  # type: ignore[attr-defined, no-any-return]
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()).decode()
