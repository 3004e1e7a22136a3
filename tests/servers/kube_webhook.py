"""A site's mutating admission webhook, registered on the lane's real kube-apiserver.

What a site's policy engine (Kyverno, Gatekeeper's mutation, an in-house webhook) does: the
apiserver calls it on every matching request and applies the JSON patch it answers, before the
object is stored. Here it is a small HTTPS server on 127.0.0.1 (a certificate made for it, its
CA given to the apiserver as ``caBundle``) and a ``MutatingWebhookConfiguration`` naming it;
``mutate`` (a test's function) is asked for the patch of each request in ``namespace``.

    with SiteWebhook(lab, "team-a", TRAINJOBS, mutate) as hook:
        ...                    # every TrainJob created in team-a goes through ``mutate``
        hook.reviews           # the AdmissionReview requests it answered

Registration takes effect when the apiserver's informer sees the configuration: entering the
block waits until a dry-run create comes back mutated.
"""

from __future__ import annotations

import base64
import datetime
import http.server
import ipaddress
import json
import secrets
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

from tests.fakes.kube_controller import train_job_body
from tests.servers.kube import KubeApiServer
from tests.servers.kube_resources import AdmissionDenied, JsonObject, ResourceType

__all__ = ["Mutate", "SiteWebhook"]

Mutate = Callable[[str, JsonObject, JsonObject | None], list[JsonObject]]
"""``(operation, object, old object) -> JSON patch``: ``operation`` is ``CREATE`` or
``UPDATE`` (``old`` is ``None`` on CREATE); an empty list leaves the object as it is; raising
:class:`~tests.servers.kube_resources.AdmissionDenied` refuses the request."""


class SiteWebhook:
    """A mutating webhook on the lane's server (see the module docstring)."""

    def __init__(
        self,
        lab: KubeApiServer,
        namespace: str,
        resource: ResourceType,
        mutate: Mutate,
        *,
        operations: tuple[str, ...] = ("CREATE",),
    ) -> None:
        self.lab = lab
        self.namespace = namespace
        self.resource = resource
        self.mutate = mutate
        self.operations = operations
        self.name = f"site-{secrets.token_hex(4)}.example.com"
        self.reviews: list[JsonObject] = []
        self._lock = threading.Lock()
        self._dir = tempfile.TemporaryDirectory(prefix="site-webhook-")
        cert, key, self._ca_pem = _certificate(Path(self._dir.name))
        handler = self._handler()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(str(cert), str(key))
        self._server.socket = tls.wrap_socket(self._server.socket, server_side=True)
        self.port: int = self._server.server_address[1]

    def __enter__(self) -> Self:
        threading.Thread(
            target=self._server.serve_forever, name="site-webhook", daemon=True
        ).start()
        try:
            self._register()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.lab.request(
            "DELETE",
            f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{self.name}",
        )
        # The server stays up until the apiserver has stopped calling it (failurePolicy Fail:
        # a TrainJob created meanwhile, by the next test, would be refused).
        try:
            self._wait_until_called(False)
        finally:
            self._server.shutdown()
            self._server.server_close()
            self._dir.cleanup()

    def _register(self) -> None:
        rt = self.resource
        config = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": self.name},
            "webhooks": [
                {
                    "name": self.name,
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{self.port}/mutate",
                        "caBundle": base64.b64encode(self._ca_pem).decode(),
                    },
                    "rules": [
                        {
                            "apiGroups": [rt.group],
                            "apiVersions": [rt.version],
                            "resources": [rt.plural],
                            "operations": list(self.operations),
                            "scope": "Namespaced",
                        }
                    ],
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 10,
                }
            ],
        }
        status, answer = self.lab.create(config)
        if status != 201:
            raise AssertionError(f"MutatingWebhookConfiguration: {status} {answer}")
        # effective once the apiserver's informer has it: a dry-run create goes through it
        self._wait_until_called(True)

    def _wait_until_called(self, called: bool) -> None:
        """Dry-run creates in the namespace until the apiserver calls the webhook for them
        (``called``) or no longer does (its informer has seen the configuration)."""
        deadline = time.monotonic() + 60
        rt = self.resource
        path = f"/apis/{rt.group}/{rt.version}/namespaces/{self.namespace}/{rt.plural}?dryRun=All"
        while True:
            with self._lock:
                self.reviews.clear()
            self.lab.request("POST", path, train_job_body(f"probe-{secrets.token_hex(3)}"))
            with self._lock:
                seen = bool(self.reviews)
                self.reviews.clear()
            if seen is called:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"webhook {self.name}: called={seen} after 60 s")
            time.sleep(0.2)

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                request = review["request"]
                patch: list[JsonObject] = []
                response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
                if request.get("namespace") == hook.namespace:
                    with hook._lock:
                        hook.reviews.append(request)
                    try:
                        patch = hook.mutate(
                            request["operation"], request["object"], request.get("oldObject")
                        )
                    except AdmissionDenied as denied:
                        response["allowed"] = False
                        response["status"] = {"code": denied.code, "message": denied.message}
                if patch:
                    response["patchType"] = "JSONPatch"
                    response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
                body = json.dumps(
                    {
                        "apiVersion": "admission.k8s.io/v1",
                        "kind": "AdmissionReview",
                        "response": response,
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        return Handler


def _certificate(directory: Path) -> tuple[Path, Path, bytes]:
    """A self-signed certificate for 127.0.0.1 (it is its own CA); returns the certificate
    file, the key file and the certificate's PEM (the ``caBundle``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "site-webhook")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    cert_file, key_file = directory / "tls.crt", directory / "tls.key"
    cert_file.write_bytes(pem)
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file, pem
