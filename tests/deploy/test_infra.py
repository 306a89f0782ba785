"""Offline validation of the infrastructure template (infra/main.json, mirrored by infra/main.bicep).

No Bicep compiler and no Azure are available to the tests, so the template is checked by:
- a JSON schema of the deployment-template structure,
- parsing every ARM expression and evaluating the whole template for several parameter sets
  (tests/deploy/armeval.py), then asserting on the resources, role assignments and app settings that
  the deployment would create, and that dependsOn orders every resource after what it reads,
- feeding the resulting app settings to the app's own settings validation (identity-based storage),
- parsing infra/main.bicep (pycep) and checking it declares the same resources, parameters, app
  settings and outputs as main.json.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from armeval import (
    RG_ID,
    ArmError,
    Deployed,
    calls_in,
    expand,
    fake_guid,
    is_expression,
    parse,
    walk_strings,
)

from shared.config.settings import Settings
from shared.jobs import registry
from shared.jobs.http import HttpHandler
from shared.jobs.kinds import configure_kinds, prefix_of
from shared.net.destinations import AllowList
from tests.deploy.infra_support import (
    CONTAINERS,
    ENTRIES_TABLE,
    FORBIDDEN_SETTINGS,
    PARAM_SETS,
    PLATFORM_SETTINGS,
    QUEUE_ENDS,
    REQUIRED_SETTINGS,
    ROOT,
    SCHEMA_PATH,
    TEMPLATE_PATH,
    app_settings,
    deployment,
    host_json_file,
    one,
)

# ------------------------------------------------------------------ structure and expressions


def test_template_matches_schema(template: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(template), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_every_expression_parses_and_uses_known_functions(template: dict[str, Any]) -> None:
    expressions = [s for s in walk_strings(template) if is_expression(s)]
    assert len(expressions) > 50
    declared_params = set(template["parameters"])
    declared_vars = set(template["variables"])
    used_params: set[str] = set()
    used_vars: set[str] = set()
    for text in expressions:
        node = parse(text)
        for call in calls_in(node):
            if call.name == "parameters":
                used_params.add(call.args[0].value)
            if call.name == "variables":
                used_vars.add(call.args[0].value)
            assert call.name != "listKeys", f"account keys must not be read: {text}"
    assert used_params <= declared_params, used_params - declared_params
    assert used_vars <= declared_vars, used_vars - declared_vars
    assert declared_params - used_params == set(), "unused parameters"
    assert declared_vars - used_vars == set(), "unused variables"


def test_parser_rejects_bad_expressions() -> None:
    for bad in [
        "[concat('a', 'b']",
        "[format('{0}', parameters('x')))]",
        "[foo('a') bar]",
        "['unterminated]",
    ]:
        with pytest.raises(ArmError):
            parse(bad)
    with pytest.raises(ArmError, match="unknown template function"):
        expand(
            {
                "parameters": {},
                "resources": [{"type": "A.B/c", "apiVersion": "2020-01-01", "name": "[nope()]"}],
            },
            {},
        )


def test_parameters_are_checked() -> None:
    template = json.loads(TEMPLATE_PATH.read_text(encoding="utf-8"))
    with pytest.raises(ArmError, match="sparkBackend"):
        expand(template, {"namePrefix": "jobs", "sparkBackend": "synapse"})
    with pytest.raises(ArmError, match="namePrefix"):
        expand(template, {})
    with pytest.raises(ArmError, match="maxLength"):
        expand(template, {"namePrefix": "waytoolongprefix"})


@pytest.mark.parametrize("case", sorted(PARAM_SETS))
def test_dependencies_order_every_read(template: dict[str, Any], case: str) -> None:
    resources, _ = deployment(template, case)
    by_id = {r.id.lower(): r for r in resources}
    assert len(by_id) == len(resources), "two resources with the same id"
    # every copy loop the template declares, those that deploy no copy too (a loop over an empty
    # parameter: extraJobsQueueNames), since depending on it is depending on none of its copies
    copies: dict[str, list[Deployed]] = {r["copy"]["name"]: [] for r in template["resources"] if "copy" in r}
    for r in resources:
        if r.copy_name:
            copies.setdefault(r.copy_name, []).append(r)

    def direct(r: Deployed) -> set[str]:
        out: set[str] = set()
        for dep in r.depends_on:
            if dep in copies:
                out |= {c.id.lower() for c in copies[dep]}
            else:
                assert dep.lower() in by_id, f"{r.name} dependsOn unknown {dep}"
                out.add(dep.lower())
        return out

    def closure(r: Deployed, seen: tuple[str, ...] = ()) -> set[str]:
        assert r.id.lower() not in seen, f"dependency cycle through {r.name}"
        deps = direct(r)
        return deps | {x for d in deps for x in closure(by_id[d], (*seen, r.id.lower()))}

    for r in resources:
        deps = closure(r)
        for ref in r.references:
            if ref.lower() in by_id:
                assert ref.lower() in deps, f"{r.type} {r.name} reads {ref} without dependsOn"
        # a child resource (name a/b) comes after its parent (a)
        if "/" in r.name and not r.type.startswith("Microsoft.Authorization/"):
            parent_id = r.id.rsplit("/", 2)[0].lower()
            assert parent_id in deps, f"{r.name} does not depend on its parent"
        # an extension resource comes after what it is attached to
        scope = r.body.get("scope")
        if scope:
            scope_id = r.id.split("/providers/Microsoft.Authorization/")[0].lower()
            assert scope_id in deps, f"{r.name} does not depend on its scope {scope}"


# ------------------------------------------------------------------ what gets deployed


@pytest.mark.parametrize("case", sorted(PARAM_SETS))
def test_storage_account_refuses_keys(template: dict[str, Any], case: str) -> None:
    resources, outputs = deployment(template, case)
    account = one(resources, "Microsoft.Storage/storageAccounts")
    props = account.body["properties"]
    assert props["allowSharedKeyAccess"] is False
    assert props["allowBlobPublicAccess"] is False
    assert props["minimumTlsVersion"] == "TLS1_2"
    assert props["supportsHttpsTrafficOnly"] is True
    assert account.body["kind"] == "StorageV2"
    assert re.fullmatch(r"[a-z0-9]{3,24}", account.name), account.name
    assert outputs["storageAccountName"] == account.name


@pytest.mark.parametrize("case", sorted(PARAM_SETS))
def test_queues_and_containers(template: dict[str, Any], case: str) -> None:
    resources, _ = deployment(template, case)
    account = one(resources, "Microsoft.Storage/storageAccounts").name
    queue = PARAM_SETS[case].get("jobsQueueName", "jobs")
    queues = {r.name for r in resources if r.type.endswith("/queueServices/queues")}
    containers = {r.name for r in resources if r.type.endswith("/blobServices/containers")}
    extra = PARAM_SETS[case].get("extraJobsQueueNames", [])
    assert queues == {f"{account}/default/{queue}{end}" for end in QUEUE_ENDS} | {
        f"{account}/default/{q}{end}" for q in extra for end in ("", "-poison", "-parked")
    }
    assert containers == {f"{account}/default/{c}" for c in CONTAINERS}
    tables = {r.name for r in resources if r.type == "Microsoft.Storage/storageAccounts/tableServices/tables"}
    assert tables == {f"{account}/default/{ENTRIES_TABLE}"}
    assert one(resources, "Microsoft.Storage/storageAccounts/tableServices").name == f"{account}/default"
    for r in resources:
        if r.type.endswith("/containers"):
            assert r.body["properties"]["publicAccess"] == "None"


@pytest.mark.parametrize("case", sorted(PARAM_SETS))
def test_flex_consumption_function_app(template: dict[str, Any], case: str) -> None:
    resources, outputs = deployment(template, case)
    plan = one(resources, "Microsoft.Web/serverfarms")
    site = one(resources, "Microsoft.Web/sites")
    identity = one(resources, "Microsoft.ManagedIdentity/userAssignedIdentities")
    account = one(resources, "Microsoft.Storage/storageAccounts")
    assert plan.body["sku"] == {"tier": "FlexConsumption", "name": "FC1"}
    assert plan.body["properties"]["reserved"] is True
    assert site.body["kind"] == "functionapp,linux"
    assert len(site.name) <= 60
    props = site.body["properties"]
    assert props["serverFarmId"] == plan.id
    assert props["httpsOnly"] is True
    assert "appSettings" not in props["siteConfig"], "app settings live in the sites/config resource only"
    assert site.body["identity"] == {"type": "UserAssigned", "userAssignedIdentities": {identity.id: {}}}
    config = props["functionAppConfig"]
    assert config["runtime"] == {"name": "python", "version": "3.11"}
    storage = config["deployment"]["storage"]
    assert storage["type"] == "blobContainer"
    assert storage["value"] == f"https://{account.name}.blob.core.windows.net/app-package"
    assert storage["authentication"] == {
        "type": "UserAssignedIdentity",
        "userAssignedIdentityResourceId": identity.id,
    }
    scale = config["scaleAndConcurrency"]
    assert scale["instanceMemoryMB"] == PARAM_SETS[case].get("instanceMemoryMB", 2048)
    assert "alwaysReady" not in scale, "always-ready instances cost money while idle"
    assert outputs["functionAppName"] == site.name
    assert outputs["functionAppHostName"] == f"{site.name}.azurewebsites.net"


@pytest.mark.parametrize("case", sorted(PARAM_SETS))
def test_app_settings_are_identity_based(template: dict[str, Any], case: str) -> None:
    resources, outputs = deployment(template, case)
    settings = app_settings(resources)
    identity = one(resources, "Microsoft.ManagedIdentity/userAssignedIdentities")
    account = one(resources, "Microsoft.Storage/storageAccounts")
    client_id = fake_guid("client", identity.id)
    assert set(settings) >= REQUIRED_SETTINGS, REQUIRED_SETTINGS - set(settings)
    assert not FORBIDDEN_SETTINGS & set(settings), FORBIDDEN_SETTINGS & set(settings)
    assert settings["AzureWebJobsStorage__accountName"] == account.name
    assert settings["AzureWebJobsStorage__credential"] == "managedidentity"
    assert settings["AzureWebJobsStorage__clientId"] == client_id
    assert (
        settings["AzureWebJobsStorage__tableServiceUri"] == f"https://{account.name}.table.core.windows.net/"
    )
    assert settings["AZURE_CLIENT_ID"] == client_id
    assert settings["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"] == f"ClientId={client_id};Authorization=AAD"
    assert settings["APPLICATIONINSIGHTS_CONNECTION_STRING"].startswith("InstrumentationKey=")
    assert outputs["identityClientId"] == client_id
    for name, value in settings.items():
        for secret_marker in ("AccountKey=", "SharedAccessSignature=", "sig=", "DefaultEndpointsProtocol="):
            assert secret_marker not in value, f"{name} carries a secret"
    params = PARAM_SETS[case]
    assert settings["INPUT_CONTAINERS"] == "inputs" == outputs["inputContainer"]
    assert settings["PYTHON_ENABLE_OPENTELEMETRY"] == "true"
    assert settings["JOBS_QUEUE"] == params.get("jobsQueueName", "jobs")
    extra = params.get("extraJobsQueueNames", [])
    assert settings["JOBS_QUEUES"] == (",".join([settings["JOBS_QUEUE"], *extra]) if extra else "")
    assert settings["MAX_ATTEMPTS"] == str(params.get("maxAttempts", 5))
    assert settings["HTTP_ALLOWED_HOSTS"] == params.get("httpAllowedHosts", "")
    assert settings["HTTP_FOLLOW_REDIRECTS"] == str(params.get("httpFollowRedirects", False)).lower()
    assert settings["HTTP_MAX_ATTEMPTS"] == str(params.get("httpMaxAttempts") or params.get("maxAttempts", 5))
    assert settings["HTTP_RETRY_JITTER"] == str(params.get("httpRetryJitter", True)).lower()
    assert (settings["HTTP_CONNECT_TIMEOUT_SECONDS"], settings["HTTP_RETRY_MAX_SECONDS"]) == ("5", "300")
    assert (settings["HTTP_INLINE_BODY_BYTES"], settings["HTTP_MAX_BODY_BYTES"]) == ("65536", "16777216")
    assert settings["SPARK_BACKEND"] == params.get("sparkBackend", "none")
    assert settings["SPARK_URL"] == params.get("sparkUrl", "")
    assert settings["SPARK_JOB_FILE"] == outputs["sparkJobFile"]
    assert settings["SPARK_PY_FILES"] == outputs["sparkPyFiles"]
    secret_uri = params.get("sparkDatabricksTokenSecretUri")
    expected_token = f"@Microsoft.KeyVault(SecretUri={secret_uri})" if secret_uri else ""
    assert settings["SPARK_DATABRICKS_TOKEN"] == expected_token
    assert settings["SPARK_DATABRICKS_AUTH"] == ("token" if secret_uri else "entra")
    password_uri = params.get("sparkLivyPasswordSecretUri")
    expected_password = f"@Microsoft.KeyVault(SecretUri={password_uri})" if password_uri else ""
    assert settings["SPARK_LIVY_PASSWORD"] == expected_password
    assert settings["SPARK_LIVY_USER"] == params.get("sparkLivyUser", "")
    for name, value in params.get("extraAppSettings", {}).items():
        if name not in REQUIRED_SETTINGS:
            assert settings[name] == value, "extra app settings are passed through"
    assert (
        one(resources, "Microsoft.Web/sites").body["properties"]["keyVaultReferenceIdentity"] == identity.id
    )


def test_worker_thread_pool_fits_the_queue_concurrency(template: dict[str, Any]) -> None:
    """PYTHON_THREADPOOL_THREAD_COUNT = batchSize + newBatchThreshold of host.json, in the template
    and in local.settings.sample.json: every message the host fetches can run at once."""
    queues = json.loads((ROOT / "host.json").read_text(encoding="utf-8"))["extensions"]["queues"]
    expected = str(queues["batchSize"] + queues["newBatchThreshold"])
    sample = json.loads((ROOT / "local.settings.sample.json").read_text(encoding="utf-8"))["Values"]
    assert sample["PYTHON_THREADPOOL_THREAD_COUNT"] == expected
    for case in PARAM_SETS:
        settings = app_settings(deployment(template, case)[0])
        assert settings["PYTHON_THREADPOOL_THREAD_COUNT"] == expected, case


def test_spark_job_file_defaults_per_backend(template: dict[str, Any]) -> None:
    _, livy = deployment(template, "livy")
    assert livy["sparkJobFile"] == (
        f"abfss://spark-jobs@{livy['storageAccountName']}.dfs.core.windows.net/aggregate_job.py"
    )
    _, databricks = deployment(template, "databricks")
    assert databricks["sparkJobFile"] == "/Workspace/Shared/queue-jobs/aggregate_job.py"
    _, standalone = deployment(template, "standalone")
    assert standalone["sparkJobFile"] == "/opt/jobs/aggregate_job.py"
    _, none = deployment(template, "defaults")
    assert none["sparkJobFile"] == ""
    assert livy["sparkPyFiles"] == livy["sparkJobFile"].replace("aggregate_job.py", "aggregate_engine.zip")
    assert databricks["sparkPyFiles"] == "/Workspace/Shared/queue-jobs/aggregate_engine.zip"
    assert none["sparkPyFiles"] == ""
    _, hdinsight = deployment(template, "hdinsight")
    assert hdinsight["sparkJobFile"] == PARAM_SETS["hdinsight"]["sparkJobFile"]
    assert hdinsight["sparkPyFiles"] == PARAM_SETS["hdinsight"]["sparkPyFiles"]


def test_template_settings_win_over_extra_app_settings(template: dict[str, Any]) -> None:
    resources, _ = deployment(template, "livy")
    settings = app_settings(resources)
    assert settings["SPARK_BACKEND"] == "livy"  # extraAppSettings tried "databricks"
    assert settings["SPARK_READ_TIMEOUT_SECONDS"] == "45"


# ------------------------------------------------------------------ the app accepts these settings


@pytest.mark.parametrize("case", sorted(PARAM_SETS))
def test_app_settings_pass_the_apps_validation(template: dict[str, Any], case: str, tmp_path: Path) -> None:
    resources, _ = deployment(template, case)
    env = app_settings(resources)
    parsed = Settings.from_env(env, host_json=host_json_file(tmp_path))
    account = one(resources, "Microsoft.Storage/storageAccounts").name
    identity = one(resources, "Microsoft.ManagedIdentity/userAssignedIdentities")
    assert parsed.storage.identity_based
    assert parsed.storage.connection_string is None
    assert parsed.storage.credential == "managedidentity"
    assert parsed.input_containers == ("inputs",)
    assert parsed.storage.account_name == account
    assert parsed.storage.client_id == fake_guid("client", identity.id)
    assert parsed.storage.blob_service_uri == f"https://{account}.blob.core.windows.net"
    assert parsed.storage.queue_service_uri == f"https://{account}.queue.core.windows.net"
    assert parsed.jobs_queue == PARAM_SETS[case].get("jobsQueueName", "jobs")
    assert parsed.max_attempts == PARAM_SETS[case].get("maxAttempts", 5)
    assert parsed.spark.backend == PARAM_SETS[case].get("sparkBackend", "none")
    kinds = configure_kinds(parsed, registry())  # the kinds' settings too: a bad one refuses to start
    http = kinds.handlers["http"]
    assert isinstance(http, HttpHandler)
    allowed = PARAM_SETS[case].get("httpAllowedHosts", "")
    assert http.config.outbound.allowed == AllowList.parse(allowed)
    assert http.config.follow_redirects is PARAM_SETS[case].get("httpFollowRedirects", False)
    expected = PARAM_SETS[case].get("httpMaxAttempts") or PARAM_SETS[case].get("maxAttempts", 5)
    assert kinds.retry["http"].attempts == expected
    assert kinds.retry["http"].jitter is PARAM_SETS[case].get("httpRetryJitter", True)


def test_every_app_setting_is_read_by_the_app(template: dict[str, Any]) -> None:
    sources = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "shared").rglob("*.py")))
    kinds_source = (ROOT / "shared" / "jobs" / "kinds.py").read_text(encoding="utf-8")
    suffixes = set(
        re.findall(r'f"\{prefix\}([A-Z_]+)"', kinds_source)
    )  # each kind's <PREFIX>MAX_ATTEMPTS, ...
    per_kind = {
        prefix_of(kind, handler) + suffix for kind, handler in registry().items() for suffix in suffixes
    }
    assert "HTTP_MAX_ATTEMPTS" in per_kind
    resources, _ = deployment(template, "databricks")
    for name in app_settings(resources):
        if name in PLATFORM_SETTINGS:
            continue
        assert name in sources or name in per_kind, f"app setting {name} is not read anywhere in shared/"


# ------------------------------------------------------------------ the app runs with what the template sets


def test_deployed_settings_and_host_json_export_every_log_once(template: dict[str, Any]) -> None:
    """host.json telemetryMode + PYTHON_ENABLE_OPENTELEMETRY: the host stops forwarding the worker's
    logs and the app exports them (shared/observability/telemetry.py), so each record arrives once."""
    from shared.observability.telemetry import host_telemetry_mode, telemetry_plan

    settings = app_settings(deployment(template, "defaults")[0])
    assert host_telemetry_mode(ROOT / "host.json") == "OpenTelemetry"
    plan = telemetry_plan(
        settings["APPLICATIONINSIGHTS_CONNECTION_STRING"],
        settings,
        in_worker=True,
        host_mode=host_telemetry_mode(ROOT / "host.json"),
    )
    assert (plan.export, plan.logs) == (True, True), plan.reason
    assert "PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY" not in settings, (
        "the worker would configure it twice"
    )


class _Refuses:
    """Queue/blob service stand-in whose create calls fail like a role scoped to the resource."""

    def __init__(self, status: int, code: str) -> None:
        self.status, self.code = status, code
        self.calls: list[str] = []

    def client(self, name: str, **_: object) -> _Refusing:
        return _Refusing(self, name)

    get_queue_client = client
    get_container_client = client


class _Refusing:
    """One queue or container of `_Refuses`."""

    def __init__(self, service: _Refuses, name: str) -> None:
        self.service = service
        self.queue_name = self.container_name = name

    def _fail(self) -> None:
        from azure.core.exceptions import HttpResponseError

        self.service.calls.append(self.queue_name)
        exc = HttpResponseError(message=f"{self.service.code} on {self.queue_name}")
        exc.status_code = self.service.status
        # the storage SDK sets `error_code`; azure-core does not declare it
        exc.error_code = self.service.code  # type: ignore[attr-defined]
        raise exc

    create_queue = _fail
    create_container = _fail


def test_start_up_tolerates_roles_scoped_to_each_resource(caplog: pytest.LogCaptureFixture) -> None:
    from shared.storage.accounts import AzureAccount, ensure_resources
    from shared.storage.clients import StorageClients
    from shared.storage.failures import StorageBusy

    settings = Settings.from_env({"AzureWebJobsStorage__accountName": "acct"}, host_json=ROOT / "host.json")
    refusing = _Refuses(403, "AuthorizationPermissionMismatch")
    clients = StorageClients(blob=refusing, queue_service=refusing)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="jobs.storage"):
        skipped = ensure_resources(AzureAccount(clients, settings.storage), settings)
    assert skipped == [
        "jobs",
        "jobs-poison",
        "jobs-parked",
        "ledger",
        "results",
        "payloads",
        "poison-archive",
    ]
    assert "not permitted to create ledger" in caplog.text
    broken = _Refuses(500, "InternalError")
    with pytest.raises(StorageBusy) as failed:  # not a refusal: start-up fails, naming it
        ensure_resources(
            AzureAccount(StorageClients(blob=broken, queue_service=broken), settings.storage),  # type: ignore[arg-type]
            settings,
        )
    assert (failed.value.status_code, failed.value.error_code) == (500, "InternalError")


# ------------------------------------------------------------------ the console's sign-in (issue 12)


def test_console_sign_in_is_easy_auth_with_entra_when_a_client_id_is_given(template: dict[str, Any]) -> None:
    """Easy Auth signs operators in (Entra ID) and lets anonymous requests through to the app,
    which checks the principal on /api/console; keyed producers keep working."""
    assert not [r for r in deployment(template, "defaults")[0] if r.name.endswith("/authsettingsV2")]
    resources, _ = deployment(template, "livy")
    auth = [r for r in resources if r.name.endswith("/authsettingsV2")]
    assert len(auth) == 1 and auth[0].type == "Microsoft.Web/sites/config"
    props = auth[0].body["properties"]
    assert props["platform"]["enabled"] is True
    assert props["globalValidation"] == {
        "requireAuthentication": False,
        "unauthenticatedClientAction": "AllowAnonymous",
    }
    aad = props["identityProviders"]["azureActiveDirectory"]
    assert aad["registration"]["clientId"] == PARAM_SETS["livy"]["consoleClientId"]
    assert aad["registration"]["openIdIssuer"].startswith("https://login.microsoftonline.com/")
    assert aad["registration"]["openIdIssuer"].endswith("/v2.0")
    assert "clientSecret" not in json.dumps(props).lower()
    settings = app_settings(resources)
    assert settings["CONSOLE_ALLOWED_ROLES"] == "Console.Operator"
    assert settings["CONSOLE_ALLOWED_GROUPS"] == PARAM_SETS["livy"]["consoleAllowedGroups"]
    assert len(settings["CONSOLE_CSRF_SECRET"]) >= 32, "the console requires its CSRF key in Azure"
    assert template["parameters"]["consoleCsrfSecret"]["type"] == "securestring", (
        "kept out of deployment history"
    )


# ------------------------------------------------------------------ retention (issue 21)


@pytest.mark.parametrize("case", sorted(PARAM_SETS))
def test_the_lifecycle_policy_implements_the_apps_retention_rules(
    template: dict[str, Any], case: str
) -> None:
    """Each rule the app derives from its settings (shared/config/retention.py) is a lifecycle rule of the
    account with the same container prefix, tag and days; nothing else is deleted (edits/, metrics,
    unfinished or poisoned ledger records have no rule)."""
    resources, _ = deployment(template, case)
    account = one(resources, "Microsoft.Storage/storageAccounts")
    policy = one(resources, "Microsoft.Storage/storageAccounts/managementPolicies")
    assert policy.id.startswith(account.id) and policy.name.endswith("/default")
    parsed = Settings.from_env(app_settings(resources), host_json=host_json_file(Path(ROOT / "build")))
    wanted = {
        (
            rule.name,
            f"{rule.container}/{rule.prefix}",
            rule.tag,
            rule.days,
        )
        for rule in parsed.retention_rules()
    }
    got = set()
    for rule in policy.body["properties"]["policy"]["rules"]:
        assert rule["enabled"] is True and rule["type"] == "Lifecycle"
        filters, actions = rule["definition"]["filters"], rule["definition"]["actions"]
        assert filters["blobTypes"] == ["blockBlob"] and set(actions) == {"baseBlob"}
        [prefix] = filters["prefixMatch"]
        tags = [(t["name"], t["value"]) for t in filters.get("blobIndexMatch", []) if t["op"] == "=="]
        got.add(
            (
                rule["name"],
                prefix,
                tags[0] if tags else None,
                actions["baseBlob"]["delete"]["daysAfterModificationGreaterThan"],
            )
        )
    assert got == wanted
    assert parsed.retention.ledger * 86400 > parsed.job_ttl_s


# ------------------------------------------------------------------ alerts (issue 36)

ALERTS = {"poison-backlog", "oldest-message", "failure-rate"}


def _alerts(resources: list[Deployed]) -> dict[str, Deployed]:
    rules = [r for r in resources if r.type == "Microsoft.Insights/scheduledQueryRules"]
    return {r.name.rsplit("-appi-", 1)[1].split("-", 1)[1]: r for r in rules}


@pytest.mark.parametrize("case", sorted(PARAM_SETS))
def test_alert_rules_query_the_apps_metrics_in_its_application_insights(
    template: dict[str, Any], case: str
) -> None:
    from shared.observability import job_metrics

    resources, _ = deployment(template, case)
    insights = one(resources, "Microsoft.Insights/components")
    rules = _alerts(resources)
    assert set(rules) == ALERTS
    for rule in rules.values():
        props = rule.body["properties"]
        assert props["scopes"] == [insights.id] and insights.id in rule.depends_on
        assert props["enabled"] is True and props["autoMitigate"] is True
        assert props["actions"]["actionGroups"] == []  # no action group given: the portal only
        assert props["evaluationFrequency"] == "PT15M"
        [criterion] = props["criteria"]["allOf"]
        assert (criterion["timeAggregation"], criterion["operator"], criterion["threshold"]) == (
            "Count",
            "GreaterThan",
            0,
        )
        assert "Runbook: docs/operations.md" in props["description"]
    poison_query = rules["poison-backlog"].body["properties"]["criteria"]["allOf"][0]["query"]
    assert job_metrics.QUEUE_DEPTH_METRIC in poison_query and '"poison"' in poison_query
    assert rules["poison-backlog"].body["properties"]["windowSize"] == "PT30M"
    age_query = rules["oldest-message"].body["properties"]["criteria"]["allOf"][0]["query"]
    assert job_metrics.QUEUE_AGE_METRIC in age_query and age_query.endswith("> 15 * 60")
    failure_query = rules["failure-rate"].body["properties"]["criteria"]["allOf"][0]["query"]
    assert job_metrics.DELIVERIES_METRIC in failure_query and failure_query.endswith("> 10")
    assert '"job.outcome"' in failure_query


def test_alert_thresholds_and_action_group_are_parameters(template: dict[str, Any]) -> None:
    group = f"{RG_ID}/providers/Microsoft.Insights/actionGroups/oncall"
    params = {
        "namePrefix": "jobs",
        "actionGroupId": group,
        "oldestMessageAlertMinutes": 45,
        "failureRateAlertPercent": 25,
    }
    resources, _ = expand(template, params)
    rules = _alerts(resources)
    actions = {n: r.body["properties"]["actions"]["actionGroups"] for n, r in rules.items()}
    assert actions == {name: [group] for name in ALERTS}
    queries = {n: r.body["properties"]["criteria"]["allOf"][0]["query"] for n, r in rules.items()}
    assert queries["oldest-message"].endswith("> 45 * 60") and queries["failure-rate"].endswith("> 25")
