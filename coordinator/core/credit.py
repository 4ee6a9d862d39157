"""Credit, BOINC-style: the FLOPs of a volunteer's accepted work, granted once checked.

A volunteer is a stable identity across sessions and restarts: the public id of a
secret key its client keeps (``volunteer_id``), never the per-session resume
token. A result the core accepts is worth its task's FLOPs as the server sized it
(steps × batch × the trained model's FLOPs per sample), never what the client
claims. Without replication it is granted at once. With replication on, it is
*pending*: a replicated result is granted when its comparison finds it right
(``ResultVerified``), and that verification also vouches for the volunteer's
unchecked results since; a volunteer caught lying (``ClientExcluded``) loses all
its credit, pending and granted, and earns no more under that key. Refused
results earn nothing. Kept in checkpoints; ranked by granted FLOPs
(docs/operations.md, "Credit").
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

from coordinator.core import events as ev
from protocol.volunteer import volunteer_id

#: connections remembered with their volunteer
BY_CLIENT_MAX = 1 << 16


@dataclass(slots=True)
class Account:
    volunteer: str
    name: str
    #: FLOPs granted (checked, or replication off)
    flops: float = 0.0
    #: FLOPs of accepted results not checked yet (replication on)
    pending: float = 0.0
    #: results granted, and results not granted: proven wrong, or inconclusive
    #: (a copy replication could not judge: it was not used either)
    results: int = 0
    forfeited: int = 0
    first_seen: float = 0.0
    last_seen: float = 0.0
    #: caught lying: everything forfeited, and it earns nothing from here on
    excluded: bool = False


class CreditBook:
    """Every volunteer's account; see the module docstring."""

    def __init__(self, *, verified_only: bool) -> None:
        #: replication is on: results wait for a check before they count
        self.verified_only = verified_only
        self.accounts: dict[str, Account] = {}
        #: connection -> volunteer, for the events that name connections (a verdict
        #: may come after its client left; the oldest are forgotten past BY_CLIENT_MAX)
        self._by_client: OrderedDict[str, str] = OrderedDict()
        #: replicated results taken and awaiting their comparison: task -> (volunteer, flops)
        self._waiting: dict[int, tuple[str, float]] = {}
        #: per volunteer, how many of ``_waiting`` are its
        self._held: Counter[str] = Counter()
        #: per volunteer, accepted results that went in unchecked: (count, flops)
        self._unchecked: dict[str, tuple[int, float]] = {}
        self._ranked: list[Account] | None = None

    def join(self, client_id: str, key: str, name: str, now: float) -> str:
        """A connection said it is the volunteer with ``key``; returns the public id.
        The name is the one it gave last."""
        vid = volunteer_id(key)
        acct = self.accounts.get(vid)
        if acct is None:
            acct = self.accounts[vid] = Account(volunteer=vid, name=name, first_seen=now)
        acct.name, acct.last_seen = name, now
        self._by_client[client_id] = vid
        if len(self._by_client) > BY_CLIENT_MAX:
            self._by_client.popitem(last=False)
        self._ranked = None
        return vid

    def accepted(self, client_id: str, task_id: int, flops: float, *, replicated: bool) -> None:
        """The core took a result of ``flops``; ``replicated``: it waits for its twin."""
        vid = self._by_client.get(client_id)
        if vid is None:
            return  # an anonymous client: nothing to credit
        acct = self.accounts[vid]
        if acct.excluded:
            return
        if replicated:
            self._waiting[task_id] = (vid, flops)
            self._held[vid] += 1
            acct.pending += flops
        elif self.verified_only:
            n, f = self._unchecked.get(vid, (0, 0.0))
            self._unchecked[vid] = (n + 1, f + flops)
            acct.pending += flops
        else:
            acct.flops += flops
            acct.results += 1
        self._ranked = None

    def observe(self, event: ev.Output) -> None:
        """Replication's verdicts: a copy found right is granted and vouches for its
        volunteer's unchecked results; a wrong or inconclusive copy earns nothing (and
        vouches for nothing); a volunteer
        excluded for lying forfeits everything (see the module docstring)."""
        match event:
            case ev.ResultVerified():
                losers = {*event.losers, *event.inconclusive}
                pairs = zip((event.task_id, event.twin_id), event.client_ids, strict=True)
                for task_id, client_id in pairs:
                    held = self._waiting.pop(task_id, None)
                    if held is None:
                        continue
                    vid, flops = held
                    self._held[vid] -= 1
                    acct = self.accounts[vid]
                    if client_id in losers:
                        self._settle(acct, flops, 1, grant=False)
                        continue
                    self._settle(acct, flops, 1, grant=True)
                    n, f = self._unchecked.pop(vid, (0, 0.0))
                    self._settle(acct, f, n, grant=True)
                self._ranked = None
            case ev.ClientExcluded():
                vid = self._by_client.get(event.client_id)
                if vid is None:
                    return
                acct = self.accounts[vid]
                for task_id in [t for t, (v, _) in self._waiting.items() if v == vid]:
                    self._held[vid] -= 1
                    self._settle(acct, self._waiting.pop(task_id)[1], 1, grant=False)
                n, f = self._unchecked.pop(vid, (0, 0.0))
                self._settle(acct, f, n, grant=False)
                # Proven to lie: what it was granted (a twin that lied the same way
                # agrees with it) goes too, and it earns nothing more under this key.
                acct.forfeited += acct.results
                acct.flops, acct.results, acct.excluded = 0.0, 0, True
                self._ranked = None
            case _:
                pass

    def _settle(self, acct: Account, flops: float, results: int, *, grant: bool) -> None:
        """Pending FLOPs of ``results`` results become granted, or are forfeited."""
        acct.pending = max(0.0, acct.pending - flops)
        if not self._held[acct.volunteer] and acct.volunteer not in self._unchecked:
            acct.pending = 0.0  # nothing is pending: no float crumbs either
        if grant:
            acct.flops += flops
            acct.results += results
        else:
            acct.forfeited += results

    # -- reading -------------------------------------------------------------------

    def ranked(self) -> list[Account]:
        """Accounts by granted FLOPs, most first (ties: the earlier volunteer first)."""
        if self._ranked is None:
            self._ranked = sorted(
                self.accounts.values(), key=lambda a: (-a.flops, a.first_seen, a.volunteer)
            )
        return self._ranked

    def page(self, offset: int, limit: int) -> tuple[int, list[dict[str, Any]]]:
        """``(total, rows)``: the leaderboard from ``offset``, each row with its rank."""
        ranked = self.ranked()
        rows = [
            {"rank": offset + i + 1, **_public(a)}
            for i, a in enumerate(ranked[offset : offset + limit])
        ]
        return len(ranked), rows

    def one(self, vid: str) -> dict[str, Any] | None:
        acct = self.accounts.get(vid)
        if acct is None:
            return None
        return {"rank": self.ranked().index(acct) + 1, **_public(acct)}

    def total(self) -> float:
        return sum(a.flops for a in self.accounts.values())

    # -- checkpoints ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "accounts": [asdict(a) for a in self.accounts.values()],
            "waiting": [[t, v, f] for t, (v, f) in self._waiting.items()],
            "unchecked": {v: [n, f] for v, (n, f) in self._unchecked.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.accounts = {a["volunteer"]: Account(**a) for a in state["accounts"]}
        self._waiting = {int(t): (str(v), float(f)) for t, v, f in state["waiting"]}
        self._held = Counter(v for v, _ in self._waiting.values())
        self._unchecked = {str(v): (int(n), float(f)) for v, (n, f) in state["unchecked"].items()}
        self._ranked = None


def _public(a: Account) -> dict[str, Any]:
    return {
        "volunteer": a.volunteer,
        "name": a.name,
        "flops": a.flops,
        "pending_flops": a.pending,
        "results": a.results,
        "forfeited": a.forfeited,
        "excluded": a.excluded,
    }
