"""What ``crowdgrad client`` tells its person, as a real process against a real
coordinator on loopback: the join, the model and a summary when it leaves; why it
cannot connect, in a sentence and an exit code, never a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from coordinator.core import events as ev
from tests.e2e.e2e_helpers import ROOT, digits_job, free_port, running

OPEN_ENDED = {"target_accuracy": None, "max_versions": 1_000_000, "max_time_s": None, "patience": 0}


def crowdgrad_client(url: str, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "crowdgrad", "client", url, "--flops", "1e9", *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_nothing_listening_is_said_and_ends_with_exit_code_1() -> None:
    url = f"ws://127.0.0.1:{free_port()}/ws"
    res = crowdgrad_client(url, "--max-attempts", "1", timeout=60)
    assert res.returncode == 1
    assert f"cannot connect to {url}: connection refused" in res.stderr
    assert "gave up after 2 attempts" in res.stderr
    assert "Traceback" not in res.stderr + res.stdout


def test_a_host_that_does_not_resolve_is_said() -> None:
    res = crowdgrad_client("ws://no-such-host.invalid:8000/ws", "--max-attempts", "1", timeout=60)
    assert res.returncode in (1, 2)  # 2: the name does not exist; 1: no DNS here at all
    assert "the host name 'no-such-host.invalid' does not resolve" in res.stderr
    assert "Traceback" not in res.stderr + res.stdout


def test_joins_a_tiny_job_says_so_and_sums_up() -> None:
    job = digits_job(stop={"max_versions": 4, "target_accuracy": None})
    with running(job) as (bg, service, _):
        res = crowdgrad_client(bg.url, "--name", "talker")
        assert service.done.wait(30)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert f"joined job 'job' at {bg.url} as client c" in out and "(name talker)" in out
    assert "CPU share 100 % at idle priority" in out and "link lan" in out
    assert "model [64, 64, 10]: 4,810 parameters" in out
    assert "left after" in out and "the job finished (max_versions)" in out
    assert "tasks done" in out and " accepted" in out and "down" in out
    assert "Traceback" not in res.stderr + out


def test_quiet_says_nothing_when_all_goes_well() -> None:
    job = digits_job(stop={"max_versions": 2, "target_accuracy": None})
    with running(job) as (bg, service, _):
        res = crowdgrad_client(bg.url, "--quiet")
        assert service.done.wait(30)
    assert res.returncode == 0 and res.stdout == "", res.stdout


def test_a_wrong_token_is_a_sentence_and_exit_code_2() -> None:
    with running(digits_job(), join_token="right") as (bg, _, _):
        res = crowdgrad_client(bg.url, "--token", "wrong")
    assert res.returncode == 2
    assert "refused this client's join token" in res.stderr and "--token" in res.stderr
    assert "Traceback" not in res.stderr + res.stdout


def test_a_wrong_path_is_an_http_error_and_exit_code_2() -> None:
    with running(digits_job()) as (bg, _, _):
        url = bg.url.removesuffix("/ws") + "/nope"
        res = crowdgrad_client(url)
    assert res.returncode == 2
    assert f"cannot connect to {url}: the server answered HTTP 4" in res.stderr


def test_ctrl_c_is_in_the_summary() -> None:
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    with running(digits_job(stop=OPEN_ENDED)) as (bg, _, rec):
        proc = subprocess.Popen(
            [sys.executable, "-m", "crowdgrad", "client", bg.url, "--flops", "1e9"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert rec.wait_for(lambda: len(rec.of(ev.ResultAccepted)) >= 2, 60)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert proc.returncode == 0, err
    assert "left after" in out and "stopped (Ctrl-C)" in out
    assert "Traceback" not in out + err
