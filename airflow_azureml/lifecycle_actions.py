"""What the lifecycle reads and returns: the operator's limits, the actions, and a decision being built.

``lifecycle`` decides; the operator (``operators/job_base.py``) carries out these actions in order. A
decision's changes to the state take effect at its ``Remember`` actions, and ``Steps`` is what makes each
``Remember`` carry exactly the fields changed since the one before. Pure: no Airflow, no Azure.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from typing import Any, Literal

from airflow_azureml.lifecycle_state import ResubmissionState


@dataclass(frozen=True)
class Limits:
    """The operator's settings that the lifecycle reads (validated before any call)."""

    max_resubmits: int = 3
    loop_after: int = 2
    resubmit_backoff: float = 30.0
    fallback: str | None = None  # the fallback target's name; None: there is none
    deferrable: bool = False
    # A cancel no witness explains (``Classification.ambiguous``): "fail" takes it as a person's (final),
    # "resubmit" as lost capacity (counted against max_resubmits). Why "fail": docs/operators.md.
    on_ambiguous_cancel: Literal["fail", "resubmit"] = "fail"
    # With "resubmit": how long to wait for late evidence (a person's cancel shows in the Activity Log
    # minutes late) before resubmitting; spent in the triggerer when deferrable.
    evidence_wait: float = 900.0
    # The unit's deadline, resolved (epoch seconds); None: none. Checked before the unit's first job.
    deadline: float | None = None


# ------------------------------------------------------------------ actions
@dataclass(frozen=True)
class Log:
    level: int
    message: str


@dataclass(frozen=True)
class Remember:
    """Set these fields of the state, then store it (``task_state_store``): a crash after it leaves this record.

    A decision's changes take effect here and not before, so a record written earlier in the same
    decision (a spot history entry closed, say) never carries them ahead of their time.
    """

    changes: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Cancel:
    """Cancel a job: Airflow's cancel, already recorded in the state. ``tolerant``: a failed cancel is
    logged (it is sent again later); else it fails the try, whose retry finds the job still running."""

    job: str
    tolerant: bool = True


@dataclass(frozen=True)
class Record:
    """What a job showed of the spot cluster goes to its shared history (``preempted`` / ``completed``),
    or its running entry is closed (``ended``)."""

    job: str
    kind: Literal["preempted", "completed", "ended"]


@dataclass(frozen=True)
class CheckFallback:
    """Before a unit's first job: the fallback exists and runs on dedicated compute."""


@dataclass(frozen=True)
class CheckDeadline:
    """Before a unit's first job: a deadline that not even the fallback can meet fails the task now."""


@dataclass(frozen=True)
class AskSpotPolicy:
    """Ask the spot policy whether to move to the fallback, then ``moved_to_fallback`` with its answer.

    ``after``: the preempted job that asks (``None``: before a submit, after a failure, a cancel or a clear).
    """

    after: str | None = None


@dataclass(frozen=True)
class Resubmit:
    """Ask this module again (``resubmit``) once the spot policy has answered: its answer sets the back-off.

    Like ``CheckDuplicate``, a continuation: always a decision's last action.
    """

    job: str
    reason: str


@dataclass(frozen=True)
class CheckDuplicate:
    """Look up whether this cancelled job was cancelled as a duplicate of an older job of the unit (one
    LIST), then ask this module again (``after_cancel``). It comes after the job's record on the cluster."""

    job: str
    watched: bool
    # set when the cancel is ambiguous and ``on_ambiguous_cancel="resubmit"``: the verdict's reason
    resubmit: str | None = None


@dataclass(frozen=True)
class BackOff:
    """Wait before the next submit: in the triggerer when deferrable (then the try ends here), else in place."""

    job: str
    seconds: float
    in_triggerer: bool


@dataclass(frozen=True)
class Submit:
    """Submit the chain's next job. ``decided``: the spot policy has just been asked; ``after``: the preempted job."""

    decided: bool = False
    after: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class Wait:
    """Wait for the chain's newest job (it changed: a duplicate's older job, or the fallback's move)."""


@dataclass(frozen=True)
class Finish:
    """The unit of work is done: this job's result is the task's."""

    job: str


@dataclass(frozen=True)
class Raise:
    """The task fails with this outcome's error (a retry or a clear decides what comes next)."""

    job: str
    kind: Literal["failed", "user_canceled", "budget_spent", "queue_timeout"]
    message: str = ""


Action = (
    Log
    | Remember
    | Cancel
    | Record
    | CheckFallback
    | CheckDeadline
    | AskSpotPolicy
    | Resubmit
    | CheckDuplicate
    | BackOff
    | Submit
    | Wait
    | Finish
    | Raise
)


@dataclass(frozen=True)
class Decision:
    """The actions to carry out, in order, and the state as they leave it (for tests: the operator takes
    the changes from the ``Remember`` actions, where they take effect)."""

    state: ResubmissionState
    actions: tuple[Action, ...]


def _copy(state: ResubmissionState) -> ResubmissionState:
    return copy.deepcopy(state)


class Steps:
    """A decision being built: the state as it will be, and actions whose ``Remember`` actions carry the changes."""

    def __init__(self, state: ResubmissionState) -> None:
        self.state = _copy(state)
        self._stored = _copy(state)
        self.actions: list[Action] = []

    def add(self, *actions: Action) -> None:
        self.actions.extend(actions)

    def remember(self) -> None:
        changed = tuple(
            (f.name, copy.deepcopy(getattr(self.state, f.name)))
            for f in fields(ResubmissionState)
            if getattr(self.state, f.name) != getattr(self._stored, f.name)
        )
        self._stored = _copy(self.state)
        self.actions.append(Remember(changed))

    def done(self) -> Decision:
        return Decision(self.state, tuple(self.actions))
