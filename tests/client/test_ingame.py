"""The in-game client on a fake clock, wired straight into a coordinator core.

No sockets and no wall clock: a compute piece advances the fake clock by a fixed
cost per step, the game's own work and its sleep advance it too, so every
assertion about budgets is exact (tests/e2e/test_ingame.py runs the real link).
"""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from typing import Any

import pytest

from client import compute
from client.ingame import InGameClient
from client.link import LinkState
from coordinator.core import events as ev
from coordinator.core.assembly import build_core
from protocol import messages as m
from protocol.errors import CLOSE_CODES, ErrorCode
from tests.coordinator.coord_helpers import digits, make_job

ROOT = Path(__file__).resolve().parents[2]
HZ = 60.0


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += max(0.0, seconds)


class CoreLink:
    """A Link straight into a Coordinator core: the core's frames arrive at the
    next ``poll``; the core is ticked whenever its wake-up time has come."""

    def __init__(self, world: World, client_id: str) -> None:
        self.world, self.cid = world, client_id
        self._state = LinkState.CONNECTING
        self._code: int | None = None
        self._inbox: list[bytes | str] = []

    @property
    def state(self) -> LinkState:
        return self._state

    @property
    def close_code(self) -> int | None:
        return self._code

    def poll(self) -> list[bytes | str]:
        if self._state is LinkState.CONNECTING:
            self._state = LinkState.OPEN
            return []
        self.world.tick()
        frames, self._inbox = self._inbox, []
        return frames

    def send(self, frame: bytes) -> None:
        if self._state is not LinkState.OPEN:
            return
        msg = m.decode(frame)
        now = self.world.clock()
        core = self.world.core
        if isinstance(msg, m.Hello):
            self.world.route(core.connect(self.cid, msg, now))
        else:
            self.world.route(core.receive(self.cid, msg, now, nbytes=len(frame)))

    def deliver(self, frame: bytes) -> None:
        if self._state is LinkState.OPEN:
            self._inbox.append(frame)

    def flush(self) -> None:
        pass

    def close(self, code: int, reason: str) -> None:
        if self._state is not LinkState.CLOSED:
            self._state, self._code = LinkState.CLOSED, code
            self.world.route(self.world.core.disconnect(self.cid, self.world.clock(), reason))

    def abort(self) -> None:
        self.close(1006, "aborted")


class World:
    """A core, a fake clock, the links the client opened and every core output."""

    def __init__(self, **job: Any) -> None:
        sections = {"strategy": {"name": "decentral-async", "tau": 8, "lr": 0.05}, **job}
        self.core = build_core(make_job(**sections), dataset=digits())
        self.clock = FakeClock()
        self.links: list[CoreLink] = []
        self.outputs: list[ev.Output] = []

    def link(self, url: str) -> CoreLink:
        link = CoreLink(self, f"c{len(self.links)}")
        self.links.append(link)
        return link

    def tick(self) -> None:
        wake = self.core.next_wakeup()
        if wake is not None and self.clock() >= wake:
            self.route(self.core.tick(self.clock()))

    def route(self, outputs: list[ev.Output]) -> None:
        for o in outputs:
            self.outputs.append(o)
            link = next((k for k in self.links if k.cid == getattr(o, "client_id", None)), None)
            if isinstance(o, ev.Send) and link is not None:
                link.deliver(o.frame)
            elif isinstance(o, ev.Close) and link is not None:
                link.close(o.code, o.reason)

    def of(self, kind: type) -> list[Any]:
        return [o for o in self.outputs if isinstance(o, kind)]


def _step_cost(monkeypatch: pytest.MonkeyPatch, clock: FakeClock, seconds: float) -> None:
    """Each optimizer step of a piece takes ``seconds`` of fake time."""
    real = compute.SlicedTask.run

    def run(self: compute.SlicedTask, n: int) -> int:
        done = real(self, n)
        clock.advance(done * seconds)
        return done

    monkeypatch.setattr(compute.SlicedTask, "run", run)


def _client(world: World, step_s: float, **kw: Any) -> InGameClient:
    spec = world.core.spec
    flops = spec.flops_per_sample(train=True) * world.core.job.data.batch / step_s
    return InGameClient("ws://core/ws", clock=world.clock, link=world.link, flops=flops, **kw)


def _frames(world: World, client: InGameClient, budget_s: float, n: int) -> list[tuple[int, float]]:
    """``n`` frames: the client's step, then the rest of the 1/60 s; per frame the
    steps computed and the fake seconds ``step`` took."""
    out = []
    for _ in range(n):
        t0, s0 = world.clock(), client.stats.steps
        client.step(budget_s)
        took = world.clock() - t0
        out.append((client.stats.steps - s0, took))
        world.clock.advance(1.0 / HZ - took)
    return out


def test_a_task_is_cut_into_frames_and_its_result_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World()
    _step_cost(monkeypatch, world.clock, 0.001)
    client = _client(world, 0.001)
    frames = _frames(world, client, 0.003, 120)
    # Every frame kept to its 3 ms: 3 steps of 1 ms, none more, none over.
    assert max(took for _, took in frames) <= 0.003 + 1e-12
    assert {steps for steps, _ in frames} <= {0, 3, 2, 1}
    assert client.stats.overruns == 0
    accepted = [a for a in world.of(ev.ResultAccepted) if a.client_id == "c0"]
    assert len(accepted) >= 10 and client.stats.results >= len(accepted)
    assert client.stats.steps >= 8 * len(accepted)  # tau = 8 per result


def test_a_step_longer_than_the_budget_runs_every_third_frame(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """10 ms steps, a 4 ms budget: the budget of two empty frames is banked and one
    step runs in the third (that frame overruns, the average holds)."""
    world = World()
    _step_cost(monkeypatch, world.clock, 0.010)
    client = _client(world, 0.010)
    frames = _frames(world, client, 0.004, 180)
    ran = [i for i, (steps, _) in enumerate(frames) if steps]
    assert ran and all(frames[i][0] == 1 for i in ran)
    assert all(b - a >= 3 for a, b in itertools.pairwise(ran))
    assert len(ran) >= (180 - ran[0]) // 3 - 3  # about every third frame, when work waits
    assert client.stats.overruns == len(ran)
    assert [a for a in world.of(ev.ResultAccepted) if a.client_id == "c0"]


def test_a_zero_budget_computes_nothing_but_keeps_the_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World()
    _step_cost(monkeypatch, world.clock, 0.001)
    client = _client(world, 0.001)
    _frames(world, client, 0.0, 60 * 60)  # a minute: three heartbeat timeouts
    assert client.stats.steps == 0 and client.computing
    assert not world.of(ev.ClientLeft)


def test_stop_finishes_the_task_then_says_bye(monkeypatch: pytest.MonkeyPatch) -> None:
    world = World()
    _step_cost(monkeypatch, world.clock, 0.001)
    client = _client(world, 0.001)
    frames = 0
    while client.stats.steps == 0:
        _frames(world, client, 0.002, 1)
        frames += 1
        assert frames < 100
    client.stop()
    while client.finished is None:
        _frames(world, client, 0.002, 1)
        frames += 1
        assert frames < 1000
    assert client.finished == "stopped" and client.exit_code == 0
    assert world.of(ev.ResultAccepted)
    assert world.of(ev.ClientLeft)[-1].reason == "bye: client stopping"


def test_a_dropped_link_reconnects_and_the_result_still_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World()
    _step_cost(monkeypatch, world.clock, 0.001)
    client = _client(world, 0.001)
    while client.stats.steps == 0:
        _frames(world, client, 0.002, 1)
    world.links[0].abort()  # mid-task
    _frames(world, client, 0.002, 600)
    assert len(world.links) >= 2 and client.stats.connects >= 2
    assert [a for a in world.of(ev.ResultAccepted) if a.client_id != "c0"]


def test_a_refusal_that_retrying_cannot_fix_ends_the_client() -> None:
    class Refused:
        state = LinkState.CLOSED
        close_code = CLOSE_CODES[ErrorCode.AUTH_FAILED]

        def poll(self) -> list[bytes | str]:
            return []

    client = InGameClient("ws://x/ws", clock=FakeClock(), link=lambda url: Refused())  # type: ignore[arg-type, return-value]
    client.step(0.004)
    assert client.exit_code == 2 and client.finished is not None


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="flops"):
        InGameClient("ws://x/ws", flops=0, link=World().link)
    with pytest.raises(ValueError, match="not a wss:// URL"):
        InGameClient("ws://x/ws", ca="ca.pem", link=World().link)
    client = InGameClient("ws://x/ws", link=World().link)
    with pytest.raises(ValueError, match="budget_s"):
        client.step(-1.0)


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("ingame_loop", ROOT / "examples/ingame_loop.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_example_game_loop_keeps_every_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/ingame_loop.py on the fake clock: 6 ms of game work and a 4 ms
    budget fit 16.7 ms, so every frame is one period and the client trains."""
    loop = _example()
    world = World()
    _step_cost(monkeypatch, world.clock, 0.0008)
    client = _client(world, 0.0008)
    run = loop.game_loop(
        hz=HZ,
        work=lambda: world.clock.advance(0.006),
        client=client,
        budget_s=0.004,
        frames=600,
        warmup_frames=60,
        clock=world.clock,
        sleep=world.clock.advance,
    )
    stats = loop.frame_stats(run["intervals"])
    assert stats["frames"] == 600 and stats["over_20ms"] == 0
    assert max(run["intervals"]) == pytest.approx(1.0 / HZ)
    assert run["t1"] - run["t0"] == pytest.approx(600 / HZ)
    assert client.stats.overruns == 0
    assert len(world.of(ev.ResultAccepted)) >= 20
