"""offload()/resume() with a scripted in-memory backend, results on a real Azurite."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from devstack.azurite import Azurite
from shared.aggregation.result import error_blob
from shared.config.settings import Settings
from shared.core.errors import DownstreamUnavailable, InputDataError, NotAvailable, PermanentError
from shared.jobs.base import Completed, Continue
from shared.jobs.offload.aggregate_spark import build_request, offload, resume
from shared.spark.backends import backend_for
from shared.spark.model import RunStatus, SparkJobRequest, Submission
from shared.storage.clients import StorageClients
from tests.spark.helpers import PAYLOAD, Checkpoints, make_ctx, settings_for, storage_for

SPARK_ENV = {
    "SPARK_BACKEND": "standalone",
    "SPARK_URL": "http://127.0.0.1:9",
    "SPARK_MASTER_UI_URL": "http://127.0.0.1:9",
    "SPARK_JOB_FILE": "/x/aggregate_job.py",
}

pytestmark = pytest.mark.integration


@dataclass
class ScriptedBackend:
    """A SparkBackend whose runs' states the test sets."""

    name: str = "standalone"
    submitted: list[SparkJobRequest] = field(default_factory=list)
    states: dict[str, RunStatus] = field(default_factory=dict)
    findable: dict[str, str] = field(default_factory=dict)
    cancelled: list[str] = field(default_factory=list)
    finds: int = 0
    now: float = field(default_factory=time.time)

    def submit(self, job: SparkJobRequest) -> Submission:
        self.submitted.append(job)
        sid = f"run-{len(self.submitted)}"
        self.states[sid] = RunStatus("pending")
        self.findable[job.name] = sid
        return Submission(self.name, sid, job.name, self.now)

    def status(self, submission_id: str) -> RunStatus:
        return self.states.get(submission_id, RunStatus("unknown", "forgotten"))

    def find(self, job: SparkJobRequest) -> Submission | None:
        self.finds += 1
        sid = self.findable.get(job.name)
        return None if sid is None else Submission(self.name, sid, job.name, 1000.0)

    def cancel(self, submission_id: str) -> None:
        self.cancelled.append(submission_id)


@pytest.fixture
def env(azurite: Azurite) -> tuple[Settings, StorageClients]:
    settings = settings_for(azurite, SPARK_ENV, SPARK_MAX_SUBMISSIONS="2", SPARK_POLL_INITIAL_SECONDS="10")
    return settings, storage_for(settings)


def write_result(settings: Settings, storage: StorageClients, job_id: str, **extra: Any) -> None:
    doc = {
        "id": job_id,
        "rows": [{"k": "a", "count": 2}],
        "input_rows": 2,
        "engine": "spark",
        "elapsed_s": 1.0,
        **extra,
    }
    storage.container(settings.results_container).upload_blob(
        f"{job_id}.json", json.dumps(doc), overwrite=True
    )


def write_error(settings: Settings, storage: StorageClients, job_id: str, submission: int, kind: str) -> None:
    doc = {"id": job_id, "submission": submission, "kind": kind, "error": f"{kind}: the driver's words"}
    storage.container(settings.results_container).upload_blob(error_blob(job_id, submission), json.dumps(doc))


def test_offload_submits_once_and_continues(env: tuple[Settings, StorageClients]) -> None:
    settings, storage = env
    backend, checkpoints = ScriptedBackend(), Checkpoints()
    ctx = make_ctx(settings, storage, PAYLOAD, checkpoints=checkpoints)
    out = offload(ctx, backend=backend)
    assert isinstance(out, Continue) and out.status == "offloaded" and out.delay_s == 10
    assert out.state["submission_id"] == "run-1" and out.state["submissions"] == 1 and out.state["polls"] == 0
    assert out.state["backend"] == "standalone" and out.state["submitted_at"] == backend.now
    saved = checkpoints.last
    assert saved is not None
    assert saved["spark_submitting"]["name"] == f"aggregate-{ctx.job_id}-s1"
    assert saved["spark_submitting"]["submission"] == 1
    assert backend.finds == 0  # first attempt, no sign of an earlier submit: no lookup


def test_offload_after_a_crash_mid_submit_finds_the_run_instead_of_submitting(
    env: tuple[Settings, StorageClients],
) -> None:
    settings, storage = env
    backend = ScriptedBackend()
    ctx = make_ctx(settings, storage, PAYLOAD)
    first = offload(ctx, backend=backend)
    assert isinstance(first, Continue)
    # The process died before the ledger saved Continue; the redelivery sees the checkpoint.
    again_ctx = make_ctx(
        settings,
        storage,
        PAYLOAD,
        ctx.job_id,
        progress={"spark_submitting": {"name": f"aggregate-{ctx.job_id}-s1"}},
    )
    again = offload(again_ctx, backend=backend)
    assert isinstance(again, Continue) and again.state["submission_id"] == "run-1"
    assert len(backend.submitted) == 1


def test_offload_when_a_result_already_exists_completes_without_submitting(
    env: tuple[Settings, StorageClients],
) -> None:
    settings, storage = env
    backend = ScriptedBackend()
    ctx = make_ctx(settings, storage, PAYLOAD)
    write_result(settings, storage, ctx.job_id)
    out = offload(ctx, backend=backend)
    assert isinstance(out, Completed) and out.result_ref == f"{settings.results_container}/{ctx.job_id}.json"
    assert backend.submitted == []


def test_redelivered_job_with_a_live_submission_polls_it(env: tuple[Settings, StorageClients]) -> None:
    settings, storage = env
    backend = ScriptedBackend()
    ctx = make_ctx(settings, storage, PAYLOAD)
    out = offload(ctx, backend=backend)
    assert isinstance(out, Continue)
    backend.states["run-1"] = RunStatus("running")
    delays = []
    for _ in range(3):
        ctx.resume_state = out.state
        out = resume(ctx, backend=backend)
        assert isinstance(out, Continue) and out.state["submission_id"] == "run-1"
        delays.append(out.delay_s)
    assert delays == [20, 40, 60]  # poll_initial 10 * 2^n, capped at SPARK_POLL_MAX_SECONDS=60
    assert len(backend.submitted) == 1


def test_success_is_verified_against_the_result_document(env: tuple[Settings, StorageClients]) -> None:
    settings, storage = env
    backend = ScriptedBackend()
    ctx = make_ctx(settings, storage, PAYLOAD)
    out = offload(ctx, backend=backend)
    assert isinstance(out, Continue)
    backend.states["run-1"] = RunStatus("succeeded")
    write_result(settings, storage, ctx.job_id)
    ctx.resume_state = out.state
    done = resume(ctx, backend=backend)
    assert isinstance(done, Completed)
    assert done.summary["engine"] == "spark" and done.summary["input_rows"] == 2
    assert done.summary["submission_id"] == "run-1" and done.summary["submissions"] == 1


def test_success_without_a_result_or_with_someone_elses_is_resubmitted(
    env: tuple[Settings, StorageClients],
) -> None:
    settings, storage = env
    backend = ScriptedBackend()
    ctx = make_ctx(settings, storage, PAYLOAD)
    out = offload(ctx, backend=backend)
    assert isinstance(out, Continue)
    backend.states["run-1"] = RunStatus("succeeded")
    write_result(settings, storage, ctx.job_id, id="another-job")
    ctx.resume_state = out.state
    again = resume(ctx, backend=backend)
    assert isinstance(again, Continue) and again.state["submissions"] == 2
    assert backend.submitted[-1].name.endswith("-s2") and "2" in backend.submitted[-1].args


def test_failures_are_resubmitted_then_poisoned_with_the_drivers_message(
    env: tuple[Settings, StorageClients],
) -> None:
    settings, storage = env
    backend = ScriptedBackend()
    ctx = make_ctx(settings, storage, PAYLOAD)
    out = offload(ctx, backend=backend)
    assert isinstance(out, Continue)
    backend.states["run-1"] = RunStatus("failed", "ExecutorLostFailure: executor 1 exited")
    ctx.resume_state = out.state
    out = resume(ctx, backend=backend)
    assert isinstance(out, Continue) and out.state["submission_id"] == "run-2" and out.delay_s == 10
    write_error(settings, storage, ctx.job_id, 2, "unexpected")
    backend.states["run-2"] = RunStatus("failed", "FAILED")
    ctx.resume_state = out.state
    with pytest.raises(
        PermanentError, match="after 2 submission\\(s\\): unexpected: the driver's words"
    ) as info:
        resume(ctx, backend=backend)
    assert not isinstance(info.value, InputDataError)
    assert len(backend.submitted) == 2


def test_bad_input_data_gives_up_at_once(env: tuple[Settings, StorageClients]) -> None:
    settings, storage = env
    backend = ScriptedBackend()
    ctx = make_ctx(settings, storage, PAYLOAD)
    out = offload(ctx, backend=backend)
    assert isinstance(out, Continue)
    write_error(settings, storage, ctx.job_id, 1, "input_data")
    backend.states["run-1"] = RunStatus("failed", "FAILED")
    ctx.resume_state = out.state
    with pytest.raises(InputDataError, match="input_data: the driver's words"):
        resume(ctx, backend=backend)
    assert len(backend.submitted) == 1


def test_forgotten_run_with_a_finished_result_completes_without_resubmitting(
    env: tuple[Settings, StorageClients],
) -> None:
    settings, storage = env
    backend = ScriptedBackend()
    ctx = make_ctx(settings, storage, PAYLOAD)
    out = offload(ctx, backend=backend)
    assert isinstance(out, Continue)
    del backend.states["run-1"]  # master restarted
    write_result(settings, storage, ctx.job_id)
    ctx.resume_state = out.state
    assert isinstance(resume(ctx, backend=backend), Completed)
    assert len(backend.submitted) == 1


def test_unconfirmed_submission_is_looked_up_then_polled(env: tuple[Settings, StorageClients]) -> None:
    settings, storage = env
    backend = ScriptedBackend()
    ctx = make_ctx(settings, storage, PAYLOAD)
    name = f"aggregate-{ctx.job_id}-s1"
    state = {
        "backend": "standalone",
        "submission_id": None,
        "name": name,
        "submitted_at": 1000.0,
        "submissions": 1,
        "polls": 0,
    }
    ctx.resume_state = state
    waiting = resume(ctx, backend=backend, now=1010.0)
    assert isinstance(waiting, Continue) and waiting.state["submission_id"] is None
    backend.findable[name] = "run-9"
    backend.states["run-9"] = RunStatus("running")
    ctx.resume_state = waiting.state
    found = resume(ctx, backend=backend, now=1020.0)
    assert isinstance(found, Continue) and found.state["submission_id"] == "run-9"
    assert backend.submitted == []


def test_unconfirmed_submission_not_found_in_time_is_resubmitted(
    env: tuple[Settings, StorageClients],
) -> None:
    settings, storage = env
    backend = ScriptedBackend()
    ctx = make_ctx(settings, storage, PAYLOAD)
    ctx.resume_state = {"backend": "standalone", "submission_id": None, "name": "x", "submitted_at": 1000.0}
    out = resume(ctx, backend=backend, now=1000.0 + 121)
    assert isinstance(out, Continue) and out.state["submissions"] == 2 and len(backend.submitted) == 1


def test_backend_changed_while_offloaded_is_permanent(env: tuple[Settings, StorageClients]) -> None:
    settings, storage = env
    ctx = make_ctx(settings, storage, PAYLOAD)
    ctx.resume_state = {"backend": "livy", "submission_id": "1", "name": "x", "submitted_at": 1000.0}
    with pytest.raises(PermanentError, match="offloaded to livy"):
        resume(ctx, backend=ScriptedBackend())


def test_request_keeps_the_connection_string_out_of_the_arguments(
    env: tuple[Settings, StorageClients],
) -> None:
    settings, storage = env
    ctx = make_ctx(settings, storage, PAYLOAD)
    request = build_request(ctx, 3)
    assert request.name == f"aggregate-{ctx.job_id}-s3"
    assert request.args[:3] == [ctx.job_id, request.args[1], settings.results_container]
    assert request.args[3:5] == ["--submission", "3"]
    assert "AccountKey" not in " ".join(request.args)
    assert "AccountKey" in request.env["AZURE_STORAGE_CONNECTION_STRING"]


def test_a_data_output_passes_the_payload_version_naming_its_blob(
    env: tuple[Settings, StorageClients],
) -> None:
    settings, storage = env
    assert "--version" not in build_request(make_ctx(settings, storage, PAYLOAD), 1).args  # json: as before
    ctx = make_ctx(settings, storage, {**PAYLOAD, "output": {"format": "parquet"}})
    ctx.version = 3
    args = list(build_request(ctx, 1).args)
    assert args[args.index("--version") + 1] == "3"


def test_livy_and_databricks_read_abfss_with_the_clusters_identity(azurite: Azurite) -> None:
    settings = Settings.from_env({
        "AzureWebJobsStorage__accountName": "prodacct", "SPARK_BACKEND": "livy", "SPARK_URL": "https://ws/livy",
        "SPARK_JOB_FILE": "abfss://jobs@prodacct.dfs.core.windows.net/aggregate_job.py",
        "SPARK_PY_FILES": "abfss://jobs@prodacct.dfs.core.windows.net/aggregate_engine.zip",
    })  # fmt: skip
    ctx = make_ctx(settings, storage_for(settings_for(azurite, SPARK_ENV)), PAYLOAD)
    request = build_request(ctx, 1)
    args = list(request.args)
    assert args[args.index("--input-url") + 1] == "abfss://data@prodacct.dfs.core.windows.net/in.csv"
    assert args[args.index("--results-url") + 1] == "abfss://results@prodacct.dfs.core.windows.net/"
    assert request.env == {}
    assert list(request.py_files) == ["abfss://jobs@prodacct.dfs.core.windows.net/aggregate_engine.zip"]


def test_no_backend_configured_is_not_available(azurite: Azurite) -> None:
    settings = settings_for(azurite, {})
    with pytest.raises(NotAvailable, match="SPARK_BACKEND"):
        backend_for(settings.spark)


def test_a_lookup_that_cannot_tell_never_submits(env: tuple[Settings, StorageClients]) -> None:
    settings, storage = env
    backend = CannotTell()
    ctx = make_ctx(settings, storage, PAYLOAD, attempt=1)  # a retry: the first may have submitted
    out = offload(ctx, backend=backend)
    assert isinstance(out, Continue) and out.state["submission_id"] is None and backend.submitted == []
    for n in (1, 2):
        ctx.resume_state = out.state
        out = resume(ctx, backend=backend, now=out.state["submitted_at"] + 3600)  # past the window
        assert isinstance(out, Continue) and out.state["poll_failures"] == n and backend.submitted == []
    backend.can_tell = True
    backend.findable[out.state["name"]] = "run-earlier"
    backend.states["run-earlier"] = RunStatus("running")
    ctx.resume_state = out.state
    out = resume(ctx, backend=backend)
    assert isinstance(out, Continue) and out.state["submission_id"] == "run-earlier"
    assert out.state["submissions"] == 1 and backend.submitted == []


@dataclass
class CannotTell(ScriptedBackend):
    """A busy standalone master: drivers not started yet, so `find` cannot tell."""

    can_tell: bool = False

    def find(self, job: SparkJobRequest) -> Submission | None:
        if not self.can_tell:
            raise DownstreamUnavailable("standalone: cannot tell yet whether it was submitted")
        return super().find(job)
