"""HTTP-level faults the emulator can inject: throttling, server errors, dropped connections, latency."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FaultRule:
    """One fault. ``count`` bounds how many requests it hits (None = unbounded).

    kind: ``status`` (answer ``status`` with optional ``retry_after``), ``drop`` (close the
    connection without answering), ``latency`` (delay ``seconds`` then answer normally).
    ``path`` is a regular expression searched in the request path; ``methods`` filters verbs.
    ``probability`` applies each hit with that chance, drawn from the emulator's seeded RNG.
    """

    kind: str
    status: int = 503
    retry_after: float | None = None
    seconds: float = 0.0
    path: str = ""
    methods: tuple[str, ...] = ()
    count: int | None = 1
    probability: float = 1.0
    hits: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.kind not in ("status", "drop", "latency"):
            raise ValueError(f"unknown fault kind {self.kind!r}")
        self._pattern = re.compile(self.path) if self.path else None
        self.methods = tuple(m.upper() for m in self.methods)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FaultRule:
        allowed = {"kind", "status", "retry_after", "seconds", "path", "methods", "count", "probability"}
        unknown = set(data) - allowed
        if unknown:
            raise ValueError(f"unknown fault fields: {sorted(unknown)}")
        values = dict(data)
        if "methods" in values:
            values["methods"] = tuple(values["methods"])
        return cls(**values)

    def exhausted(self) -> bool:
        return self.count is not None and self.hits >= self.count

    def matches(self, method: str, path: str, rng: random.Random) -> bool:
        if self.exhausted():
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

    def pick(self, method: str, path: str) -> FaultRule | None:
        self.rules = [r for r in self.rules if not r.exhausted()]
        for rule in self.rules:
            if rule.matches(method, path, self.rng):
                return rule
        return None
