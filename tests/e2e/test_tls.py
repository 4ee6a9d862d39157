"""TLS without a proxy: the coordinator serves wss:// and https:// from a certificate
and key; a desktop or in-game client that trusts that certificate (--ca, ca=) trains,
one that does not is refused by its own TLS check."""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from client.ingame import InGameClient
from coordinator.core import events as ev
from coordinator.http.server import CrowdServer
from coordinator.http.serving import BackgroundServer
from coordinator.runtime.service import CoreService
from tests.e2e.e2e_helpers import (
    HANG_GUARD_S,
    ROOT,
    Recorder,
    clients,
    digits_job,
    play_frames,
)


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


def _tls_server(crt: Path, key: Path) -> tuple[CoreService, Recorder, BackgroundServer]:
    """A six-version digits job behind TLS with ``crt``/``key`` (started by ``with``)."""
    service = CoreService(digits_job(stop={"target_accuracy": None, "max_versions": 6}))
    rec = Recorder()
    service.add_sink(rec)
    bg = BackgroundServer(CrowdServer(service), ssl_certfile=str(crt), ssl_keyfile=str(key))
    return service, rec, bg


def test_wss_with_a_self_signed_certificate(cert: tuple[Path, Path]) -> None:
    crt, key = cert
    service, rec, bg = _tls_server(crt, key)
    with bg:
        assert bg.url.startswith("wss://") and bg.http.startswith("https://")
        trust = ssl.create_default_context(cafile=str(crt))
        assert httpx.get(f"{bg.http}/healthz", verify=trust).json()["ok"] is True
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{bg.http}/healthz")  # the system store does not know it
        with clients(bg.url, ["trusting"], "--ca", str(crt)) as procs:
            assert service.done.wait(HANG_GUARD_S)
            assert procs["trusting"].wait(60) == 0
        untrusting = subprocess.run(
            [sys.executable, "-m", "crowdgrad", "client", bg.url, "--flops", "1e9",
             "--max-attempts", "1"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert {o.client_id for o in rec.of(ev.ResultAccepted)}
    # retrying cannot make the certificate trusted: refused at once, in a sentence
    assert untrusting.returncode == 2
    assert "its TLS certificate is not trusted" in untrusting.stderr
    assert "pass --ca PEM" in untrusting.stderr and "Traceback" not in untrusting.stderr


def test_ca_for_a_plain_url_or_a_bad_file_is_a_usage_error(tmp_path: Path) -> None:
    for args in (["ws://127.0.0.1:1/ws", "--ca", "x.pem"],
                 ["wss://127.0.0.1:1/ws", "--ca", str(tmp_path / "none.pem")]):  # fmt: skip
        res = subprocess.run(
            [sys.executable, "-m", "crowdgrad", "client", *args, "--flops", "1e9"],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert res.returncode == 2 and "--ca" in res.stderr


def test_ingame_client_over_wss_with_a_ca_file(cert: tuple[Path, Path]) -> None:
    crt, key = cert
    service, rec, bg = _tls_server(crt, key)
    with bg:
        untrusting = InGameClient(bg.url, name="untrusting")
        play_frames(untrusting, 30)
        trusting = InGameClient(bg.url, name="game", ca=crt)
        trusting.warm_up(budget_s=0.05)
        play_frames(trusting, 90)
        assert service.done.wait(10)
    assert untrusting.exit_code == 2, untrusting.finished
    assert untrusting.finished is not None and "certificate" in untrusting.finished
    assert untrusting.stats.connects == 0  # no websocket ever opened
    assert trusting.exit_code == 0, trusting.finished
    assert trusting.stats.results >= 1 and trusting.stats.connects == 1
    joined = {j.name for j in rec.of(ev.ClientJoined)}
    assert joined == {"game"}
    assert {o.client_id for o in rec.of(ev.ResultAccepted)}


def test_ingame_ca_for_a_plain_url_or_a_bad_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a wss://"):
        InGameClient("ws://127.0.0.1:1/ws", ca="x.pem")
    with pytest.raises(ValueError, match="ca "):
        InGameClient("wss://127.0.0.1:1/ws", ca=tmp_path / "none.pem")
