"""Issue 36 on the local stack: the local Functions host exports spans and metrics over OTLP to an
in-process receiver when OTEL_EXPORTER_OTLP_ENDPOINT is set; one trace from the POST's traceparent
through every delivery; a replay's trace linked to the first."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from azure.storage.blob import BlobServiceClient

from devstack.azurite import Azurite
from devstack.hostproc import HostProcess, host_env, init_storage
from tests.integration.helpers import unique
from tests.integration.test_e2e_host import FAST_QUEUES, app_dir, call, wait_status
from tests.otlp_receiver import OtlpReceiver, Span

pytestmark = pytest.mark.integration
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
SECRET = "s3cr3t-payload-value"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as started:
        yield started


@pytest.fixture
def host(azurite: Azurite, tmp_path: Path, receiver: OtlpReceiver) -> Iterator[HostProcess]:

    settings = {
        "JOBS_QUEUE": unique("otlp"),
        "LEDGER_CONTAINER": unique("ledger"),
        "RESULTS_CONTAINER": unique("res"),
        "PAYLOADS_CONTAINER": unique("pay"),
        "POISON_ARCHIVE_CONTAINER": unique("arch"),
        "ENABLE_TEST_KINDS": "1",
        "RETRY_BASE_SECONDS": "1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
        "QUEUE_METRICS_SCHEDULE": "*/2 * * * * *",
        "APPLICATIONINSIGHTS_CONNECTION_STRING": "",
    }
    env = host_env(azurite.connection_string, settings)
    init_storage(env)
    process = HostProcess(
        env,
        instance_id="otlp",
        log_path=tmp_path / "host.log",
        extra_args=["--app-dir", str(app_dir(tmp_path, FAST_QUEUES))],
    )
    process.settings = settings  # type: ignore[attr-defined]
    yield process.start()
    process.stop()


def eventually(what: str, check: Callable[[], bool], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not received within {timeout_s}s: {what}")
        time.sleep(0.2)


def of_job(receiver: OtlpReceiver, job_id: str) -> list[Span]:
    return [s for s in receiver.spans() if s.attributes.get("job.id") == job_id]


def post(host: HostProcess, body: Mapping[str, object], traceparent: str) -> int:
    import json
    import urllib.request

    req = urllib.request.Request(
        f"{host.url}/api/jobs",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"traceparent": traceparent},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return int(resp.status)


def test_a_posted_job_and_its_replay_arrive_over_otlp(
    host: HostProcess, receiver: OtlpReceiver, azurite: Azurite
) -> None:
    traceparent = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
    job = unique("tr")
    body = {"id": job, "kind": "fault", "payload": {"transient_failures": 1, "note": SECRET}}
    assert post(host, body, traceparent) == 202
    wait_status(host, job, {"completed"})
    wanted = ["job submit", "job process", "job process", "job handler", "job handler", "job complete"]

    def complete() -> bool:
        names = sorted(s.name for s in of_job(receiver, job))
        return all(names.count(n) >= wanted.count(n) for n in wanted)

    eventually("the job's spans", complete)
    spans = of_job(receiver, job)
    assert {s.trace_id for s in spans} == {TRACE_ID}
    [submit] = [s for s in spans if s.name == "job submit"]
    assert submit.parent_span_id == CALLER_SPAN
    deliveries = [s for s in spans if s.name == "job process"]
    assert {d.parent_span_id for d in deliveries} == {submit.span_id}
    assert sorted(d.attributes["job.outcome"] for d in deliveries) == ["completed", "retry_scheduled"]

    # poisoned, fixed, replayed through the API: the replay's trace links to the first
    poisoned = unique("po")
    marker = unique("fix")
    assert (
        post(host, {"id": poisoned, "kind": "fault", "payload": {"fail_unless_blob": marker}}, traceparent)
        == 202
    )
    wait_status(host, poisoned, {"poisoned"})
    results = host.settings["RESULTS_CONTAINER"]  # type: ignore[attr-defined]
    BlobServiceClient.from_connection_string(azurite.connection_string).get_container_client(
        results
    ).upload_blob(marker, b"fixed")

    def replayed() -> bool:  # the archive entry is written by the poison trigger, moments later
        status, report = call(host, "POST", "poison/replay", {"ids": [poisoned], "rate": 100})
        return status == 200 and report["replayed"] == [poisoned]

    eventually("the replay", replayed)
    wait_status(host, poisoned, {"completed"})
    eventually("the replay's spans", lambda: any(s.name == "job replay" for s in of_job(receiver, poisoned)))
    [replay] = [s for s in of_job(receiver, poisoned) if s.name == "job replay"]
    [first_submit] = [s for s in of_job(receiver, poisoned) if s.name == "job submit"]
    assert replay.trace_id != TRACE_ID and replay.links == [(TRACE_ID, first_submit.span_id)]
    eventually(
        "the replayed delivery",
        lambda: any(
            s.name == "job process" and s.trace_id == replay.trace_id for s in of_job(receiver, poisoned)
        ),
    )

    # the metrics arrive, the queue sample among them
    metrics = {
        "jobs.deliveries",
        "jobs.duration",
        "jobs.retries",
        "jobs.poisoned",
        "jobs.queue.depth",
        "jobs.replays",
    }
    eventually("the metrics", lambda: metrics <= receiver.metric_names())
    assert {p["queue"] for p in receiver.points("jobs.queue.depth")} == {"jobs", "poison", "parked"}
    assert {"job.kind": "fault", "job.reason_code": "bad_input_data"} in receiver.points("jobs.poisoned")
    assert SECRET.encode() not in receiver.raw_text()
