"""HTTP-level faults the emulator can inject: throttling, server errors, dropped connections, latency.

A fault hits ``before`` the work (the request never reaches the service) or ``after`` it: the
service commits the work, then the response is lost (``drop``) or replaced (``status``). The
second kind is what makes a client's retry meet its own earlier request.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

# Routes an after-commit fault is usually aimed at: (path regex, methods).
ROUTES: dict[str, tuple[str, tuple[str, ...]]] = {
    "invoke": (r"^/inference/batch/[^/]+/jobs$", ("POST",)),
    "job_put": (r"/workspaces/[^/]+/jobs/[^/]+$", ("PUT",)),
    "compute_put": (r"/workspaces/[^/]+/computes/[^/]+$", ("PUT",)),
    "cancel": (r"/workspaces/[^/]+/jobs/[^/]+/cancel$", ("POST",)),
    "token": (r"/oauth2/v2\.0/token$", ("POST",)),  # Entra ID's token endpoint (an outage)
}


@dataclass
class FaultRule:
    """One fault. ``count`` bounds how many requests it hits (None = unbounded).

    kind: ``status`` (answer ``status`` with optional ``retry_after``), ``drop`` (close the
    connection without answering), ``latency`` (delay ``seconds`` then answer normally).
    ``path`` is a regular expression searched in the request path; ``methods`` filters verbs.
    ``probability`` applies each hit with that chance, drawn from the emulator's seeded RNG.
    ``when``: ``before`` (default) or ``after`` the handler did the work. ``route``: a name in
    ``ROUTES`` (invoke, job_put, compute_put, cancel) that sets ``path`` and ``methods``.
    """

    kind: str
    status: int = 503
    retry_after: float | None = None
    seconds: float = 0.0
    path: str = ""
    methods: tuple[str, ...] = ()
    count: int | None = 1
    probability: float = 1.0
    when: str = "before"
    route: str | None = None
    hits: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.kind not in ("status", "drop", "latency"):
            raise ValueError(f"unknown fault kind {self.kind!r}")
        if self.when not in ("before", "after"):
            raise ValueError(f"when must be 'before' or 'after', not {self.when!r}")
        if self.route is not None:
            if self.route not in ROUTES:
                raise ValueError(f"unknown route {self.route!r}; known: {sorted(ROUTES)}")
            self.path, methods = ROUTES[self.route]
            self.methods = self.methods or methods
        self._pattern = re.compile(self.path) if self.path else None
        self.methods = tuple(m.upper() for m in self.methods)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FaultRule:
        allowed = {
            "kind",
            "status",
            "retry_after",
            "seconds",
            "path",
            "methods",
            "count",
            "probability",
            "when",
            "route",
        }
        unknown = set(data) - allowed
        if unknown:
            raise ValueError(f"unknown fault fields: {sorted(unknown)}")
        values = dict(data)
        if "methods" in values:
            values["methods"] = tuple(values["methods"])
        return cls(**values)

    @property
    def label(self) -> str:
        """How the request log names this fault: ``drop``, ``status``... with ``-after`` for after-commit ones."""
        return self.kind if self.when == "before" else f"{self.kind}-after"

    def exhausted(self) -> bool:
        return self.count is not None and self.hits >= self.count

    @property
    def targets_identity(self) -> bool:
        """Identity routes are faulted only by a rule aimed at them (``route="token"`` or an oauth2 path)."""
        return "oauth2" in self.path

    def matches(self, method: str, path: str, rng: random.Random, identity: bool = False) -> bool:
        if self.exhausted() or identity != self.targets_identity:
            return False
        if self.methods and method.upper() not in self.methods:
            return False
        if self._pattern is not None and not self._pattern.search(path):
            return False
        if self.probability < 1.0 and rng.random() >= self.probability:
            return False
        self.hits += 1
        return True


class FaultPlan:
    """The active fault rules, evaluated in order; the first match wins."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.rules: list[FaultRule] = []

    def add(self, rule: FaultRule) -> None:
        self.rules.append(rule)

    def clear(self) -> None:
        self.rules.clear()

    def pick(self, method: str, path: str, identity: bool = False) -> FaultRule | None:
        self.rules = [r for r in self.rules if not r.exhausted()]
        for rule in self.rules:
            if rule.matches(method, path, self.rng, identity):
                return rule
        return None
