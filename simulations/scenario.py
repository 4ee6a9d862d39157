"""Scenario files: a job plus the world it runs in, as TOML.

A scenario is everything a simulated run needs and nothing else, so the same file always gives
the same results: ``name`` and ``seed``; ``[job]``, a coordinator job file verbatim
(coordinator.core.config); ``[clients]`` (count, compute, latency, churn, ...); ``[server]``
(the FLOP/s of one machine: the linear baseline); ``[run]`` (``mode``: numeric or cost,
``max_steps``); an optional ``[sweep]`` (a grid: dotted path -> list of values) and an optional
``[federation]`` (the crowd split over edge coordinators that sync with a root:
simulations/federation.py). The link's bandwidth, message rate and frame size come from the
job's ``[link]`` (one home for limits); only the latency lives here, because it is a property
of the world, not a setting of the job. Loading reports every bad field at once, each with its
dotted path. An annotated file: docs/simulations.md ("Scenario files").
"""

from __future__ import annotations

import copy
import itertools
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    InstanceOf,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from coordinator.core.config import JobConfig, JobConfigError, parse_job
from protocol.limits import PROFILES, LinkLimits, profile
from simulations.attacks import AttackSpec
from simulations.churn import ChurnModel
from simulations.distributions import Distribution, Fixed, LogNormal, parse
from simulations.network import LinkSpec

#: Compute rates (docs/simulations.md, "Compute rates"), stated in every report.
#: "A player": our client on a laptop, held to a quarter of one core by the frame
#: budget. "One machine": this 2-core machine training alone (PyTorch, large
#: preset, batch 16: 180 steps/s x 203.6 MFLOP/step, brief "Measured"). The seed's
#: own Luau VM ran 100 large steps in 84.568 s: 2.4e8 FLOP/s, for both its server
#: and its players, which is what the seed-table scenarios assume.
PLAYER_FLOPS = 5.0e9
MACHINE_FLOPS = 3.6e10
SEED_LUAU_FLOPS = 2.4e8

#: Named compute profiles: ``clients.compute = "browser"``. FLOP/s while a task
#: computes (waiting for a task or an upload is the simulator's business, not
#: this rate), calibrated by ``benchmarks/browser.py`` on this 2-core machine
#: (docs/performance.md, "The browser client"): the medium preset at batch 16,
#: 6 x 18,944 weights x 16 = 1.82 MFLOP a step, in a headless Chromium worker,
#: WebAssembly SIMD 14,224 steps/s (25.9 GFLOP/s), plain JS 1,597 (2.9 GFLOP/s),
#: and the numba core on one thread 21,488 (39 GFLOP/s). A hidden tab computes
#: at a quarter of its share (client/web/src/worker.js). The spread (sigma 0.5:
#: half of the crowd within 0.7x-1.4x of the median) stands for the volunteers'
#: machines, which this one machine cannot measure.
COMPUTE_PROFILES: dict[str, Distribution] = {
    "browser": LogNormal(median=2.59e10, sigma=0.5),
    "browser-js": LogNormal(median=2.9e9, sigma=0.5),
    "browser-hidden": LogNormal(median=2.59e10 / 4, sigma=0.5),
    "desktop": LogNormal(median=3.9e10, sigma=0.5),
}

#: Milliseconds of each frame's budget the in-game client does not train in: the
#: network work inside the budget, a call per piece, and the end of the frame
#: where the next step no longer fits. ``benchmarks/frame_budget.py`` measured
#: 0.074, 0.185 and 0.431 of the desktop client's steps/s at 2, 4 and 8 ms a
#: 60 Hz frame ([64, 512, 512, 10], batch 16, ~0.5 ms a step): (budget - 0.8) x
#: 60 / 1000 gives 0.072, 0.192, 0.432 (docs/performance.md, "The frame budget").
FRAME_OVERHEAD_MS = 0.8

SCENARIO_DIR = Path(__file__).parent / "scenarios"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class AttackSection(_Section):
    """``[clients.attack]``: a share of the players lies (simulations/attacks.py)."""

    kind: Literal[
        "sign_flip", "scaled", "noise", "label_flip", "alie", "free_rider", "stale", "hijack"
    ]
    fraction: float = Field(ge=0, le=1, description="share of the players that are Byzantine")
    scale: float = -10.0
    noise: float = Field(default=1.0, gt=0)
    z: float = Field(default=1.0, gt=0)

    def spec(self) -> AttackSpec:
        return AttackSpec(**self.model_dump())


class ScenarioError(JobConfigError):
    """A scenario is invalid; ``errors`` holds ``(path, message)`` for every bad field
    (the job's own fields included, under ``job.``)."""


class ClientsSection(_Section):
    """The simulated population: how many, how fast, how far, how fickle."""

    count: int = Field(default=8, ge=1, le=100_000)
    compute: InstanceOf[Distribution] = Field(
        default=Fixed(value=PLAYER_FLOPS), validate_default=True
    )
    latency: InstanceOf[Distribution] = Field(default=Fixed(value=0.0), validate_default=True)
    churn: InstanceOf[ChurnModel] = Field(default_factory=ChurnModel.none)
    join_over_s: float = Field(default=0.0, ge=0, description="spread first connects over")
    silent_drops: float = Field(
        default=0.0, ge=0, le=1, description="share of drops only a heartbeat timeout notices"
    )
    duplicate_results: float = Field(
        default=0.0, ge=0, le=1, description="chance a player sends a result twice (fault)"
    )
    prefetch: bool = Field(
        default=True,
        description="players ask for their next task while they compute, where the job offers "
        "it (job.lease.prefetch: by default to slow links only)",
    )
    attack: AttackSection | None = Field(
        default=None, description="Byzantine players mixed into the crowd (simulations/attacks.py)"
    )
    warm_data: bool = Field(
        default=False,
        description="players start with every data shard cached (returning players); "
        "otherwise each fetches a shard over its link the first time a task names it",
    )
    volunteers: bool = Field(
        default=False,
        description="each player sends a volunteer key, so the run keeps credit per player "
        "(coordinator/core/credit.py) and the summary reports it",
    )
    frame_budget_ms: float | None = Field(
        default=None,
        gt=0,
        description="players compute inside their game's loop, this many ms a frame "
        "(client.ingame); unset: at the compute rate as given",
    )
    frame_hz: float = Field(default=60.0, gt=0, description="the game's frames per second")

    @model_validator(mode="after")
    def _budget_fits_a_frame(self) -> ClientsSection:
        if self.frame_budget_ms is not None and self.frame_budget_ms > 1000.0 / self.frame_hz:
            raise ValueError(
                f"frame_budget_ms {self.frame_budget_ms:g} exceeds the frame "
                f"({1000.0 / self.frame_hz:.3g} ms at frame_hz {self.frame_hz:g})"
            )
        return self

    @property
    def frame_share(self) -> float:
        """What a player's compute rate is multiplied by: the share of each frame
        it trains in, ``(frame_budget_ms - FRAME_OVERHEAD_MS) x frame_hz / 1000``
        (at least a tenth of the budget's share); 1 without a frame budget."""
        if self.frame_budget_ms is None:
            return 1.0
        train_ms = max(self.frame_budget_ms - FRAME_OVERHEAD_MS, 0.1 * self.frame_budget_ms)
        return train_ms * self.frame_hz / 1000.0

    def sample_flops(self, rng: np.random.Generator) -> float:
        """One player's FLOP/s while it has a task: its machine's rate (``compute``)
        times ``frame_share``."""
        return self.compute.sample(rng) * self.frame_share

    @field_validator("compute", "latency", mode="before")
    @classmethod
    def _parse_dist(cls, v: Any, info: ValidationInfo) -> Distribution:
        if info.field_name == "compute" and isinstance(v, str):
            if v not in COMPUTE_PROFILES:
                raise ValueError(
                    f"unknown compute profile {v!r}; expected one of {tuple(COMPUTE_PROFILES)} "
                    "or a number or distribution table (FLOP/s)"
                )
            return COMPUTE_PROFILES[v]
        return parse(v, str(info.field_name))

    @field_validator("compute", mode="after")
    @classmethod
    def _positive_rate(cls, v: Distribution) -> Distribution:
        if not v.mean > 0:
            raise ValueError("compute rate must have a mean > 0 FLOP/s")
        return v

    @field_validator("churn", mode="before")
    @classmethod
    def _parse_churn(cls, v: Any) -> ChurnModel:
        if isinstance(v, ChurnModel):
            return v
        if not isinstance(v, Mapping):
            raise ValueError("expected a table: {drop_per_minute = ...} or {session, rejoin}")
        return ChurnModel.from_table(v, "churn")


class FederationSection(_Section):
    """``[federation]``: the crowd split evenly over ``edges`` coordinators, each
    running ``[job]`` for its share and syncing with a root coordinator like
    ``crowdgrad coordinator --upstream`` does (coordinator/core/upstream.py)."""

    edges: int = Field(ge=1, le=1000)
    every_versions: int = Field(default=50, ge=1, description="edge versions between syncs")
    every_s: float = Field(
        default=30.0, gt=0, allow_inf_nan=False, description="or at most this long between syncs"
    )
    link: str = Field(default="lan", description="link profile of the edge-root links")
    latency: InstanceOf[Distribution] = Field(
        default=Fixed(value=0.01), validate_default=True, description="s, one way, edge to root"
    )
    #: ``[job]`` with ``[federation.root]`` merged in and ``link`` set (parse_scenario)
    root: JobConfig

    @field_validator("latency", mode="before")
    @classmethod
    def _parse_latency(cls, v: Any) -> Distribution:
        return parse(v, "latency")

    @field_validator("link")
    @classmethod
    def _known_profile(cls, v: str) -> str:
        profile(v)  # raises naming the profiles there are
        return v

    def to_dict(self) -> dict[str, Any]:
        d = self.model_dump(exclude={"latency", "root"})
        return d | {"latency": self.latency.to_dict(), "root": self.root.model_dump()}


class ServerSection(_Section):
    compute: float = Field(default=MACHINE_FLOPS, gt=0, description="FLOP/s of one machine")


class RunSection(_Section):
    mode: Literal["numeric", "cost"] = "numeric"
    max_steps: int | None = Field(default=None, ge=1, description="mini-batch steps, all clients")
    sample_every_s: float = Field(default=1.0, gt=0, description="time-series resolution")
    tick_every_s: float = Field(default=1.0, gt=0, description="coordinator tick period")
    max_virtual_s: float = Field(default=86_400.0, gt=0, description="hard stop, virtual s")


class Scenario(_Section):
    name: str = "scenario"
    description: str = ""
    seed: int = Field(default=0, ge=0)
    job: JobConfig = Field(default_factory=JobConfig)
    clients: ClientsSection = Field(default_factory=ClientsSection)
    server: ServerSection = Field(default_factory=ServerSection)
    run: RunSection = Field(default_factory=RunSection)
    sweep: dict[str, list[Any]] = Field(default_factory=dict)
    federation: FederationSection | None = None

    @property
    def limits(self) -> LinkLimits:
        """The job's link profile with its overrides applied."""
        link = self.job.link
        base = profile(link.profile)
        return LinkLimits(
            bytes_per_s=link.bytes_per_s or base.bytes_per_s,
            messages_per_s=link.messages_per_s or base.messages_per_s,
            max_message_bytes=link.max_message_bytes or base.max_message_bytes,
            burst=base.burst,
        )

    @property
    def link(self) -> LinkSpec:
        return LinkSpec.from_limits(self.limits, latency=self.clients.latency)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for results.json (distributions as their tables)."""
        d = self.model_dump(exclude={"clients", "job", "federation"})
        d["job"] = self.job.model_dump()
        c = self.clients
        d["clients"] = {
            "count": c.count,
            "compute": c.compute.to_dict(),
            "latency": c.latency.to_dict(),
            "churn": c.churn.to_dict(),
            "join_over_s": c.join_over_s,
            "silent_drops": c.silent_drops,
            "duplicate_results": c.duplicate_results,
            "prefetch": c.prefetch,
            "warm_data": c.warm_data,
        }
        if c.volunteers:
            d["clients"]["volunteers"] = True
        if c.frame_budget_ms is not None:
            d["clients"]["frame_budget_ms"] = c.frame_budget_ms
            d["clients"]["frame_hz"] = c.frame_hz
            d["clients"]["frame_share"] = c.frame_share
        if c.attack is not None:
            d["clients"]["attack"] = c.attack.model_dump()
        if self.federation is not None:
            d["federation"] = self.federation.to_dict()
        return d


def _errors(exc: ValidationError) -> list[tuple[str, str]]:
    out = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "<root>"
        msg = err["msg"].removeprefix("Value error, ")
        out.append((path, msg))
    return out


def parse_scenario(data: Mapping[str, Any], *, source: str = "<scenario>") -> Scenario:
    """Validate a mapping; raises ScenarioError listing every bad field."""
    data = dict(data)
    errors: list[tuple[str, str]] = []
    raw_job = data.get("job", {})
    job: JobConfig | None = JobConfig()
    if "job" in data:
        # Validated on its own so each bad job field is its own entry, "job.<path>".
        try:
            data["job"] = job = parse_job(data["job"], source="job")
        except JobConfigError as exc:
            errors += [(f"job.{p}", m) for p, m in exc.errors]
            del data["job"]
            job = None
    fed = data.get("federation")
    if isinstance(fed, Mapping) and "enabled" in fed:
        on = fed["enabled"]
        if not isinstance(on, bool):
            errors.append(("federation.enabled", f"expected true or false, got {on!r}"))
        data["federation"] = {k: v for k, v in fed.items() if k != "enabled"} if on else None
    if isinstance(data.get("federation"), Mapping):
        data["federation"], more = _federation_root(data["federation"], raw_job, job)
        errors += more
    try:
        scenario = Scenario.model_validate(data)
        if not errors:  # checked against a root job and a [job] that are valid
            errors += _federation_errors(scenario)
    except ValidationError as exc:
        errors += _errors(exc)
    if errors:
        raise ScenarioError(source, sorted(errors, key=lambda e: e[0]))
    return scenario


def _federation_errors(sc: Scenario) -> list[tuple[str, str]]:
    """What makes a valid ``[federation]`` unfit for the rest of the scenario."""
    fed = sc.federation
    if fed is None:
        return []
    errors = []
    if sc.run.mode != "numeric":
        errors.append(("run.mode", "a federation runs in numeric mode only"))
    if sc.run.max_steps is not None:
        errors.append(("run.max_steps", "a federation ends at the root's [job] stop: drop it"))
    if sc.clients.count < fed.edges:
        errors.append(
            (
                "federation.edges",
                f"{fed.edges} edges for {sc.clients.count} players (clients.count is the "
                "whole crowd, split over the edges)",
            )
        )
    root = fed.root
    if root.model != sc.job.model:
        errors.append(("federation.root.model", "the edges and the root share [job]'s model"))
    if not root.strategy.name.startswith("decentral"):
        errors.append(
            (
                "federation.root.strategy.name",
                f"{root.strategy.name!r}: an edge's result is its crowd's progress, a model "
                "difference; the root needs a decentral strategy",
            )
        )
    if fed.every_s >= root.lease.min_s:
        errors.append(
            (
                "federation.every_s",
                f"{fed.every_s:g} s is not below the root's lease.min_s ({root.lease.min_s:g} "
                "s): the root would take back each task before its sync (set lease.min_s "
                "in [federation.root])",
            )
        )
    return errors


def _federation_root(
    fed: Mapping[str, Any], raw_job: Any, job: JobConfig | None
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """``[federation]`` with ``root`` the root's job: ``[job]`` (``raw_job``, valid
    as ``job``) with the tables of ``[federation.root]`` merged in and its
    ``[link]`` the ``federation.link`` profile; and that job's errors. Where it
    cannot be built, ``root`` is a stand-in so that only the real errors show."""
    fed = dict(fed)
    overrides = fed.pop("root", {})
    fed["root"] = job or JobConfig()  # an invalid [job] is reported under job. only
    if not isinstance(overrides, Mapping):
        return fed, [("federation.root", "expected a table of job overrides")]
    if "link" in overrides:
        return fed, [("federation.root.link", "the edge-root link is federation.link")]
    if job is None or not isinstance(raw_job, Mapping):
        return fed, []
    raw = _merged(raw_job, overrides)
    link = fed.get("link", "lan")
    if isinstance(link, str) and link in PROFILES:  # otherwise federation.link says why
        raw["link"] = {"profile": link}
    try:
        fed["root"] = parse_job(raw, source="federation.root")
    except JobConfigError as exc:
        return fed, [(f"federation.root.{p}", m) for p, m in exc.errors]
    return fed, []


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in, tables recursively."""
    out = dict(base)
    for k, v in over.items():
        old = out.get(k)
        out[k] = _merged(old, v) if isinstance(old, Mapping) and isinstance(v, Mapping) else v
    return out


def load_raw(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(str(p), [("<file>", f"cannot read: {exc.strerror}")]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(str(p), [("<toml>", str(exc))]) from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a TOML scenario (a shipped name like ``table-4.6`` works too)."""
    p = resolve(path)
    return parse_scenario(load_raw(p), source=str(p))


def resolve(path: str | Path) -> Path:
    """A path, or the name of a shipped scenario under simulations/scenarios/."""
    p = Path(path)
    if p.exists():
        return p
    shipped = SCENARIO_DIR / f"{p.name.removesuffix('.toml')}.toml"
    return shipped if shipped.exists() else p


def shipped() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for k in keys[:-1]:
        nxt = node.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ScenarioError("<sweep>", [(dotted, f"{k!r} is not a table")])
        node = nxt
    node[keys[-1]] = value


def expand_sweep(
    data: Mapping[str, Any], *, source: str = "<scenario>"
) -> list[tuple[dict[str, Any], Scenario]]:
    """The grid of ``[sweep]``: one ``(point, scenario)`` per combination, in row-major order.

    A key naming several paths, ``"a.b,c.d" = [[1, 2], [3, 4]]``, moves them
    together (a preset and its dataset). Without a sweep, one point with the
    scenario itself. Each point is validated;
    an invalid combination is reported with its values.
    """
    base = dict(data)
    grid = base.pop("sweep", {}) or {}
    if not isinstance(grid, Mapping) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ScenarioError(source, [("sweep", "expected dotted keys mapping to non-empty lists")])
    keys = list(grid)
    out = []
    for values in itertools.product(*(grid[k] for k in keys)):
        point: dict[str, Any] = {}
        for key, value in zip(keys, values, strict=True):
            paths = [k.strip() for k in key.split(",")]
            if len(paths) == 1:
                point[key] = value
                continue
            if not isinstance(value, list) or len(value) != len(paths):
                raise ScenarioError(
                    source, [(f"sweep.{key}", f"each value must list {len(paths)} items")]
                )
            point.update(zip(paths, value, strict=True))
        d = copy.deepcopy(base)
        for k, v in point.items():
            _set_path(d, k, v)
        label = ", ".join(f"{k}={v}" for k, v in point.items())
        out.append((point, parse_scenario(d, source=f"{source} [{label}]" if label else source)))
    return out
