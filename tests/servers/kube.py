"""A real kube-apiserver 1.20.2 beside its own etcd, on loopback, for tests (the real-apiserver
lane; tests/README.md says what it proves).

The binaries come from ``scripts/kube-apiserver.sh install`` (which records them in
``<checkout>/.cache/kube-lab/env``, or ``$KUBE_LAB_DIR/env``); ``$DISPATCH_KUBE_APISERVER`` (an
unpacked binary) and ``$DISPATCH_ETCD`` override it.

    server = KubeApiServer(tmp_dir)
    server.start()                 # etcd, kube-apiserver, the lane's CRDs; timings in .timings
    api = server.api_client()      # admin (system:masters) through the static token
    token = server.service_account_token("dispatch-system", "dispatch")  # TokenRequest API
    server.compact()               # etcd compaction: old resourceVersions are gone for real
    server.restart_apiserver()     # same port, same etcd: every watch is cut, the watch cache
                                   # starts again from now
    server.stop()

Authentication and authorization are the production ones: ``--authorization-mode=RBAC``; the
admin is a static token (``--token-auth-file``) in ``system:masters``; a ServiceAccount's token
comes from the TokenRequest API (GA in 1.20), signed with ``--service-account-signing-key-file``
and issuer ``--service-account-issuer``. No kube-controller-manager runs, so no legacy
Secret-backed token is ever made (its token controller is part of the controller-manager), no
garbage collector deletes dependents, and no ``default`` ServiceAccount appears in a new
namespace: the ``ServiceAccount`` admission plugin is therefore disabled (it would refuse every
pod for want of that account and its token Secret). Nothing else is changed from the defaults
besides what a lone apiserver needs (``--endpoint-reconciler-type=none``, no priority and
fairness, no watch cache for pods (``--watch-cache-sizes=pods#0``: pod watches are served by
etcd, so an etcd compaction (:meth:`KubeApiServer.compact`) expires a resumed watch's
resourceVersion for real, 410 Expired; 1.20's watch cache grows itself up to 100k events while
they are fresh, so its own limit can't be reached in a test).

Pod logs: the apiserver reads them from the pod's node's kubelet, as a cluster's does (the
Node's ``status.addresses`` in kubeadm's order ``InternalIP,ExternalIP,Hostname``, and its
``status.daemonEndpoints.kubeletEndpoint.Port``), over mutual TLS with the lane's kubelet PKI
(:attr:`KubeApiServer.kubelet_pki`, ``tests/servers/kube_pki.py``). No kubelet runs here: the
labelled fake one, ``tests/servers/kubelet.py``, serves the logs a test writes.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import secrets
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tests.servers.kube_crds import lane_crds
from tests.servers.kube_pki import KubeletPki

__all__ = [
    "ADMIN_TOKEN_USER",
    "KubeApiServer",
    "KubeLabError",
    "KubeLabMissing",
    "LaneTimings",
    "collection_path",
    "lab_binaries",
]

CHECKOUT = Path(__file__).resolve().parent.parent.parent
ADMIN_TOKEN_USER = "lane-admin"


class KubeLabError(RuntimeError):
    """The lane could not be started, or a call to it failed."""


class KubeLabMissing(KubeLabError):
    """The lane's binaries are not installed (run ``scripts/kube-apiserver.sh install``)."""


def lab_binaries() -> tuple[Path, Path]:
    """(kube-apiserver, etcd) as installed by ``scripts/kube-apiserver.sh install``.

    Raises:
        KubeLabMissing: not installed, or a recorded path is gone.
    """
    recorded: dict[str, str] = {}
    lab_dir = Path(os.environ.get("KUBE_LAB_DIR") or CHECKOUT / ".cache" / "kube-lab")
    env_file = lab_dir / "env"
    if env_file.is_file():
        for line in env_file.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep:
                recorded[key.strip()] = value.strip()
    apiserver = os.environ.get("DISPATCH_KUBE_APISERVER", "")
    if not apiserver or apiserver.endswith(".gz"):
        apiserver = recorded.get("KUBE_APISERVER", "")
    etcd = os.environ.get("DISPATCH_ETCD") or recorded.get("ETCD", "")
    for what, path in (("kube-apiserver", apiserver), ("etcd", etcd)):
        if not path or not os.access(path, os.X_OK):
            raise KubeLabMissing(
                f"no {what} for the real-apiserver lane ({env_file} records "
                f"{path or 'nothing'}): run scripts/kube-apiserver.sh install"
            )
    return Path(apiserver), Path(etcd)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class LaneTimings:
    """Seconds each start-up step took (wall clock)."""

    etcd_s: float = 0.0
    apiserver_s: float = 0.0
    crds_s: float = 0.0
    restarts: list[float] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        """From nothing to the CRDs Established."""
        return self.etcd_s + self.apiserver_s + self.crds_s

    def words(self) -> str:
        """One line for the test session's summary."""
        text = (
            f"real-apiserver lane (kube-apiserver 1.20.2 + etcd) ready in {self.total_s:.1f} s: "
            f"etcd {self.etcd_s:.1f} s, kube-apiserver {self.apiserver_s:.1f} s, "
            f"5 CRDs {self.crds_s:.1f} s"
        )
        if self.restarts:
            text += "; apiserver restarts " + ", ".join(f"{r:.1f} s" for r in self.restarts)
        return text


class KubeApiServer:
    """etcd + kube-apiserver 1.20.2 on 127.0.0.1 (see the module docstring)."""

    def __init__(self, work_dir: Path, *, start_timeout_s: float = 180.0) -> None:
        """Prepare (not start) the lane in ``work_dir`` (etcd data, certs, keys, logs).

        Raises:
            KubeLabMissing: the binaries are not installed.
        """
        self.apiserver_bin, self.etcd_bin = lab_binaries()
        self.work_dir = Path(work_dir)
        self.start_timeout_s = start_timeout_s
        self.admin_token = secrets.token_hex(16)
        self.timings = LaneTimings()
        self.etcd_port = 0
        self.port = 0
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None
        self._logs: list[IO[bytes]] = []
        self.kubelet_pki = KubeletPki(self.work_dir / "kubelet-pki")
        """The kubelet PKI the apiserver's kubelet client uses (made by :meth:`start`)."""

    # -- paths ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``https://127.0.0.1:<port>``."""
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        """The self-signed serving certificate bundle (its CA included) to verify against."""
        return self.work_dir / "certs" / "apiserver.crt"

    @property
    def key_file(self) -> Path:
        """The serving certificate's private key (the lane's proxy presents the same pair)."""
        return self.work_dir / "certs" / "apiserver.key"

    @property
    def apiserver_log(self) -> Path:
        """kube-apiserver's log."""
        return self.work_dir / "apiserver.log"

    # -- life -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start etcd, then kube-apiserver, then install the lane's CRDs.

        Raises:
            KubeLabError: a process exited or was not ready within ``start_timeout_s``.
        """
        self.work_dir.mkdir(parents=True, exist_ok=True)
        (self.work_dir / "certs").mkdir(exist_ok=True)
        (self.work_dir / "tokens.csv").write_text(
            f'{self.admin_token},{ADMIN_TOKEN_USER},{ADMIN_TOKEN_USER},"system:masters"\n'
        )
        self._write_sa_keys()
        self.kubelet_pki = KubeletPki.create(self.work_dir / "kubelet-pki")
        t0 = time.monotonic()
        self._start_etcd()
        t1 = time.monotonic()
        self.timings.etcd_s = t1 - t0
        self.port = _free_port()
        self._start_apiserver()
        t2 = time.monotonic()
        self.timings.apiserver_s = t2 - t1
        self._install_crds()
        self.timings.crds_s = time.monotonic() - t2

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver (SIGTERM) and start it again on the same port and etcd: every
        open watch is cut, and the new watch cache starts from etcd's present, so a watch
        resumed from before answers 410 Expired.

        Raises:
            KubeLabError: it did not come back.
        """
        t0 = time.monotonic()
        self._stop(self._apiserver, "kube-apiserver")
        self._start_apiserver()
        self.timings.restarts.append(time.monotonic() - t0)

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd (SIGTERM, then SIGKILL after a grace period)."""
        self._stop(self._apiserver, "kube-apiserver")
        self._stop(self._etcd, "etcd")
        self._apiserver = self._etcd = None
        for log in self._logs:
            log.close()
        self._logs.clear()

    def __enter__(self) -> KubeApiServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _write_sa_keys(self) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (self.work_dir / "sa.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
        (self.work_dir / "sa.pub").write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    def _spawn(self, cmd: list[str], log_name: str) -> subprocess.Popen[bytes]:
        log = (self.work_dir / log_name).open("ab")
        self._logs.append(log)
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def _start_etcd(self) -> None:
        for _ in range(5):
            self.etcd_port = _free_port()
            peer = _free_port()
            client_url = f"http://127.0.0.1:{self.etcd_port}"
            peer_url = f"http://127.0.0.1:{peer}"
            self._etcd = self._spawn(
                [
                    str(self.etcd_bin),
                    "--name=lane",
                    f"--data-dir={self.work_dir / 'etcd'}",
                    f"--listen-client-urls={client_url}",
                    f"--advertise-client-urls={client_url}",
                    f"--listen-peer-urls={peer_url}",
                    f"--initial-advertise-peer-urls={peer_url}",
                    f"--initial-cluster=lane={peer_url}",
                    "--log-level=warn",
                ],
                "etcd.log",
            )
            health = functools.partial(_http_ok, f"{client_url}/health")
            if self._wait(health, self._etcd, "etcd", "etcd.log"):
                return
        raise KubeLabError("etcd: no free port pair after 5 tries:\n" + self._tail("etcd.log"))

    def _start_apiserver(self) -> None:
        d = self.work_dir
        self._apiserver = self._spawn(
            [
                str(self.apiserver_bin),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.port}",
                "--insecure-port=0",
                f"--cert-dir={d / 'certs'}",
                f"--token-auth-file={d / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={d / 'sa.pub'}",
                f"--service-account-signing-key-file={d / 'sa.key'}",
                "--api-audiences=https://kubernetes.default.svc",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--endpoint-reconciler-type=none",
                "--enable-priority-and-fairness=false",
                "--disable-admission-plugins=ServiceAccount",
                "--watch-cache-sizes=pods#0",
                # the kubelet client (pod logs): kubeadm's address order and mutual TLS
                "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
                f"--kubelet-certificate-authority={self.kubelet_pki.ca_file}",
                f"--kubelet-client-certificate={self.kubelet_pki.client_cert_file}",
                f"--kubelet-client-key={self.kubelet_pki.client_key_file}",
                # no periodic compaction: only compact() expires resourceVersions
                "--etcd-compaction-interval=0",
                "--v=1",
            ],
            "apiserver.log",
        )
        if not self._wait(self._ready, self._apiserver, "kube-apiserver", "apiserver.log"):
            raise KubeLabError(f"kube-apiserver exited at start:\n{self._tail('apiserver.log')}")

    def _ready(self) -> bool:
        return _http_ok(f"{self.url}/readyz", token=self.admin_token, ca=self._ca_if_any())

    def _ca_if_any(self) -> Path | None:
        return self.ca_file if self.ca_file.exists() else None

    def _wait(self, ready: Any, proc: subprocess.Popen[bytes], what: str, log_name: str) -> bool:
        """Wait until ``ready()``; False when ``proc`` exited (e.g. a port was taken)."""
        deadline = time.monotonic() + self.start_timeout_s
        while not ready():
            if proc.poll() is not None:
                text = self._tail(log_name)
                if "address already in use" in text:
                    return False
                raise KubeLabError(f"{what} exited with {proc.returncode}:\n{text}")
            if time.monotonic() > deadline:
                raise KubeLabError(
                    f"{what} not ready within {self.start_timeout_s} s:\n{self._tail(log_name)}"
                )
            time.sleep(0.1)
        return True

    def _tail(self, log_name: str, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            text = (self.work_dir / log_name).read_text(errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        return ""

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes] | None, what: str, grace_s: float = 10.0) -> None:
        del what
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(grace_s)

    def _install_crds(self) -> None:
        from kubernetes import client as k8s

        api = self.api_client()
        try:
            ext: Any = k8s.ApiextensionsV1Api(api)
            crds = [a.crd for a in lane_crds()]
            for crd in crds:
                ext.create_custom_resource_definition(crd, _preload_content=False)
            deadline = time.monotonic() + self.start_timeout_s
            for crd in crds:
                name = crd["metadata"]["name"]
                while True:
                    got = json.loads(
                        ext.read_custom_resource_definition(name, _preload_content=False).data
                    )
                    conds = (got.get("status") or {}).get("conditions") or []
                    if any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                        break
                    if time.monotonic() > deadline:
                        raise KubeLabError(f"CRD {name} not Established: {conds}")
                    time.sleep(0.05)
            # Discovery of a new CRD's group lags Established a little: wait until each
            # resource answers a list.
            for crd in crds:
                spec = crd["spec"]
                path = (
                    f"/apis/{spec['group']}/{spec['versions'][0]['name']}/{spec['names']['plural']}"
                )
                while not _http_ok(self.url + path, token=self.admin_token, ca=self.ca_file):
                    if time.monotonic() > deadline:
                        raise KubeLabError(f"{path} not served after its CRD was Established")
                    time.sleep(0.05)
        finally:
            api.close()

    # -- clients ----------------------------------------------------------------------------

    def configuration(self, token: str | None = None) -> Any:
        """A ``kubernetes.client.Configuration`` with a bearer ``token`` (the admin's by
        default), verifying the server's certificate."""
        from kubernetes import client as k8s

        cfg = k8s.Configuration()
        cfg.host = self.url
        cfg.ssl_ca_cert = str(self.ca_file)
        cfg.verify_ssl = True
        cfg.api_key = {"authorization": token or self.admin_token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        return cfg

    def api_client(self, token: str | None = None) -> Any:
        """A ``kubernetes.client.ApiClient`` as :meth:`configuration` says (close it)."""
        from kubernetes import client as k8s

        return k8s.ApiClient(self.configuration(token))

    def kubeconfig(self, path: Path, token: str | None = None) -> Path:
        """Write a kubeconfig for ``token`` (the admin's by default) to ``path``."""
        ca = base64.b64encode(self.ca_file.read_bytes()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "lane", "cluster": {"server": self.url, "certificate-authority-data": ca}}
            ],
            "users": [{"name": "lane", "user": {"token": token or self.admin_token}}],
            "contexts": [{"name": "lane", "context": {"cluster": "lane", "user": "lane"}}],
            "current-context": "lane",
        }
        path.write_text(json.dumps(config))
        return path

    def ensure_namespace(self, name: str) -> None:
        """Create namespace ``name`` (if missing)."""
        from kubernetes import client as k8s

        api = self.api_client()
        try:
            core: Any = k8s.CoreV1Api(api)
            core.create_namespace({"metadata": {"name": name}})
        except k8s.ApiException as err:
            if err.status != 409:
                raise
        finally:
            api.close()

    def service_account_token(self, namespace: str, name: str, *, expiration_s: int = 7200) -> str:
        """A token of ServiceAccount ``namespace/name`` from the TokenRequest API (the account
        is created if missing). It authenticates as ``system:serviceaccount:<ns>:<name>``."""
        from kubernetes import client as k8s

        api = self.api_client()
        try:
            core: Any = k8s.CoreV1Api(api)
            with contextlib.suppress(k8s.ApiException):
                core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
            answer = core.create_namespaced_service_account_token(
                name,
                namespace,
                {"spec": {"expirationSeconds": expiration_s}},
            )
            token: str = answer.status.token
            return token
        finally:
            api.close()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        impersonate: str | None = None,
        groups: tuple[str, ...] = (),
        content_type: str = "application/json",
    ) -> tuple[int, dict[str, Any]]:
        """One raw API request (the admin's token by default; ``impersonate`` a user, with
        ``groups``, as ``kubectl --as`` does). Returns the status and the JSON answer."""
        import urllib3

        headers = {
            "Authorization": f"Bearer {token or self.admin_token}",
            "Content-Type": content_type,
            "Accept": "application/json",
        }
        if impersonate:
            headers["Impersonate-User"] = impersonate
        http = urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=str(self.ca_file))
        fields: list[tuple[str, str]] = [("Impersonate-Group", g) for g in groups]
        answer = http.request(
            method,
            self.url + path,
            body=json.dumps(body).encode() if body is not None else None,
            headers=urllib3.HTTPHeaderDict([*headers.items(), *fields]),
            retries=False,
            timeout=60,
        )
        try:
            data: dict[str, Any] = json.loads(answer.data) if answer.data else {}
        except ValueError:
            data = {"message": answer.data.decode(errors="replace")}
        return answer.status, data

    def create(self, doc: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """POST one manifest document (as the admin) to its collection: server-side validation
        of every built-in kind. Returns the status and the answer."""
        return self.request("POST", collection_path(doc), doc)

    # -- etcd -------------------------------------------------------------------------------

    def etcd_revision(self) -> int:
        """etcd's current revision (what resourceVersions count)."""
        answer = _etcd_post(self.etcd_port, "/v3/kv/range", {"key": _b64("/")})
        return int(answer["header"]["revision"])

    def compact(self) -> int:
        """Compact etcd at its current revision (as the API server does every 5 minutes):
        every older resourceVersion is gone. Returns the revision."""
        revision = self.etcd_revision()
        _etcd_post(
            self.etcd_port, "/v3/kv/compaction", {"revision": str(revision), "physical": True}
        )
        return revision


_CLUSTER_SCOPED = frozenset(
    {"Namespace", "ClusterRole", "ClusterRoleBinding", "Node", "MutatingWebhookConfiguration"}
)
_PLURALS = {"Ingress": "ingresses", "NetworkPolicy": "networkpolicies"}


def collection_path(doc: dict[str, Any]) -> str:
    """The API path of the collection a manifest document is created in."""
    api_version, kind = str(doc["apiVersion"]), str(doc["kind"])
    base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
    plural = _PLURALS.get(kind, kind.lower() + "s")
    if kind in _CLUSTER_SCOPED:
        return f"{base}/{plural}"
    namespace = (doc.get("metadata") or {}).get("namespace") or "default"
    return f"{base}/namespaces/{namespace}/{plural}"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _etcd_post(port: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        result: dict[str, Any] = json.loads(answer.read())
        return result


def _http_ok(url: str, *, token: str | None = None, ca: Path | None = None) -> bool:
    context: ssl.SSLContext | None = None
    if url.startswith("https:"):
        context = (
            ssl.create_default_context(cafile=str(ca)) if ca else ssl._create_unverified_context()
        )
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False
