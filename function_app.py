"""The function app: wiring only. Each function hands its call to the `shared` package."""

import os

import azure.functions as func

from shared import poison
from shared.interfaces import api
from shared.interfaces.console import routes as console_routes
from shared.observability import queue_metrics
from shared.pipeline import processing, recovery
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


@app.function_name("process_job")
@app.queue_trigger(arg_name="msg", queue_name="%JOBS_QUEUE%", connection="AzureWebJobsStorage")
def process_job(msg: func.QueueMessage) -> None:
    processing.process_message(msg)


@app.function_name("handle_poison")
@app.queue_trigger(arg_name="msg", queue_name="%JOBS_QUEUE%-poison", connection="AzureWebJobsStorage")
def handle_poison(msg: func.QueueMessage) -> None:
    poison.handle_poison_message(msg)


@app.function_name("run_op_step")
@app.queue_trigger(arg_name="msg", queue_name="%JOBS_QUEUE%-ops", connection="AzureWebJobsStorage")
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
@app.queue_output(arg_name="job", queue_name="%JOBS_QUEUE%", connection="AzureWebJobsStorage")
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
