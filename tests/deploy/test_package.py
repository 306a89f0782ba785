"""The deployment zip: exact content, nothing secret, and it imports and indexes in a fresh venv.

The integration test does what the Functions Python worker does after a remote build: a clean
Python 3.11 environment with only requirements.txt installed, the zip's content as the app root,
`import function_app`, then the function index (`app.get_functions()`).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from deploy.package import PackageError, build, collect, is_ignored, parse_ignore  # noqa: E402

EXPECTED_TOP_LEVEL = {"function_app.py", "host.json", "requirements.txt", "shared", "native"}
FORBIDDEN_PARTS = {
    "tests",
    "devhost",
    "devstack",
    "spark_jobs",
    "bench",
    "infra",
    "deploy",
    "docs",
    "dist",
    ".venv",
    "node_modules",
    "__pycache__",
    ".git",
    ".ci",
}
FORBIDDEN_NAMES = {
    "local.settings.json",
    "Makefile",
    "package.json",
    "package-lock.json",
    "requirements-dev.txt",
    ".funcignore",
    ".gitignore",
    "pyproject.toml",
}
SECRET_SUFFIXES = (".pem", ".key", ".pfx", ".p12", ".env", ".publishsettings")


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    out = tmp_path_factory.mktemp("pkg") / "app.zip"
    result = subprocess.run(
        [sys.executable, "-m", "deploy.package", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    with zipfile.ZipFile(out) as zf:
        assert zf.testzip() is None
        names = zf.namelist()
    return out, names


def test_zip_has_exactly_the_app(package: tuple[Path, list[str]]) -> None:
    _, names = package
    assert {n.split("/", 1)[0] for n in names} == EXPECTED_TOP_LEVEL
    assert {"function_app.py", "host.json", "requirements.txt", "shared/__init__.py"} <= set(names)
    # all of shared/'s Python source ships (nothing the app imports is filtered out)
    shared_sources = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "shared").rglob("*.py")
        if "__pycache__" not in p.parts and "tests" not in p.parts
    }
    assert shared_sources <= set(names), shared_sources - set(names)
    # the C scanner's source ships whole (the remote build compiles it), its build output does not
    native_sources = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "native").rglob("*")
        if p.is_file() and p.suffix in {".c", ".h", ".py", ".toml"} and "build" not in p.parts
    }
    assert {"native/setup.py", "native/pyproject.toml", "native/src/module.c"} <= native_sources
    assert native_sources <= set(names), native_sources - set(names)
    assert not [n for n in names if n.endswith(".so") or n.startswith("native/build/")]


def test_zip_has_nothing_forbidden(package: tuple[Path, list[str]]) -> None:
    _, names = package
    for name in names:
        parts = name.split("/")
        assert not FORBIDDEN_PARTS & set(parts), name
        assert parts[-1] not in FORBIDDEN_NAMES or name == "native/pyproject.toml", (
            name
        )  # the scanner's build
        assert not parts[-1].endswith((".pyc", ".pyo")), name
        assert not parts[-1].lower().endswith(SECRET_SUFFIXES), name
        assert not parts[-1].startswith(".env"), name
        assert not parts[-1].startswith("local.settings"), name


def test_zip_matches_collect_and_is_reproducible(package: tuple[Path, list[str]], tmp_path: Path) -> None:
    path, names = package
    assert names == collect(ROOT)
    again = build(tmp_path / "again.zip", ROOT)
    assert again.path.read_bytes() == path.read_bytes(), "same tree must give the same zip"
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            assert info.date_time == (1980, 1, 1, 0, 0, 0)
            assert (ROOT / info.filename).read_bytes() == zf.read(info)


# ------------------------------------------------------------------ packaging rules on a synthetic tree


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")


def test_funcignore_rules_on_a_synthetic_tree(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            ".funcignore": (ROOT / ".funcignore").read_text(encoding="utf-8"),
            "function_app.py": "import azure.functions\n",
            "host.json": "{}",
            "requirements.txt": "azure-functions\n",
            "shared/__init__.py": "",
            "shared/credentials.py": "# code, not a secret\n",
            "shared/sub/mod.py": "",
            "shared/sub/__pycache__/mod.cpython-311.pyc": "x",
            "shared/data.json": "{}",
            "shared/tests/test_x.py": "",
            "shared/client-secret.json": "{}",
            "shared/cert.pem": "x",
            "shared/.env": "A=1",
            "local.settings.json": "{}",
            "local.settings.sample.json": "{}",
            "README.md": "",
            "pyproject.toml": "",
            "Makefile": "",
            "requirements-dev.txt": "",
            "tests/test_a.py": "",
            "devhost/host.py": "",
            "spark_jobs/aggregate_job.py": "",
            "node_modules/x/index.js": "",
            ".venv/bin/python": "",
            "dist/app.zip": "",
            "new_top_level.py": "",
        },
    )
    # .funcignore is a deny-list (Core Tools cannot read an allow-list safely, see
    # tests/deploy/test_funcignore.py): a new top-level file and a data file named like a secret
    # are collected, and the build refuses both instead of shipping them.
    assert collect(tmp_path) == [
        "function_app.py",
        "host.json",
        "new_top_level.py",
        "requirements.txt",
        "shared/__init__.py",
        "shared/client-secret.json",
        "shared/credentials.py",
        "shared/data.json",
        "shared/sub/mod.py",
    ]
    with pytest.raises(PackageError, match=r"outside function_app\.py.*\n  new_top_level\.py"):
        build(tmp_path / "out.zip", tmp_path)
    (tmp_path / "new_top_level.py").unlink()
    with pytest.raises(PackageError, match=r"shared/client-secret\.json: secret-looking file name"):
        build(tmp_path / "out.zip", tmp_path)
    (tmp_path / "shared" / "client-secret.json").unlink()
    assert build(tmp_path / "out.zip", tmp_path).files == (
        "function_app.py",
        "host.json",
        "requirements.txt",
        "shared/__init__.py",
        "shared/credentials.py",
        "shared/data.json",
        "shared/sub/mod.py",
    )


def test_ignore_matcher_follows_gitignore_semantics() -> None:
    """parse_ignore / is_ignored are pathspec's gitignore rules (last match wins, dir-only rules)."""
    rules = parse_ignore(["/*", "!/keep/", "*.log", "!important.log", "build/", "a/**/z", "doc/*.txt"])
    assert is_ignored(rules, "top.py", is_dir=False)
    assert not is_ignored(rules, "keep", is_dir=True)
    assert not is_ignored(rules, "keep/x.py", is_dir=False)
    assert is_ignored(rules, "keep/deep/run.log", is_dir=False)
    assert not is_ignored(rules, "keep/important.log", is_dir=False)
    assert is_ignored(rules, "keep/build", is_dir=True)
    assert not is_ignored(rules, "keep/build", is_dir=False)  # dir-only rule
    assert is_ignored(rules, "keep/a/z", is_dir=False) is False  # anchored to root, keep/a is not a/
    rules2 = parse_ignore(["a/**/z", "doc/*.txt", "**/cache"])
    assert is_ignored(rules2, "a/z", is_dir=False)
    assert is_ignored(rules2, "a/b/c/z", is_dir=False)
    assert is_ignored(rules2, "doc/x.txt", is_dir=False)
    assert not is_ignored(rules2, "doc/sub/x.txt", is_dir=False)
    assert is_ignored(rules2, "x/y/cache", is_dir=True)


def test_build_refuses_secrets_and_missing_files(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            ".funcignore": "/*\n!/function_app.py\n!/host.json\n!/requirements.txt\n!/shared/\n",
            "function_app.py": "",
            "host.json": "{}",
            "requirements.txt": "",
            "shared/ok.py": (
                "DEV = 'AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/"
                "K1SZFPTOtr/KBHBeksoGMGw=='\n"
            ),
        },
    )
    assert build(tmp_path / "out" / "ok.zip", tmp_path).files  # the emulator's public key is fine
    (tmp_path / "shared" / "leak.py").write_text("CONN = 'AccountKey=" + "A1b2" * 22 + "=='\n")
    with pytest.raises(PackageError, match="storage account key"):
        build(tmp_path / "out" / "bad.zip", tmp_path)
    (tmp_path / "shared" / "leak.py").unlink()
    (tmp_path / "shared" / "server.key").write_text("x")
    with pytest.raises(PackageError, match="secret-looking file name"):
        build(tmp_path / "out" / "bad.zip", tmp_path)
    (tmp_path / "shared" / "server.key").unlink()
    (tmp_path / "host.json").unlink()
    with pytest.raises(PackageError, match=r"host\.json"):
        build(tmp_path / "out" / "bad.zip", tmp_path)


def test_build_refuses_a_tree_without_funcignore(tmp_path: Path) -> None:
    _tree(tmp_path, {"function_app.py": "", "host.json": "{}", "requirements.txt": ""})
    with pytest.raises(PackageError, match=r"\.funcignore"):
        build(tmp_path / "app.zip", tmp_path)


# ------------------------------------------------------------------ imports and indexes in a fresh venv


def declared_functions(source: str) -> tuple[set[str], set[str]]:
    """(all function names, HTTP function names) declared with decorators at function_app.py's top
    level. Functions decorated inside a function (one more declared queue's trigger, named from
    JOBS_QUEUES) exist only when that setting declares them, so they are not counted here."""
    names: set[str] = set()
    http: set[str] = set()
    for node in ast.parse(source).body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        name, is_function, is_http = node.name, False, False
        for dec in node.decorator_list:
            call = dec if isinstance(dec, ast.Call) else None
            target = call.func if call is not None else dec
            attr = target.attr if isinstance(target, ast.Attribute) else ""
            if attr in {"route", "http_trigger"}:
                is_function = is_http = True
            elif attr.endswith("_trigger") or attr in {"schedule", "timer_trigger"}:
                is_function = True
            elif attr == "function_name" and call is not None:
                arg = (
                    call.args[0]
                    if call.args
                    else next((k.value for k in call.keywords if k.arg == "name"), None)
                )
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    name = arg.value
        if is_function:
            names.add(name)
            if is_http:
                http.add(name)
    return names, http


INDEX_SNIPPET = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import function_app
    from shared import aggregation
    assert aggregation.NATIVE, "the C scanner was not built by the requirements install"
    functions = function_app.app.get_functions()
    out = []
    for fn in functions:
        trigger = fn.get_trigger()
        out.append({"name": fn.get_function_name(), "trigger": trigger.get_binding_name(),
                    "http": fn.is_http_function()})
    print("INDEX=" + json.dumps(out))
    """
)


@pytest.mark.integration
def test_unpacked_zip_imports_and_indexes_in_fresh_venv(
    package: tuple[Path, list[str]], tmp_path: Path
) -> None:
    path, _ = package
    app_dir = tmp_path / "wwwroot"
    with zipfile.ZipFile(path) as zf:
        zf.extractall(app_dir)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "-r", "requirements.txt"],
        cwd=app_dir,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "AzureWebJobsStorage": "UseDevelopmentStorage=true",
        "JOBS_QUEUE": "jobs",
    }
    run = subprocess.run(
        [str(python), "-I", "-c", INDEX_SNIPPET, str(app_dir)],
        cwd=tmp_path,  # not the repository: only the unpacked zip is importable
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    line = next(x for x in run.stdout.splitlines() if x.startswith("INDEX="))
    index = json.loads(line[len("INDEX=") :])
    indexed = {f["name"] for f in index}
    http = {f["name"] for f in index if f["http"]}
    declared, declared_http = declared_functions((app_dir / "function_app.py").read_text(encoding="utf-8"))
    assert {"process_job", "handle_poison"} <= indexed
    assert http, "at least one HTTP function"
    assert declared <= indexed, declared - indexed
    assert declared_http <= http
    triggers = {f["name"]: f["trigger"] for f in index}
    assert triggers["process_job"] == "queueTrigger"
    assert triggers["handle_poison"] == "queueTrigger"


def test_declared_functions_parser() -> None:
    source = textwrap.dedent(
        """
        @app.function_name("process_job")
        @app.queue_trigger(arg_name="msg", queue_name="%JOBS_QUEUE%", connection="AzureWebJobsStorage")
        def process_job(msg): ...

        @app.route(route="jobs", methods=["POST"])
        def submit_job(req): ...

        @app.function_name(name="tick")
        @app.schedule(schedule="0 * * * * *", arg_name="t")
        def timer(t): ...

        def helper(): ...

        def _wire_queue(name):
            @app.function_name(f"process_job_{name}")
            @app.queue_trigger(arg_name="msg", queue_name=name, connection="AzureWebJobsStorage")
            def process(msg): ...
        """
    )
    assert declared_functions(source) == ({"process_job", "submit_job", "tick"}, {"submit_job"})
