"""The exporters' TLS and basic authentication, read from Prometheus' usual web configuration file.

Why that file and not keys of vjob.toml: a site that runs node_exporter, slurm_exporter or
Prometheus itself already writes one (exporter-toolkit's `--web.config.file` format: a
`tls_server_config` with cert_file/key_file/client_auth_type/client_ca_file, and
`basic_auth_users` with bcrypt hashes); vjob's exporter reads the same file, so one certificate
and one scrape user serve every exporter on the host, and Prometheus' scrape configuration
(`scheme: https`, `basic_auth`, `tls_config`) does not change for vjob.

The file is read and checked once, when the exporter starts: a missing key, an unknown one, a
hash that is not bcrypt, a certificate that does not match its key each stop the start with one
line naming the file and the key (exit 2), instead of an exporter that answers nobody. The keys
of the format that Python's ssl module cannot honour (cipher_suites, curve_preferences,
client_allowed_sans, inline cert/key, rate_limit, the client auth types that do not verify the
certificate) are refused by name rather than silently dropped. Relative paths are relative to
the file's directory, as in exporter-toolkit.

The server: one thread per connection (prometheus_client's threading WSGI server); with TLS the
handshake runs in the connection's thread (a client that stalls in it never blocks the accept
loop), and every connection has a read deadline. A plain-HTTP request on a TLS port fails its
handshake and is closed. Basic auth answers 401 with `WWW-Authenticate: Basic`; a password once
checked is remembered by its SHA-256 (bcrypt is slow by design, about 0.1 s at cost 10, and
Prometheus scrapes every 15 s); an unknown user costs the same bcrypt check as a known one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from vjob.errors import ConfigError

MAX_FILE_BYTES = 1 << 20
"""A web configuration file is a few lines; anything larger is not one."""
READ_DEADLINE_S = 10.0
"""Seconds a connection may take to send its request (TLS handshake included)."""
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"}
_TLS_REFUSED = {
    "cert": "inline certificates",
    "key": "inline keys",
    "client_ca": "an inline client CA",
    "cipher_suites": "Go cipher suite names",
    "curve_preferences": "Go curve names",
    "client_allowed_sans": "matching client certificate SANs",
    "prefer_server_cipher_suites": "cipher preferences",
}
_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_HEADERS = {
    "Content-Security-Policy",
    "X-Frame-Options",
    "X-Content-Type-Options",
    "X-XSS-Protection",
    "Strict-Transport-Security",
}
_DUMMY_HASH = b"$2b$10$" + b"." * 53
"""Checked against when the user is unknown, so a wrong name costs what a wrong password does."""


@dataclass
class WebConfig:
    """What the exporter serves with: a TLS context (None: plain HTTP), the users allowed in
    (empty: no authentication), extra response headers."""

    path: Path
    tls: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    headers: tuple[tuple[str, str], ...] = ()


def load_web_config(path: str | Path) -> WebConfig:
    """Read and check `path` (exporter-toolkit's web configuration); ConfigError naming the key."""
    import yaml  # heavy: PyYAML, only for an exporter with a web configuration file

    path = Path(path)
    where = f"web configuration {path}"
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_FILE_BYTES} bytes: not a web configuration")
    try:
        doc = yaml.safe_load(raw.decode("utf-8")) or {}
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{where}: not YAML: {str(exc).splitlines()[0][:200]}") from None
    _mapping(doc, where)
    unknown = sorted(set(doc) - {"tls_server_config", "basic_auth_users", "http_server_config", "rate_limit"})
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known: tls_server_config, basic_auth_users, ...)")
    if doc.get("rate_limit") is not None:
        raise ConfigError(f"{where}: rate_limit: not supported by vjob's exporter (limit at a proxy)")
    base = path.parent
    config = WebConfig(path)
    if doc.get("tls_server_config") is not None:
        config.tls = _tls(doc["tls_server_config"], base, f"{where}: tls_server_config")
    if doc.get("basic_auth_users") is not None:
        config.users = _users(doc["basic_auth_users"], f"{where}: basic_auth_users")
    if doc.get("http_server_config") is not None:
        config.headers = _http(doc["http_server_config"], f"{where}: http_server_config")
    return config


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ConfigError(f"{where}: must be a mapping of names to values")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 4096:
        raise ConfigError(f"{where}: must be a non-empty string")
    return value


def _tls(section: Any, base: Path, where: str) -> ssl.SSLContext:
    """An SSL server context from tls_server_config, every file loaded now."""
    _mapping(section, where)
    for key in sorted(set(section) - _TLS_KEYS):
        what = _TLS_REFUSED.get(key)
        if what is not None:
            raise ConfigError(f"{where}: {key}: not supported by vjob's exporter ({what}); remove it")
        raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(_TLS_KEYS))})")
    for key in ("cert_file", "key_file"):
        if not section.get(key):
            raise ConfigError(f"{where}: {key} is missing (TLS needs both cert_file and key_file)")
    cert = base / _text(section["cert_file"], f"{where}: cert_file")
    key = base / _text(section["key_file"], f"{where}: key_file")
    auth = _text(section.get("client_auth_type", "NoClientCert"), f"{where}: client_auth_type")
    if auth not in _CLIENT_AUTH:
        if auth in ("RequestClientCert", "RequireAnyClientCert"):
            raise ConfigError(
                f"{where}: client_auth_type {auth}: accepts unverified certificates; "
                "use RequireAndVerifyClientCert with client_ca_file"
            )
        raise ConfigError(f"{where}: client_auth_type {auth[:60]!r}: one of {', '.join(_CLIENT_AUTH)}")
    ca = section.get("client_ca_file")
    if ca and auth == "NoClientCert":
        raise ConfigError(f"{where}: client_ca_file is set but client_auth_type is NoClientCert: set it")
    if not ca and auth != "NoClientCert":
        raise ConfigError(f"{where}: client_auth_type {auth} needs client_ca_file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = _version(section.get("min_version", "TLS12"), f"{where}: min_version")
    ctx.maximum_version = _version(section.get("max_version", "TLS13"), f"{where}: max_version")
    if ctx.minimum_version > ctx.maximum_version:
        raise ConfigError(f"{where}: min_version is above max_version")
    try:
        ctx.load_cert_chain(cert, key)
    except FileNotFoundError as exc:
        raise ConfigError(f"{where}: {exc.filename or cert}: no such file") from None
    except PermissionError as exc:
        raise ConfigError(f"{where}: {exc.filename or key}: cannot read it (permission denied)") from None
    except ssl.SSLError as exc:
        raise ConfigError(f"{where}: cert_file {cert} and key_file {key}: {exc.reason or exc}") from None
    if ca:
        ca_path = base / _text(ca, f"{where}: client_ca_file")
        try:
            ctx.load_verify_locations(cafile=str(ca_path))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"{where}: client_ca_file {ca_path}: {getattr(exc, 'strerror', None) or exc}") from None
    ctx.verify_mode = _CLIENT_AUTH[auth]
    return ctx


def _version(value: Any, where: str) -> ssl.TLSVersion:
    if value not in _VERSIONS:
        raise ConfigError(f"{where}: {str(value)[:20]!r}: one of {', '.join(_VERSIONS)}")
    return _VERSIONS[value]


def _users(section: Any, where: str) -> dict[str, bytes]:
    """User name → bcrypt hash; each hash checked to be one (a plain password is refused)."""
    import bcrypt  # heavy: bcrypt, only with basic_auth_users

    users: dict[str, bytes] = {}
    for name, hashed in _mapping(section, where).items():
        if not name or ":" in name or len(name) > 256:
            raise ConfigError(f"{where}: user {name[:60]!r}: a name without ':' of 1..256 characters")
        text = _text(hashed, f"{where}: {name}")
        try:
            bcrypt.checkpw(b"", text.encode())  # raises ValueError unless it is a bcrypt hash
        except ValueError:
            raise ConfigError(
                f"{where}: {name}: not a bcrypt hash (e.g. from `htpasswd -nBC 10 \"\" | tr -d ':\\n'`)"
            ) from None
        users[name] = text.encode()
    return users


def _http(section: Any, where: str) -> tuple[tuple[str, str], ...]:
    section = _mapping(section, where)
    unknown = sorted(set(section) - {"http2", "headers"})
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known: http2, headers)")
    if not isinstance(section.get("http2", True), bool):
        raise ConfigError(f"{where}: http2 must be true or false (vjob's exporter speaks HTTP/1.1 either way)")
    headers = _mapping(section.get("headers") or {}, f"{where}: headers")
    out = []
    for name, value in headers.items():
        if name not in _HEADERS:
            raise ConfigError(f"{where}: headers: {name[:60]!r}: one of {', '.join(sorted(_HEADERS))}")
        text = _text(value, f"{where}: headers: {name}")
        if any(c in text for c in "\r\n"):
            raise ConfigError(f"{where}: headers: {name}: a line break in a header value")
        out.append((name, text))
    return tuple(out)


class BasicAuth:
    """WSGI middleware: 401 unless the request carries one of `users` with its password."""

    def __init__(self, app: Callable[..., Iterable[bytes]], users: dict[str, bytes]) -> None:
        self.app = app
        self.users = users
        self._good: set[bytes] = set()
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if self._allowed(environ.get("HTTP_AUTHORIZATION", "")):
            return self.app(environ, start_response)
        start_response(
            "401 Unauthorized",
            [("WWW-Authenticate", 'Basic realm="vjob"'), ("Content-Type", "text/plain; charset=utf-8")],
        )
        return [b"401 Unauthorized\n"]

    def _allowed(self, header: str) -> bool:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "basic" or len(token) > 4096:
            return False
        try:
            user, sep, password = base64.b64decode(token.strip(), validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep:
            return False
        hashed = self.users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode(), password.encode(), hashed or b""))).digest()
        with self._lock:
            if hashed is not None and any(hmac.compare_digest(key, k) for k in self._good):
                return True
        import bcrypt  # heavy: bcrypt, only with basic_auth_users

        ok = bcrypt.checkpw(password.encode(), hashed or _DUMMY_HASH) and hashed is not None
        if ok:
            with self._lock:
                if len(self._good) < 1024:
                    self._good.add(key)
        return ok


class _Quiet(WSGIRequestHandler):
    """No access log on stderr (the agent logs structured events), and a read deadline."""

    timeout = READ_DEADLINE_S

    def log_message(self, format: str, *args: Any) -> None:
        return


class _Server(ThreadingWSGIServer):
    """The threading server, its TLS handshake moved into the connection's thread."""

    tls: ssl.SSLContext | None = None

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = super().get_request()
        if self.tls is not None:
            sock.settimeout(READ_DEADLINE_S)
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            try:
                request.do_handshake()
            except (ssl.SSLError, OSError):
                return  # plain HTTP on a TLS port, an unknown client certificate, a stalled client
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # a broken connection is the client's business, not a traceback on stderr


def _with_headers(app: Callable[..., Iterable[bytes]], headers: tuple[tuple[str, str], ...]) -> Callable[..., Any]:
    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        def start(status: str, response_headers: list[tuple[str, str]], *rest: Any) -> Any:
            return start_response(status, [*response_headers, *headers], *rest)

        return app(environ, start)

    return wrapped


def serve(registry: CollectorRegistry, port: int, addr: str, web: WebConfig | None = None) -> _Server:
    """Serve `registry` on `addr`:`port` in a daemon thread, with `web`'s TLS, users and headers;
    OSError when the port is taken. Returns the server (its `shutdown()` stops it)."""
    app: Callable[..., Any] = make_wsgi_app(registry)
    if web is not None and web.users:
        app = BasicAuth(app, web.users)
    if web is not None and web.headers:
        app = _with_headers(app, web.headers)
    server_class = type("_VjobServer", (_Server,), {"tls": web.tls if web else None})
    if ":" in addr:
        server_class.address_family = socket.AF_INET6
    httpd = make_server(addr, port, app, server_class, handler_class=_Quiet)
    threading.Thread(target=httpd.serve_forever, name="vjob-exporter", daemon=True).start()
    return httpd


__all__ = ["BasicAuth", "WebConfig", "load_web_config", "serve"]
