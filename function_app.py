"""The function app: wiring only. Each function hands its call to the `shared` package."""

import os

import azure.functions as func

from shared import poison, queues
from shared.interfaces import api
from shared.interfaces.console import routes as console_routes
from shared.observability import queue_metrics
from shared.pipeline import fair_trigger, processing, recovery
from shared.pipeline import retention_sweep as retention_apply
from shared.runtime.wiring import get_runtime

app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)

# Every 15 minutes in Azure: on Flex Consumption each run wakes an instance, which then polls both
# queues until it scales in, so a short period would keep an idle app awake for good (docs/deploy.md:
# what an idle deployment costs). What the sweeper archives (`-poison` messages past maxDequeueCount, whose
# handler kept failing; every body reaches handle_poison with messageEncoding none) is rare, and
# `poison peek` shows it meanwhile. Local stacks set POISON_SWEEP_SCHEDULE (local.settings.sample.json:
# every 30 s) so that a demo or a test sees such a message archived quickly. The same timer applies
# the blob retention rules when RETENTION_BY_APP is on (the local stack: Azurite has no lifecycle
# policy), at most every 5 minutes; in Azure the lifecycle policy deletes blobs. The index tables'
# retention (no policy deletes table data) runs here everywhere, at most hourly: it adds no run, and
# 9 requests an hour when nothing is due (shared/pipeline/retention_sweep.py).
SWEEP_SCHEDULE = os.environ.get("POISON_SWEEP_SCHEDULE", "").strip() or "0 */15 * * * *"


# Issue 46: the declared queues (JOBS_QUEUES, read at import; checked at start-up by the runtime,
# which refuses a bad one naming it). The default queue keeps `%JOBS_QUEUE%` when JOBS_QUEUES is
# unset, exactly as with one queue; each other queue gets its own trigger and poison handler here.
QUEUES = queues.wired_names(os.environ)
DEFAULT = "%JOBS_QUEUE%" if not os.environ.get("JOBS_QUEUES", "").strip() else QUEUES[0]
DEFAULT_CONNECTION = queues.trigger_connection(os.environ, QUEUES[0])
FAIR_SHARE = queues.fair_share_wired(os.environ)  # shared/pipeline/fair_share.py


def _wire_jobs(function_name: str, queue_name: str, connection: str, queue: str | None) -> None:
    """A queue's job trigger: `async def` under the fair share (an over-share job waits holding no
    thread of the worker's pool), else a sync function as with one queue."""
    if FAIR_SHARE:
        assert queue is not None

        @app.function_name(function_name)
        @app.queue_trigger(arg_name="msg", queue_name=queue_name, connection=connection)
        async def process_fairly(msg: func.QueueMessage, context: func.Context) -> None:
            await fair_trigger.process_fairly(msg, queue, context)

        return

    @app.function_name(function_name)
    @app.queue_trigger(arg_name="msg", queue_name=queue_name, connection=connection)
    def process(msg: func.QueueMessage) -> None:
        processing.process_message(msg, queue=queue)


_wire_jobs("process_job", DEFAULT, DEFAULT_CONNECTION, QUEUES[0] if FAIR_SHARE else None)


@app.function_name("handle_poison")
@app.queue_trigger(arg_name="msg", queue_name=f"{DEFAULT}-poison", connection=DEFAULT_CONNECTION)
def handle_poison(msg: func.QueueMessage) -> None:
    poison.handle_poison_message(msg)


def _wire_queue(name: str) -> None:
    """The trigger and the poison handler of one more declared queue (unique function names)."""
    suffix, connection = queues.env_name(name).lower(), queues.trigger_connection(os.environ, name)

    _wire_jobs(f"process_job_{suffix}", name, connection, name)

    @app.function_name(f"handle_poison_{suffix}")
    @app.queue_trigger(arg_name="msg", queue_name=f"{name}-poison", connection=connection)
    def handle(msg: func.QueueMessage) -> None:
        poison.handle_poison_message(msg, queue=name)


for _name in QUEUES[1:]:
    _wire_queue(_name)


@app.function_name("run_op_step")
@app.queue_trigger(arg_name="msg", queue_name=f"{DEFAULT}-ops", connection="AzureWebJobsStorage")
def run_op_step(msg: func.QueueMessage) -> None:
    poison.handle_op_message(msg)


@app.function_name("sweep_poison")
@app.timer_trigger(arg_name="timer", schedule=SWEEP_SCHEDULE, run_on_startup=False)
def sweep_poison(timer: func.TimerRequest) -> None:
    try:
        poison.sweep()
    finally:  # issues 21, 20: blob retention where no lifecycle policy runs; index tables everywhere
        retention_apply.on_timer()


# Issue 21: claims that ended without an outcome (a killed host) are re-sent to a live instance.
# Each worker that processes jobs checks every RECOVERY_INTERVAL_SECONDS while it lives; this timer
# runs when a host starts (a restarted host's own dead claims) and with the sweep, so it wakes no
# idle app more often than the sweep does.
RECOVERY_SCHEDULE = os.environ.get("RECOVERY_SCHEDULE", "").strip() or SWEEP_SCHEDULE


@app.function_name("recover_claims")
@app.timer_trigger(arg_name="timer", schedule=RECOVERY_SCHEDULE, run_on_startup=True)
def recover_claims(timer: func.TimerRequest) -> None:
    recovery.on_timer()


# Issue 36: depth and oldest-message age of the jobs, poison and parked queues (and the Spark runs in
# flight) for the alert rules of infra/main.bicep. By default with the sweep (the same wake-up, so an
# idle app wakes no more often): 3 to 6 requests a run (shared/observability/queue_metrics.py), 0.2 to 0.4 a
# minute every 15 minutes. QUEUE_METRICS_SCHEDULE samples more often, at the cost of wake-ups.
QUEUE_METRICS_SCHEDULE = os.environ.get("QUEUE_METRICS_SCHEDULE", "").strip() or SWEEP_SCHEDULE


@app.function_name("sample_queues")
@app.timer_trigger(arg_name="timer", schedule=QUEUE_METRICS_SCHEDULE, run_on_startup=False)
def sample_queues(timer: func.TimerRequest) -> None:
    queue_metrics.on_timer(get_runtime)


# The job's message goes out through the queue output binding: the host sends it when the function
# returns (before the answer) and wakes its own listener on the jobs queue at once, so the job is
# not left waiting for the next poll (shared/pipeline/submit.py).
@app.function_name("submit_job")
@app.route(route="jobs", methods=["POST"])
@app.queue_output(arg_name="job", queue_name=DEFAULT, connection=DEFAULT_CONNECTION)
def submit_job(req: func.HttpRequest, job: func.Out[str]) -> func.HttpResponse:
    return api.submit_job(req, job)


@app.function_name("get_job")
@app.route(route="jobs/{id}", methods=["GET"])
def get_job(req: func.HttpRequest) -> func.HttpResponse:
    return api.get_job(req)


@app.function_name("get_result")
@app.route(route="jobs/{id}/result", methods=["GET"])
def get_result(req: func.HttpRequest) -> func.HttpResponse:
    return api.get_result(req)


@app.function_name("health")
@app.route(route="health", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
def health(req: func.HttpRequest) -> func.HttpResponse:
    return api.health(req)


@app.function_name("poison_list")
@app.route(route="poison", methods=["GET"], auth_level=func.AuthLevel.ADMIN)
def poison_list(req: func.HttpRequest) -> func.HttpResponse:
    return api.list_poison(req)


@app.function_name("poison_replay")
@app.route(route="poison/replay", methods=["POST"], auth_level=func.AuthLevel.ADMIN)
def poison_replay(req: func.HttpRequest) -> func.HttpResponse:
    return api.replay_poison(req)


@app.function_name("poison_purge")
@app.route(route="poison/purge", methods=["POST"], auth_level=func.AuthLevel.ADMIN)
def poison_purge(req: func.HttpRequest) -> func.HttpResponse:
    return api.purge_poison(req)


# -- console (issue 12): pages and JSON under /api/console; the app authorises (Easy Auth principal
# with an allowed role or group in Azure; open on the local host) and checks CSRF on every POST.
@app.function_name("console")
@app.route(route="console/{*path}", methods=["GET", "POST"], auth_level=func.AuthLevel.ANONYMOUS)
def console(req: func.HttpRequest) -> func.HttpResponse:
    return console_routes.handle(req)


@app.function_name("console_api")
@app.route(route="console-api/{*path}", methods=["GET", "POST"], auth_level=func.AuthLevel.ADMIN)
def console_api(req: func.HttpRequest) -> func.HttpResponse:
    return console_routes.handle(req, keyed=True)
