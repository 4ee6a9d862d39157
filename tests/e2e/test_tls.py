"""TLS without a proxy: the coordinator serves wss:// and https:// from a certificate
and key; a desktop client that trusts that certificate (--ca) trains, one that does
not is refused by its own TLS check."""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from coordinator import events as ev
from coordinator.server import BackgroundServer, CrowdServer
from coordinator.service import CoreService
from tests.e2e.e2e_helpers import ROOT, Recorder, clients, digits_job


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tls")
    key, crt = d / "key.pem", d / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(crt)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return crt, key


def test_wss_with_a_self_signed_certificate(cert: tuple[Path, Path]) -> None:
    crt, key = cert
    service = CoreService(digits_job(stop={"target_accuracy": None, "max_versions": 6}))
    rec = Recorder()
    service.add_sink(rec)
    bg = BackgroundServer(CrowdServer(service), ssl_certfile=str(crt), ssl_keyfile=str(key))
    with bg:
        assert bg.url.startswith("wss://") and bg.http.startswith("https://")
        trust = ssl.create_default_context(cafile=str(crt))
        assert httpx.get(f"{bg.http}/healthz", verify=trust).json()["ok"] is True
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{bg.http}/healthz")  # the system store does not know it
        with clients(bg.url, ["trusting"], "--ca", str(crt)) as procs:
            assert service.done.wait(120)
            assert procs["trusting"].wait(60) == 0
        untrusting = subprocess.run(
            [sys.executable, "-m", "client.desktop", bg.url, "--flops", "1e9",
             "--max-attempts", "1"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert {o.client_id for o in rec.of(ev.ResultAccepted)}
    assert untrusting.returncode == 1
    assert "CERTIFICATE_VERIFY_FAILED" in untrusting.stderr


def test_ca_for_a_plain_url_or_a_bad_file_is_a_usage_error(tmp_path: Path) -> None:
    for args in (["ws://127.0.0.1:1/ws", "--ca", "x.pem"],
                 ["wss://127.0.0.1:1/ws", "--ca", str(tmp_path / "none.pem")]):  # fmt: skip
        res = subprocess.run(
            [sys.executable, "-m", "client.desktop", *args, "--flops", "1e9"],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert res.returncode == 2 and "--ca" in res.stderr
