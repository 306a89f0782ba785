"""The small interface every Spark submission backend implements, and the values it passes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

RunState = Literal["pending", "running", "succeeded", "failed", "unknown"]
"""pending/running: live; succeeded/failed: terminal; unknown: the backend has forgotten the id."""

TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "unknown"})


@dataclass(frozen=True)
class SparkJobRequest:
    """One submission of a Spark job. Deterministic from (job id, submission number)."""

    job_id: str
    submission: int
    """1 for the first submission of this job, 2 for its first resubmission, ..."""
    name: str
    """Unique per (job id, submission): app/batch/run name, used to look the run up again."""
    job_file: str
    """Path or URL of the PySpark script, as the cluster sees it."""
    args: Sequence[str]
    """The script's arguments. Never secrets: they show in launch commands, logs and UIs."""
    py_files: Sequence[str] = ()
    conf: Mapping[str, str] = field(default_factory=dict)
    """Spark properties (visible in the Spark UI: no secrets)."""
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Driver environment (may hold a storage secret for a local cluster). Never logged."""

    @property
    def tags(self) -> dict[str, str]:
        return {"job_id": self.job_id, "submission": str(self.submission)}


@dataclass(frozen=True)
class Submission:
    """What a backend answered to a submit (or found when looking a run up by name)."""

    backend: str
    submission_id: str | None
    """None when the create call timed out and the run could not be found yet (unconfirmed)."""
    name: str
    submitted_at: float
    """Unix time of the submit call."""

    @property
    def confirmed(self) -> bool:
        return self.submission_id is not None


@dataclass(frozen=True)
class RunStatus:
    """A backend-neutral view of a run's state."""

    state: RunState
    message: str = ""
    """Why it failed (driver error, state message), or the raw backend state when live."""
    raw_state: str = ""

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


@dataclass(frozen=True)
class RunError:
    """What a failed run reported before it exited (its job's error report)."""

    message: str
    permanent: bool = False
    """The job said a new run cannot help (bad input data, bad payload)."""


class SparkBackend(Protocol):
    """Submit a job, ask for its status, find it by name, cancel it."""

    name: str

    def submit(self, job: SparkJobRequest) -> Submission:
        """Start a run. After a read timeout, look the run up before any retry (never blind-retry)."""
        ...

    def status(self, submission_id: str) -> RunStatus:
        """The run's state; `unknown` when the backend no longer knows the id."""
        ...

    def find(self, job: SparkJobRequest) -> Submission | None:
        """The run of this exact request if the backend has it (by name / idempotency token)."""
        ...

    def cancel(self, submission_id: str) -> None:
        """Ask the backend to stop the run (asynchronous; unknown ids are ignored)."""
        ...
