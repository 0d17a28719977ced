"""The exporter's TLS and basic auth from Prometheus' web configuration file (vjob.prometheus_web).

A real client (requests, and Python's ssl for the handshake failures) talks to the agent's real
exporter over loopback; the certificates are made here by `openssl req -x509`, the hashes by the
bcrypt package. What is checked: the metrics over HTTPS with the right user, 401 with a wrong
password or none, plain HTTP refused on the TLS port, a client certificate required and checked
when the file asks for one, and each bad file stopping the start with one line naming the key.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import bcrypt
import pytest
import requests

from agent.metrics import AgentMetrics
from saline_bew.config import SalineConfig
from saline_bew.metrics import SalineMetrics
from tests.services import free_port
from vjob import prometheus_web
from vjob.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
HTPASSWD_SECRET = "$2y$10$InGilq0x.xUnIOfmWkYuOOcrL.Q3UahFNZNX3pCcHjMt.ha54ZaSq"
"""`htpasswd -nbBC 10 "" secret | tr -d ':\n'` (apache2-utils), as operators make them: Apache's $2y$."""


def _cert(tmp: Path, name: str, *, ca: tuple[Path, Path] | None = None) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (self-signed, or signed by `ca`) and its key."""
    key, crt = tmp / f"{name}.key", tmp / f"{name}.crt"
    subj = ["-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1"]
    if ca is None:
        args = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
        subprocess.run([*args, "-keyout", key, "-out", crt, "-days", "2", *subj], check=True, capture_output=True)
    else:
        csr = tmp / f"{name}.csr"
        args = ["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
        subprocess.run([*args, "-keyout", key, "-out", csr, *subj], check=True, capture_output=True)
        sign = [
            "openssl",
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca[0],
            "-CAkey",
            ca[1],
            "-CAcreateserial",
            "-copy_extensions",
            "copy",
        ]
        subprocess.run([*sign, "-out", crt, "-days", "2"], check=True, capture_output=True)
    return crt, key


def _hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()


def _serve(web_file: Path) -> tuple[AgentMetrics, int]:
    metrics = AgentMetrics()
    metrics.ticks.inc()
    port = free_port()
    metrics.serve(port, "127.0.0.1", str(web_file))
    return metrics, port


def test_tls_and_basic_auth_with_a_real_client(tmp_path: Path) -> None:
    crt, _key = _cert(tmp_path, "server")
    web = tmp_path / "web.yml"
    web.write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"  # relative to the file
        f"basic_auth_users:\n  prometheus: '{_hash('s3cret')}'\n"
        "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n"
    )
    _metrics, port = _serve(web)
    url = f"https://127.0.0.1:{port}/metrics"
    ok = requests.get(url, auth=("prometheus", "s3cret"), verify=str(crt), timeout=30)
    assert ok.status_code == 200
    assert "vjob_agent_ticks_total 1.0" in ok.text
    assert ok.headers["X-Content-Type-Options"] == "nosniff"
    again = requests.get(url, auth=("prometheus", "s3cret"), verify=str(crt), timeout=30)  # the cached check
    assert again.status_code == 200
    for auth in (("prometheus", "wrong"), ("nobody", "s3cret"), None):
        denied = requests.get(url, auth=auth, verify=str(crt), timeout=30)
        assert denied.status_code == 401, auth
        assert denied.headers["WWW-Authenticate"].startswith("Basic")
        assert "vjob_agent" not in denied.text
    with pytest.raises(requests.exceptions.SSLError):  # a client that does not trust the certificate
        requests.get(url, auth=("prometheus", "s3cret"), timeout=30)
    with pytest.raises(requests.exceptions.ConnectionError):  # plain HTTP on the TLS port
        requests.get(f"http://127.0.0.1:{port}/metrics", auth=("prometheus", "s3cret"), timeout=30)
    # The port still answers after the failed handshakes (they ended in their own threads).
    assert requests.get(url, auth=("prometheus", "s3cret"), verify=str(crt), timeout=30).status_code == 200


def test_basic_auth_without_tls(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  scraper: '{_hash('pw')}'\n  apache: '{HTPASSWD_SECRET}'\n")
    _metrics, port = _serve(web)
    url = f"http://127.0.0.1:{port}/metrics"
    assert requests.get(url, timeout=30).status_code == 401
    assert requests.get(url, auth=("scraper", "pw"), timeout=30).status_code == 200
    assert requests.get(url, auth=("apache", "secret"), timeout=30).status_code == 200  # htpasswd's $2y$
    assert requests.get(url, auth=("apache", "Secret"), timeout=30).status_code == 401


def test_client_certificate_required_and_checked(tmp_path: Path) -> None:
    ca = _cert(tmp_path, "ca")
    server = _cert(tmp_path, "server", ca=ca)
    client = _cert(tmp_path, "client", ca=ca)
    stranger = _cert(tmp_path, "stranger")  # self-signed: not from the client CA
    web = tmp_path / "web.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: {server[0]}\n  key_file: {server[1]}\n"
        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {ca[0]}\n  min_version: TLS13\n"
    )
    _metrics, port = _serve(web)
    url = f"https://127.0.0.1:{port}/metrics"
    good = requests.get(url, cert=(str(client[0]), str(client[1])), verify=str(ca[0]), timeout=30)
    assert good.status_code == 200
    for cert in (None, (str(stranger[0]), str(stranger[1]))):
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(url, cert=cert, verify=str(ca[0]), timeout=30)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tls_server_config:\n  cert_file: server.crt\n", "key_file is missing"),
        ("tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n", "nope.crt: no such file"),
        ("tls_server_config:\n  cert_file: server.crt\n  key_file: other.key\n", "cert_file"),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_ca_file: server.crt\n",
            "client_auth_type is NoClientCert",
        ),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
            "  client_auth_type: RequireAndVerifyClientCert\n",
            "needs client_ca_file",
        ),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
            "  client_auth_type: RequireAnyClientCert\n",
            "unverified",
        ),
        ("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS9\n", "min_version"),
        (
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  cipher_suites: [X]\n",
            "cipher_suites: not supported",
        ),
        ("basic_auth_users:\n  alice: plaintext\n", "alice: not a bcrypt hash"),
        ("basic_auth_users: [alice]\n", "basic_auth_users: must be a mapping"),
        ("basic_auth_user:\n  alice: x\n", "unknown key 'basic_auth_user'"),
        ("http_server_config:\n  headers:\n    X-Evil: 1\n", "X-Evil"),
        ("rate_limit:\n  interval: 1s\n", "rate_limit: not supported"),
        ("tls_server_config: [\n", "not YAML"),
    ],
)
def test_a_bad_file_is_refused_naming_the_key(tmp_path: Path, text: str, says: str) -> None:
    _cert(tmp_path, "server")
    _cert(tmp_path, "other")
    web = tmp_path / "web.yml"
    web.write_text(text)
    with pytest.raises(ConfigError) as err:
        prometheus_web.load_web_config(web)
    assert str(web) in str(err.value)
    assert says in str(err.value)


def test_the_agent_command_exits_2_on_a_bad_file(tmp_path: Path) -> None:
    """`vjob agent` stops before anything else with the one line (exit 2), as an ordinary user."""
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  alice: hunter2\n")
    conf = tmp_path / "vjob.toml"
    conf.write_text(
        f'[database]\nurl = "sqlite:///{tmp_path}/s.db"\n[agent]\nmetrics_port = {free_port()}\n'
        f'metrics_web_config = "{web}"\n[planner]\noptimizer = "ffd"\n'
    )
    env = {**os.environ, "VJOB_CONFIG": str(conf)}
    run = subprocess.run(
        [sys.executable, "-m", "vjob.cli", "agent", "--rms", "oar", "--once"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines() == [
        f"vjob: error: web configuration {web}: basic_auth_users: alice: not a bcrypt hash "
        "(e.g. from `htpasswd -nBC 10 \"\" | tr -d ':\\n'`)"
    ]
    assert run.stdout == ""


def test_the_saline_managers_exporter_reads_the_same_file(tmp_path: Path) -> None:
    crt, _key = _cert(tmp_path, "server")
    web = tmp_path / "web.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        f"basic_auth_users:\n  prometheus: '{_hash('s3cret')}'\n"
    )
    metrics = SalineMetrics()
    port = free_port()
    metrics.serve(port, "127.0.0.1", str(web))
    url = f"https://127.0.0.1:{port}/metrics"
    ok = requests.get(url, auth=("prometheus", "s3cret"), verify=str(crt), timeout=30)
    assert ok.status_code == 200 and "vjob_saline_last_pass_timestamp_seconds" in ok.text
    assert requests.get(url, auth=("prometheus", "wrong"), verify=str(crt), timeout=30).status_code == 401
    with pytest.raises(ValueError, match="must be an absolute path"):
        SalineConfig(metrics_web_config="web.yml")
