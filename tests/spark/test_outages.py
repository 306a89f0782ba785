"""Offloaded jobs ride out Spark API outages and are cancelled at their deadline or when poisoned.

Against the Livy, Databricks and Fabric fakes (real HTTP on loopback, results on a real Azurite), with a
fake clock driving the tracking steps: a 30-minute outage is 30 minutes of the clock, not of the
test. The shipped polling settings are used (10 s first delay, 300 s cap, 6-hour deadline).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from devstack.azurite import Azurite
from shared import ledger
from shared.config.settings import Settings
from shared.core.documents import Conflict
from shared.core.envelope import Envelope, encode_json
from shared.core.errors import RunAbandoned
from shared.jobs import aggregate
from shared.jobs.base import Completed, Continue, JobContext, Outcome
from shared.jobs.offload.aggregate_spark import abandon, offload, resume
from shared.pipeline.cancel import request_cancel
from shared.pipeline.processing import process_message
from shared.runtime.wiring import build_runtime
from shared.spark.databricks import DatabricksBackend
from shared.spark.fabric import FabricBackend
from shared.spark.livy import LivyBackend
from shared.spark.model import SparkBackend
from shared.storage.accounts import AzureAccount
from tests.integration.helpers import drain_raw, message
from tests.integration.helpers import settings_for as app_settings_for
from tests.spark.fake_fabric import BATCHES, LAKEHOUSE, TOKEN, WORKSPACE, FakeFabric, batch_id
from tests.spark.fakes import FakeDatabricks, FakeLivy, FakeServer
from tests.spark.helpers import PAYLOAD, make_ctx, settings_for, storage_for, unique, upload

pytestmark = pytest.mark.integration

SHIPPED_POLLING = {"SPARK_POLL_INITIAL_SECONDS": "10", "SPARK_POLL_MAX_SECONDS": "300"}
JOB_FILE = "abfss://jobs@acct.dfs.core.windows.net/aggregate_job.py"


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def livy_env(server: FakeServer) -> dict[str, str]:
    return {
        "SPARK_BACKEND": "livy", "SPARK_URL": server.url, "SPARK_JOB_FILE": JOB_FILE,
        "SPARK_LIVY_AUTH": "basic", "SPARK_LIVY_USER": "admin", "SPARK_LIVY_PASSWORD": "pw",
    }  # fmt: skip


def databricks_env(server: FakeServer) -> dict[str, str]:
    return {
        "SPARK_BACKEND": "databricks", "SPARK_URL": server.url, "SPARK_JOB_FILE": JOB_FILE,
        "SPARK_DATABRICKS_AUTH": "token", "SPARK_DATABRICKS_TOKEN": "dapi0123456789abcdef0123",
        "SPARK_DATABRICKS_CLUSTER_ID": "0101-abc",
    }  # fmt: skip


def fabric_env(server: FakeServer) -> dict[str, str]:
    return {
        "SPARK_BACKEND": "fabric", "SPARK_URL": server.url + "/v1", "SPARK_JOB_FILE": JOB_FILE,
        "SPARK_FABRIC_WORKSPACE_ID": WORKSPACE, "SPARK_FABRIC_LAKEHOUSE_ID": LAKEHOUSE,
    }  # fmt: skip


ENVS = {"livy": livy_env, "databricks": databricks_env, "fabric": fabric_env}


class Api:
    """One fake API with its backend on a fake clock, and how to move its first run."""

    def __init__(self, kind: str, azurite: Azurite, **extra: str) -> None:
        self.kind = kind
        self.clock = Clock()
        self.server: FakeLivy | FakeDatabricks | FakeFabric = (
            FakeLivy(auth="basic")
            if kind == "livy"
            else FakeDatabricks()
            if kind == "databricks"
            else FakeFabric()
        )
        self.settings = settings_for(azurite, {**ENVS[kind](self.server), **SHIPPED_POLLING, **extra})
        self.storage = storage_for(self.settings)
        if kind == "livy":
            self.backend: SparkBackend = LivyBackend(self.settings.spark, clock=self.clock)
        elif kind == "databricks":
            self.backend = DatabricksBackend(self.settings.spark, clock=self.clock)
        else:
            self.backend = FabricBackend(
                self.settings.spark, clock=self.clock, token_provider=lambda s: TOKEN
            )

    def run_id(self, n: int = 0) -> str:
        return {"livy": str(n), "databricks": str(1001 + n), "fabric": batch_id(n)}[self.kind]

    def set(self, state: str, n: int = 0) -> None:
        """state: running | success."""
        if isinstance(self.server, FakeLivy):
            self.server.set_state(int(self.run_id(n)), state)
        elif isinstance(self.server, FakeFabric):
            self.server.set_state(self.run_id(n), state, "Succeeded" if state == "success" else "Uncertain")
        elif state == "running":
            self.server.set_state(int(self.run_id(n)), "RUNNING")
        else:
            self.server.set_state(int(self.run_id(n)), "TERMINATED", "SUCCESS")

    def submits(self) -> int:
        pattern = {"livy": "/batches", "databricks": "/api/2.2/jobs/runs/submit", "fabric": BATCHES}
        return self.server.count("POST", pattern[self.kind])

    def cancels(self) -> int:
        if self.kind == "livy":
            return self.server.count("DELETE", r"/batches/\d+")
        if self.kind == "fabric":
            return self.server.count("DELETE", BATCHES + r"/[0-9a-f-]{36}")
        return self.server.count("POST", "/api/2.2/jobs/runs/cancel")

    def write_result(self, job_id: str) -> None:
        doc = {
            "id": job_id,
            "rows": [{"k": "a", "count": 2}],
            "input_rows": 2,
            "engine": "spark",
            "elapsed_s": 1.0,
        }
        self.storage.container(self.settings.results_container).upload_blob(f"{job_id}.json", json.dumps(doc))

    def step(self, ctx: JobContext, out: Outcome) -> Outcome:
        """The next continuation message: the clock moves on by its delay, then resume runs."""
        assert isinstance(out, Continue)
        self.clock.now += out.delay_s
        ctx.resume_state = out.state
        return resume(ctx, backend=self.backend, now=self.clock.now)


@pytest.fixture(params=["livy", "databricks", "fabric"])
def api(request: pytest.FixtureRequest, azurite: Azurite) -> Iterator[Api]:
    made = Api(request.param, azurite)
    yield made
    made.server.stop()


def test_a_30_minute_outage_poisons_nothing_and_the_run_completes_once(api: Api) -> None:
    ctx = make_ctx(api.settings, api.storage, PAYLOAD)
    out = offload(ctx, backend=api.backend)
    assert isinstance(out, Continue)
    sid = out.state["submission_id"]
    api.set("running")
    out = api.step(ctx, out)  # one good poll, then the API goes away
    assert isinstance(out, Continue) and out.state["poll_failures"] == 0

    api.server.down = True
    outage_start, steps = api.clock.now, 0
    while api.clock.now - outage_start < 30 * 60:
        out = api.step(ctx, out)  # never raises: a failed poll is no attempt
        steps += 1
        assert isinstance(out, Continue)
        assert out.state["submission_id"] == sid and out.state["submissions"] == 1
        assert out.delay_s <= 300
    assert out.state["poll_failures"] == steps and "cannot reach" in out.state["last_error"]
    assert api.server.dropped >= steps and steps >= 8  # backoff 20, 40, ... capped at 300 s

    api.server.down = False
    out = api.step(ctx, out)
    assert isinstance(out, Continue) and out.state["poll_failures"] == 0 and out.state["last_error"] == ""
    api.set("success")
    api.write_result(ctx.job_id)
    done = api.step(ctx, out)
    assert isinstance(done, Completed) and done.summary["submissions"] == 1
    assert api.submits() == 1 and api.cancels() == 0


def test_submit_during_an_outage_is_left_unconfirmed_and_made_once_when_the_api_returns(api: Api) -> None:
    ctx = make_ctx(api.settings, api.storage, PAYLOAD)
    api.server.down = True
    out = offload(ctx, backend=api.backend)
    assert isinstance(out, Continue) and out.state["submission_id"] is None
    for _ in range(6):  # look-ups that cannot be answered decide nothing
        out = api.step(ctx, out)
        assert isinstance(out, Continue) and out.state["submission_id"] is None
        assert out.state["submissions"] == 1
    api.server.down = False
    api.clock.now += 600  # past the confirm window: the first create never arrived
    out = api.step(ctx, out)
    assert isinstance(out, Continue) and out.state["submission_id"]
    # Livy, Fabric: not found past the window, so submission 2 is made. Databricks: the look-up is
    # the idempotent re-post of submission 1, which starts it. Either way one create, one run.
    assert out.state["submissions"] == (1 if api.kind == "databricks" else 2)
    assert api.submits() == 1 and api.cancels() == 0


def test_a_run_past_its_deadline_is_cancelled_on_the_cluster(api: Api) -> None:
    ctx = make_ctx(api.settings, api.storage, PAYLOAD)
    out = offload(ctx, backend=api.backend)
    assert isinstance(out, Continue)
    first = out.state["submission_id"]
    api.set("running")
    api.clock.now = out.state["submitted_at"] + api.settings.spark.run_timeout_s + 1
    ctx.resume_state = out.state
    after = resume(ctx, backend=api.backend, now=api.clock.now)
    assert isinstance(after, Continue)
    assert api.cancels() == 1 and after.state["cancelled"] == [first]
    assert after.state["submissions"] == 2 and after.state["submission_id"] != first


@pytest.mark.parametrize("kind", ["livy", "databricks", "fabric"])
def test_deadline_during_an_outage_cancels_once_the_api_answers_then_gives_up(
    azurite: Azurite, kind: str
) -> None:
    api = Api(kind, azurite, SPARK_MAX_SUBMISSIONS="1")
    try:
        ctx = make_ctx(api.settings, api.storage, PAYLOAD)
        out = offload(ctx, backend=api.backend)
        assert isinstance(out, Continue)
        api.set("running")
        api.server.down = True
        api.clock.now = out.state["submitted_at"] + api.settings.spark.run_timeout_s + 1
        out = api.step(ctx, out)  # past the deadline, the cancel cannot be made: try again later
        assert isinstance(out, Continue) and "cancel of" in out.state["last_error"]
        api.server.down = False
        with pytest.raises(RunAbandoned) as info:
            api.step(ctx, out)
        assert api.cancels() == 1
        assert info.value.cancelled_run is not None and info.value.cancelled_run["cancelled"] is True
        assert info.value.cancelled_run["submission_id"] == api.run_id()
    finally:
        api.server.stop()


# --- through the queue processor: attempts untouched, poisoned jobs' runs cancelled ----------------


def _process(rt: Any, env: Envelope) -> None:
    process_message(message(encode_json(env).encode()), rt)


def _continuation(rt: Any, env: Envelope, **changes: Any) -> Envelope:
    record = rt.ledger.get(env.id)
    assert record is not None
    seq = record.data["continuation"]["seq"]
    return Envelope(**{**env.__dict__, "continuation_seq": seq, **changes})


def test_processor_keeps_attempts_through_failed_polls_and_cancels_the_run_of_a_poisoned_job(
    azurite: Azurite,
) -> None:
    server = FakeLivy(auth="basic")
    try:
        settings: Settings = app_settings_for(azurite, **livy_env(server))
        rt = build_runtime(settings, handlers={"aggregate": aggregate.HANDLER})
        storage = storage_for(settings)
        upload(storage, "data", "in.csv", b"k\na\na\n")
        now = datetime.now(UTC)
        env = Envelope(id=unique("job-"), kind="aggregate", created_at=now, payload=PAYLOAD)
        _process(rt, env)
        record = rt.ledger.get(env.id)
        assert record is not None and record.data["status"] == ledger.OFFLOADED

        server.down = True
        for n in range(1, 4):
            _process(rt, _continuation(rt, env))
            data = rt.ledger.get(env.id).data  # type: ignore[union-attr]
            assert data["status"] == ledger.OFFLOADED and data["attempt"] == 0
            assert data["continuation"]["state"]["poll_failures"] == n
        server.down = False

        # The job's time to live ends while it is offloaded: it is poisoned, and its run cancelled.
        past = datetime.now(UTC) - timedelta(seconds=1)
        _process(rt, _continuation(rt, env, expires_at=past, created_at=now - timedelta(hours=1)))
        data = rt.ledger.get(env.id).data  # type: ignore[union-attr]
        assert data["status"] == ledger.POISONED
        assert server.count("DELETE", "/batches/0") == 1 and server.batches[0]["state"] == "killed"
        assert data["cancelled_run"]["cancelled"] is True and data["cancelled_run"]["submission_id"] == "0"
        assert [h["event"] for h in data["history"]][-2:] == ["run_cancelled", "poisoned"]
    finally:
        server.stop()


def test_a_run_on_another_backend_is_not_cancelled_on_this_one(azurite: Azurite) -> None:
    api = Api("livy", azurite)
    try:
        saved = {"backend": "databricks", "submission_id": "7", "name": "n", "submitted_at": 1.0}
        run = abandon(api.settings, AzureAccount(api.storage, api.settings.storage), "job-x", saved)
        assert run is not None and run["cancelled"] is False
        assert "SPARK_BACKEND is now livy" in run["error"] and api.server.requests == []
    finally:
        api.server.stop()


def test_an_operator_cancel_poisons_the_job_at_its_next_check_and_cancels_its_run(azurite: Azurite) -> None:
    server = FakeLivy(auth="basic")
    try:
        settings: Settings = app_settings_for(azurite, **livy_env(server))
        rt = build_runtime(settings, handlers={"aggregate": aggregate.HANDLER})
        upload(storage_for(settings), "data", "in.csv", b"k\na\na\n")
        env = Envelope(id=unique("job-"), kind="aggregate", created_at=datetime.now(UTC), payload=PAYLOAD)
        _process(rt, env)
        assert "cancel requested" in request_cancel(rt, env.id, by="ops", reason="wrong input")
        _process(rt, _continuation(rt, env))
        data = rt.ledger.get(env.id).data  # type: ignore[union-attr]
        assert data["status"] == ledger.POISONED and data["reason_code"] == "cancelled"
        assert "cancelled by ops: wrong input" in data["reason"]
        assert server.count("DELETE", "/batches/0") == 1 and data["cancelled_run"]["cancelled"] is True
        bodies = drain_raw(rt, settings.poison_queue)  # the body is kept: replayable like any poison
        assert [json.loads(b)["id"] for b in bodies] == [env.id]
        with pytest.raises(Conflict, match="nothing to cancel"):
            request_cancel(rt, env.id)
    finally:
        server.stop()
