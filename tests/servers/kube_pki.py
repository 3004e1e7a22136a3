"""The lane's kubelet PKI: the CA kube-apiserver trusts kubelets' serving certificates by
(``--kubelet-certificate-authority``) and the client certificate it presents to them
(``--kubelet-client-certificate``/``--kubelet-client-key``), as kubeadm sets a cluster up.

A kubelet (here :class:`tests.servers.kubelet.FakeKubelet`) gets a serving certificate for its
address from :meth:`KubeletPki.issue_serving`, and trusts the CA for the apiserver's client
certificate (the real kubelet's ``authentication.x509.clientCAFile``).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["APISERVER_CLIENT_CN", "KubeletPki"]

APISERVER_CLIENT_CN = "kube-apiserver-kubelet-client"
"""The common name of the apiserver's client certificate (kubeadm's)."""


def _key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    pem: bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return pem


@dataclass(frozen=True)
class KubeletPki:
    """The files of the lane's kubelet PKI in ``directory``."""

    directory: Path

    @property
    def ca_file(self) -> Path:
        """The CA certificate (PEM)."""
        return self.directory / "ca.crt"

    @property
    def ca_key_file(self) -> Path:
        """The CA's private key (PEM)."""
        return self.directory / "ca.key"

    @property
    def client_cert_file(self) -> Path:
        """The apiserver's kubelet client certificate (CN :data:`APISERVER_CLIENT_CN`)."""
        return self.directory / "apiserver-kubelet-client.crt"

    @property
    def client_key_file(self) -> Path:
        """Its key."""
        return self.directory / "apiserver-kubelet-client.key"

    @classmethod
    def create(cls, directory: Path) -> KubeletPki:
        """Make the CA and the apiserver's client certificate in ``directory``."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import NameOID

        directory.mkdir(parents=True, exist_ok=True)
        pki = cls(directory)
        key = _key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lane-kubelet-ca")])
        now = datetime.datetime.now(datetime.UTC)
        ca = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
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
            .sign(key, hashes.SHA256())
        )
        pki.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        pki.ca_key_file.write_bytes(_key_pem(key))
        cert, client_key = pki._issue(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                    x509.NameAttribute(NameOID.COMMON_NAME, APISERVER_CLIENT_CN),
                ]
            ),
            client=True,
        )
        pki.client_cert_file.write_bytes(cert)
        pki.client_key_file.write_bytes(client_key)
        return pki

    def issue_serving(self, directory: Path, host: str = "127.0.0.1") -> tuple[Path, Path]:
        """A kubelet serving certificate for IP ``host`` signed by the CA; returns the
        certificate and key files written to ``directory``."""
        from cryptography import x509
        from cryptography.x509.oid import NameOID

        cert, key = self._issue(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"kubelet@{host}")]),
            client=False,
            ip=host,
        )
        directory.mkdir(parents=True, exist_ok=True)
        cert_file, key_file = directory / "kubelet.crt", directory / "kubelet.key"
        cert_file.write_bytes(cert)
        key_file.write_bytes(key)
        return cert_file, key_file

    def _issue(self, subject: Any, *, client: bool, ip: str | None = None) -> tuple[bytes, bytes]:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import ExtendedKeyUsageOID

        ca = x509.load_pem_x509_certificate(self.ca_file.read_bytes())
        ca_key: Any = serialization.load_pem_private_key(
            self.ca_key_file.read_bytes(), password=None
        )
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if ip is not None:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
                critical=False,
            )
        cert = builder.sign(ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)
