"""A soak over real sockets: real processes, a hostile network, kill -9 on a schedule.

``run_soak`` starts a ``FaultProxy`` (testkit/faultproxy.py), a real
``crowdgrad coordinator --store FILE`` process behind it and ``clients`` real
``crowdgrad client`` processes that join through it. For ``duration_s`` it
SIGKILLs the coordinator at seeded times (``coordinator_kill_every_s``) and
restarts it on the same port and store, and SIGKILLs clients at seeded times
and restarts them after a seeded pause. After every coordinator kill, and once
more at the end, it waits until the proxy has read every byte the dead process
sent, then checks that every acknowledgement the proxy saw since the previous
check is in what a restart restores (testkit/soakcheck.py). After the
duration it gives every client ``rejoin_deadline_s`` to join again and be
acknowledged, reads ``/api/history`` and kill -9s the coordinator a last time.

The report (``SoakReport.to_json()``): acknowledged results lost, each kill's
recovery (respawn to first accepted result), clients that did not come back,
the coordinator's RSS sampled from /proc, accuracy over the run and the faults
the proxy injected. ``ok`` is the verdict; ``problems`` says what failed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testkit.faultproxy import FaultPlan, ProxyThread
from testkit.soakcheck import Ledger, StoreCheck, check_store, rss_mb, slope_mb_per_min
from testkit.soakreport import SoakReport, summarize

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True, kw_only=True)
class SoakConfig:
    duration_s: float
    clients: int = 4
    seed: int = 34
    faults: FaultPlan = field(default_factory=FaultPlan)
    coordinator_kill_every_s: tuple[float, float] = (150.0, 270.0)
    client_kill_every_s: float | None = 180.0  # mean, per client (None: never)
    client_down_s: tuple[float, float] = (0.5, 5.0)
    rss_every_s: float = 2.0
    rejoin_deadline_s: float = 120.0
    coordinator_args: tuple[str, ...] = ("--widths", "64,128,10", "--checkpoint-every", "20")
    client_args: tuple[str, ...] = ("--flops", "1e9", "--cpu-share", "0.5", "--priority", "normal")

    def schedule(self) -> tuple[list[float], list[list[tuple[float, float]]]]:
        """Coordinator kill times; per client, (kill time, seconds down). Seeded."""
        rng = random.Random(f"soak:{self.seed}:coordinator")
        kills, t = [], 0.0
        while (t := t + rng.uniform(*self.coordinator_kill_every_s)) < self.duration_s:
            kills.append(round(t, 3))
        clients: list[list[tuple[float, float]]] = []
        for i in range(self.clients):
            rng, plan, t = random.Random(f"soak:{self.seed}:client:{i}"), [], 0.0
            mean = self.client_kill_every_s
            while mean is not None and (t := t + rng.expovariate(1 / mean)) < self.duration_s:
                down = rng.uniform(*self.client_down_s)
                plan.append((round(t, 3), round(down, 3)))
                t += down
            clients.append(plan)
        return kills, clients


@dataclass(slots=True)
class _Slot:
    """One client's place in the crowd: the process now filling it, restarted after kills."""

    i: int
    name: str
    proc: subprocess.Popen[bytes] | None = None
    plan: list[tuple[float, float]] = field(default_factory=list)
    restart_at: float | None = None  # soak seconds
    kills: int = 0
    exited: str = ""  # why it left on its own: it is not restarted


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Soak:
    """One run; ``run()`` returns the report. Not reusable."""

    def __init__(self, cfg: SoakConfig, workdir: Path, say: Callable[[str], None]) -> None:
        self.cfg, self.dir, self.say = cfg, workdir, say
        self.store = workdir / "soak.db"
        self.port = free_port()
        self.env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
        self.env["PYTHONPATH"] = os.pathsep.join([str(ROOT), self.env.get("PYTHONPATH", "")])
        self.ledger = Ledger()
        self.proxy = ProxyThread(
            upstream=("127.0.0.1", self.port),
            plan=cfg.faults,
            seed=cfg.seed,
            horizon_s=cfg.duration_s,
            tap=self.ledger,
        )
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.runs: list[dict[str, Any]] = []  # one per coordinator process
        self.kills: list[dict[str, Any]] = []
        self.checks: list[StoreCheck] = []
        self.rss: list[tuple[float, int, float]] = []  # (soak s, run, MB)
        self.disruptions: list[tuple[str, float, str]] = []  # (client, soak s, cause)
        self.client_kills: list[tuple[float, str]] = []
        self._ledger_at = 0
        self.t0 = 0.0
        self.wall0 = 0.0

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- processes ------------------------------------------------------------------

    def _spawn_coordinator(self) -> None:
        args = [*("--host", "127.0.0.1", "--port", str(self.port), "--store", str(self.store))]
        args += ["--max-versions", "1000000000", "--patience", "0", "--seed", str(self.cfg.seed)]
        args += self.cfg.coordinator_args
        with (self.dir / "coordinator.log").open("ab") as log:
            self.coordinator = subprocess.Popen(
                [sys.executable, "-m", "crowdgrad", "coordinator", *args],
                cwd=self.dir, env=self.env, stdout=log, stderr=log,
            )  # fmt: skip
        pid = self.coordinator.pid
        self.runs.append({"run": len(self.runs), "pid": pid, "spawned": self.now()})
        deadline = time.monotonic() + 120  # a hang guard, not a claim
        while time.monotonic() < deadline:
            if self.coordinator.poll() is not None:
                code = self.coordinator.returncode
                raise SoakError(f"coordinator exited with {code}: {self._log()}")
            try:
                with urllib.request.urlopen(self._http("/healthz"), timeout=1):
                    self.runs[-1]["ready"] = self.now()
                    return
            except OSError:
                time.sleep(0.05)
        raise SoakError(f"coordinator not ready in 120 s: {self._log()}")

    def _spawn_client(self, slot: _Slot) -> None:
        cache = self.dir / f"cache-{slot.i}"
        cache.mkdir(exist_ok=True)
        url = f"ws://127.0.0.1:{self.proxy.proxy.port}/ws"  # type: ignore[union-attr]
        args = [url, "--name", slot.name, "--seed", str(self.cfg.seed * 100 + slot.i)]
        args += ["--cache-dir", str(cache), "--progress-interval", "30", *self.cfg.client_args]
        with (self.dir / f"client-{slot.i}.log").open("ab") as log:
            slot.proc = subprocess.Popen(
                [sys.executable, "-m", "crowdgrad", "client", *args],
                cwd=self.dir, env=self.env, stdout=log, stderr=log,
            )  # fmt: skip
        cause = "client restart" if slot.kills else "start"
        self.disruptions.append((slot.name, self.now(), cause))

    def _http(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _log(self, name: str = "coordinator.log", tail: int = 1500) -> str:
        path = self.dir / name
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    # -- the kill -9 and the check ----------------------------------------------------

    def _kill_coordinator(self, *, final: bool = False) -> None:
        assert self.coordinator is not None
        killed = self.now()
        self.coordinator.send_signal(signal.SIGKILL)
        self.coordinator.wait(30)
        run = self.runs[-1]
        run["killed"] = killed
        # Every byte the dead process sent is read once no upstream is left unread:
        # no new one can open while its port is closed.
        deadline = time.monotonic() + 30
        while (left := self._proxy(lambda p: p.upstreams_reading)) and time.monotonic() < deadline:
            time.sleep(0.02)
        events, self._ledger_at = self.ledger.since(self._ledger_at)
        acked = {e.task_id for e in events if e.promises}
        check = check_store(self.store, acked)
        self.checks.append(check)
        row = {
            "at_s": round(killed, 2),
            "run": run["run"],
            "final": final,
            "unread_upstreams": left,
            "acks_checked": check.checked,
            "lost": list(check.lost),
            "corrupt": list(check.corrupt),
            "resumes_from": check.version,
            "journaled": check.journaled,
            "checked_s": round(self.now() - killed, 3),
        }
        self.kills.append(row)
        lost = f", LOST {len(check.lost)}" if check.lost else ""
        self.say(
            f"{killed:7.1f} s  kill -9 coordinator (run {run['run']}): {check.checked} acks checked"
            f"{lost}; a restart resumes from v{check.version}"
        )

    def _proxy(self, read: Callable[[Any], Any]) -> Any:
        return self.proxy.call(lambda: read(self.proxy.proxy))

    # -- the run ------------------------------------------------------------------------

    def run(self) -> SoakReport:
        cfg = self.cfg
        kill_times, client_plans = cfg.schedule()
        proxy = self.proxy.start()
        self.t0, self.wall0 = proxy._t0, time.time() - (time.monotonic() - proxy._t0)
        slots = [_Slot(i, f"soak-{i}", plan=list(p)) for i, p in enumerate(client_plans)]
        problems: list[str] = []
        try:
            self._spawn_coordinator()
            for slot in slots:
                self._spawn_client(slot)
            self.say(f"soak: {cfg.clients} clients via proxy :{proxy.port} -> :{self.port}, "
                     f"{cfg.duration_s:.0f} s, kills at {kill_times}")  # fmt: skip
            self._loop(slots, kill_times)
            settle = self._settle(slots)
            status = self._get("/api/status")
            history = self._get("/api/history")
            self._kill_coordinator(final=True)
        except SoakError as exc:
            problems.append(str(exc))
            status, history, settle = {}, {}, {}
        finally:
            if self.coordinator is not None and self.coordinator.poll() is None:
                self.coordinator.kill()
                self.coordinator.wait(30)
            for slot in slots:
                if slot.proc is not None and slot.proc.poll() is None:
                    slot.proc.kill()
                    slot.proc.wait(30)
            faults = self._proxy(lambda p: (list(p.events), dict(p.bytes), list(p.schedule)))
            self.proxy.stop()
        return summarize(
            self, slots=slots, settle=settle, status=status, history=history,
            faults=faults, problems=problems,
        )  # fmt: skip

    def _loop(self, slots: list[_Slot], kill_times: list[float]) -> None:
        cfg, kills, next_rss = self.cfg, list(kill_times), 0.0
        while (now := self.now()) < cfg.duration_s:
            if now >= next_rss:
                self._sample_rss()
                next_rss = now + cfg.rss_every_s
            if kills and now >= kills[0]:
                kills.pop(0)
                self._kill_coordinator()
                self._spawn_coordinator()
                ready = self.runs[-1]["ready"]
                for slot in slots:
                    if slot.proc is not None and not slot.exited:
                        self.disruptions.append((slot.name, ready, "coordinator restart"))
            for slot in slots:
                self._tend(slot, now)
            time.sleep(0.05)

    def _tend(self, slot: _Slot, now: float) -> None:
        if slot.exited:
            return
        if slot.proc is not None and slot.proc.poll() is not None:  # not our kill: a defect
            said = self._log(f"client-{slot.i}.log", 600)
            slot.exited = f"exited with {slot.proc.returncode}: {said}"
            self.say(f"{now:7.1f} s  client {slot.name} {slot.exited}")
            return
        if slot.restart_at is not None and now >= slot.restart_at:
            slot.restart_at = None
            self._spawn_client(slot)
        elif slot.plan and now >= slot.plan[0][0] and slot.proc is not None:
            _, down = slot.plan.pop(0)
            slot.proc.send_signal(signal.SIGKILL)
            slot.proc.wait(30)
            slot.proc, slot.kills, slot.restart_at = None, slot.kills + 1, now + down
            self.client_kills.append((round(now, 2), slot.name))

    def _sample_rss(self) -> None:
        if self.coordinator is not None and (mb := rss_mb(self.coordinator.pid)) is not None:
            self.rss.append((round(self.now(), 2), self.runs[-1]["run"], round(mb, 1)))

    def _settle(self, slots: list[_Slot]) -> dict[str, Any]:
        """Every client still running must join again after its last disruption and
        be acknowledged after the soak's end, within ``rejoin_deadline_s``."""
        for slot in slots:  # a client killed just before the end starts again now
            if slot.restart_at is not None and not slot.exited:
                slot.restart_at = None
                self._spawn_client(slot)
        start = self.now()
        pending = {s.name for s in slots if not s.exited}
        last = {name: t for name, t, _ in self.disruptions}
        at = len(self.ledger.snapshot())
        while pending and self.now() - start < self.cfg.rejoin_deadline_s:
            events, at = self.ledger.since(at)
            for e in events:
                if e.client in pending and e.promises and e.t - self.t0 >= last[e.client]:
                    pending.discard(e.client)
            if self.now() >= (self.rss[-1][0] if self.rss else 0) + self.cfg.rss_every_s:
                self._sample_rss()
            time.sleep(0.2)
        return {"seconds": round(self.now() - start, 2), "not_back": sorted(pending)}

    def _get(self, path: str) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(self._http(path), timeout=30) as r:
                return json.loads(r.read())
        except OSError as exc:
            raise SoakError(f"GET {path}: {exc}") from None


class SoakError(Exception):
    """The soak could not go on (a coordinator that will not start): a failed run."""


def run_soak(cfg: SoakConfig, workdir: Path, say: Callable[[str], None] = print) -> SoakReport:
    workdir.mkdir(parents=True, exist_ok=True)
    return Soak(cfg, workdir, say).run()


__all__ = ["SoakConfig", "SoakError", "SoakReport", "run_soak", "slope_mb_per_min"]
