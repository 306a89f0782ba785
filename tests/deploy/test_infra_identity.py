"""The template's role assignments: each identity reaches what it uses, scoped to each resource,
never the whole account; telemetry is Entra-only (see test_infra.py for how the template is evaluated)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from armeval import (
    RG_ID,
    Deployed,
    fake_guid,
)

from shared.config.settings import Settings
from shared.indexes.keys import table_prefix
from tests.deploy.infra_support import (
    APP_CONTAINERS,
    HOST_CONTAINERS,
    PARAM_SETS,
    ROLE,
    TAGGED_CONTAINERS,
    app_settings,
    deployment,
    host_json_file,
    one,
    watched_queues,
)


def _assignments(resources: list[Deployed]) -> list[tuple[str, str, str, str]]:
    out = []
    for r in resources:
        if r.type == "Microsoft.Authorization/roleAssignments":
            props = r.body["properties"]
            role = props["roleDefinitionId"].rsplit("/", 1)[1]
            scope = r.id.split("/providers/Microsoft.Authorization/")[0]
            out.append((role, props["principalId"], scope, props["principalType"]))
            assert re.fullmatch(r"[0-9a-f-]{36}", r.name), "role assignment names must be guid()"
            assert props["roleDefinitionId"].startswith(
                f"{RG_ID.split('/resourceGroups/')[0]}/providers/Microsoft.Authorization/roleDefinitions/"
            )
    return out


def _container_id(account: Deployed, name: str) -> str:
    return f"{account.id}/blobServices/default/containers/{name}"


def _queue_id(account: Deployed, name: str) -> str:
    return f"{account.id}/queueServices/default/queues/{name}"


@pytest.mark.parametrize("case", sorted(PARAM_SETS))
def test_role_assignments(template: dict[str, Any], case: str) -> None:
    resources, _ = deployment(template, case)
    identity = one(resources, "Microsoft.ManagedIdentity/userAssignedIdentities")
    account = one(resources, "Microsoft.Storage/storageAccounts")
    insights = one(resources, "Microsoft.Insights/components")
    principal = fake_guid("principal", identity.id)
    params = PARAM_SETS[case]
    queue = params.get("jobsQueueName", "jobs")
    app = "ServicePrincipal"
    expected = {
        # account-wide: tables only (the host's monthly diagnostic-events tables, the console's
        # entries table and its jobs index's per-day tables, created by the app)
        (ROLE["table_contributor"], principal, account.id, app),
        (ROLE["metrics_publisher"], principal, insights.id, app),
        # per queue, per container
        (ROLE["queue_contributor"], principal, _queue_id(account, queue), app),
        (ROLE["queue_contributor"], principal, _queue_id(account, f"{queue}-poison"), app),
        (ROLE["queue_contributor"], principal, _queue_id(account, f"{queue}-parked"), app),
        (ROLE["queue_contributor"], principal, _queue_id(account, f"{queue}-ops"), app),
        (ROLE["blob_reader"], principal, _container_id(account, "inputs"), app),
    }
    expected |= {  # each more job queue (JOBS_QUEUES), its poison and parked queues
        (ROLE["queue_contributor"], principal, _queue_id(account, f"{q}{end}"), app)
        for q in params.get("extraJobsQueueNames", [])
        for end in ("", "-poison", "-parked")
    }
    expected |= {
        (ROLE["blob_contributor"], principal, _container_id(account, c), app)
        for c in APP_CONTAINERS - TAGGED_CONTAINERS
    }
    # Owner where the app sets and queries blob index tags (issue 21: the ledger)
    expected |= {
        (ROLE["blob_owner"], principal, _container_id(account, c), app)
        for c in HOST_CONTAINERS | TAGGED_CONTAINERS
    }
    if params.get("grantStorageAccountContributor"):
        expected.add((ROLE["account_contributor"], principal, account.id, app))
    if params.get("sparkPrincipalId"):
        spark = params["sparkPrincipalId"]
        expected |= {
            (ROLE["blob_reader"], spark, _container_id(account, "spark-jobs"), app),
            (ROLE["blob_reader"], spark, _container_id(account, "inputs"), app),
            (ROLE["blob_contributor"], spark, _container_id(account, "results"), app),
        }
    if params.get("deployerPrincipalId"):
        deployer = params["deployerPrincipalId"]
        expected.add((ROLE["blob_contributor"], deployer, _container_id(account, "spark-jobs"), "User"))
    actual = _assignments(resources)
    assert len(actual) == len(set(actual))
    assert set(actual) == expected


@pytest.mark.parametrize("case", sorted(PARAM_SETS))
def test_no_blob_or_queue_role_on_the_whole_account(template: dict[str, Any], case: str) -> None:
    resources, _ = deployment(template, case)
    account = one(resources, "Microsoft.Storage/storageAccounts")
    for role, principal, scope, _ in _assignments(resources):
        if scope == account.id:
            assert role in (ROLE["table_contributor"], ROLE["account_contributor"]), (role, principal)
        elif scope.startswith(account.id):
            assert "/containers/" in scope or "/queues/" in scope, scope


@pytest.mark.parametrize("case", sorted(PARAM_SETS))
def test_the_app_identity_reaches_what_the_app_and_the_host_use(
    template: dict[str, Any], case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Derived from the settings the app reads, not from the template's own lists."""
    resources, _ = deployment(template, case)
    account = one(resources, "Microsoft.Storage/storageAccounts")
    identity = one(resources, "Microsoft.ManagedIdentity/userAssignedIdentities")
    principal = fake_guid("principal", identity.id)
    parsed = Settings.from_env(app_settings(resources), host_json=host_json_file(tmp_path))
    deployment_container = one(resources, "Microsoft.Web/sites").body["properties"]["functionAppConfig"]
    deployment_container = deployment_container["deployment"]["storage"]["value"].rsplit("/", 1)[1]
    write = {parsed.results_container, parsed.payloads_container, parsed.poison_archive_container}
    tagged = {parsed.ledger_container}  # the app sets and finds blob index tags there (issue 21)
    read = set(parsed.input_containers or ())
    host = {"azure-webjobs-hosts", "azure-webjobs-secrets", deployment_container}
    created = {r.name.rsplit("/", 1)[1] for r in resources if r.type.endswith("/blobServices/containers")}
    assert write | tagged | read | host <= created, (
        "every container the identity needs is created by the template"
    )
    mine = {(role, scope) for role, who, scope, _ in _assignments(resources) if who == principal}
    for name in write:
        assert (ROLE["blob_contributor"], _container_id(account, name)) in mine, name
    for name in read:
        assert (ROLE["blob_reader"], _container_id(account, name)) in mine, name
        assert (ROLE["blob_contributor"], _container_id(account, name)) not in mine, "inputs are read-only"
    for name in host | tagged:
        assert (ROLE["blob_owner"], _container_id(account, name)) in mine, name
    queues = {r.name.rsplit("/", 1)[1] for r in resources if r.type.endswith("/queueServices/queues")}
    listened = set(watched_queues(monkeypatch, parsed.jobs_queue))
    assert f"{parsed.jobs_queue}-ops" in listened, "run_op_step listens to <JOBS_QUEUE>-ops"
    for name in listened:
        assert name in queues, f"the host never creates a queue it listens to: {name}"
    for name in listened | {parsed.jobs_queue, parsed.poison_queue, parsed.parked_queue}:
        assert (ROLE["queue_contributor"], _queue_id(account, name)) in mine, name
    # the console's indexes: the entries table is declared; the jobs index creates a table per UTC
    # day, which needs Storage Table Data Contributor on the account (no table scope can create one)
    tables = {r.name.rsplit("/", 1)[1] for r in resources if r.type.endswith("/tableServices/tables")}
    assert table_prefix(parsed.poison_archive_container) + "entries" in tables
    assert (ROLE["table_contributor"], account.id) in mine
    assert parsed.storage.table_endpoint() == f"https://{account.name}.table.core.windows.net"
    blob_scopes = {scope for role, scope in mine if "/containers/" in scope}
    assert blob_scopes == {_container_id(account, c) for c in write | tagged | read | host}, "nothing else"


def test_role_assignment_names_are_stable_across_runs(template: dict[str, Any]) -> None:
    """Re-deploying must update the same assignments, not fail with RoleAssignmentExists."""
    first = sorted(r.id for r in deployment(template, "livy")[0])
    second = sorted(r.id for r in deployment(template, "livy")[0])
    assert first == second


@pytest.mark.parametrize("case", sorted(PARAM_SETS))
def test_telemetry_is_entra_only(template: dict[str, Any], case: str) -> None:
    resources, _ = deployment(template, case)
    insights = one(resources, "Microsoft.Insights/components")
    workspace = one(resources, "Microsoft.OperationalInsights/workspaces")
    assert insights.body["properties"]["DisableLocalAuth"] is True
    assert insights.body["properties"]["WorkspaceResourceId"] == workspace.id
    assert workspace.body["properties"]["workspaceCapping"]["dailyQuotaGb"] == 1
