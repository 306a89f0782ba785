""".funcignore is safe under both parsers that read it.

- `python -m deploy.package` (what deploy/deploy.sh uploads) reads it as gitignore (pathspec).
- `func azure functionapp publish` reads it with Core Tools' own parser, mimicked by
  tests/deploy/coretools_ignore.py: prefix matching, `*` = one or more characters, and a `!` line
  wins wherever it stands.

For a sample tree full of junk and secrets, and for this repository's own working tree (with its
.venv, node_modules, caches and __pycache__ folders), neither parser ships anything but the app, and
both ship all of it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from coretools_ignore import CoreToolsIgnore, accepted, published_files  # noqa: E402

from deploy.package import PackageError, build, collect, unexpected_files  # noqa: E402

FUNCIGNORE = (ROOT / ".funcignore").read_text(encoding="utf-8")

NEEDED = [
    "function_app.py",
    "host.json",
    "requirements.txt",
    "shared/__init__.py",
    "shared/api.py",
    "shared/envelope.py",  # "env" in the name, not a .env file
    "shared/settings.py",
    "shared/keys.py",  # not a .key file
    "shared/logic.py",  # not a .log file
    "shared/credentials.py",  # code, whatever its name
    "shared/client_secrets.py",
    "shared/sub/mod.py",
    "shared/sub/deeper/leaf.py",
    "shared/tmpl/__init__.py",
]

MUST_NOT_SHIP = [
    # secrets
    "shared/x.pem",
    "shared/.env",
    "shared/a.env",
    "shared/.env.local",
    "shared/sub/deeper/b.pem",
    "shared/server.key",
    "shared/cert.crt",
    "shared/cert.cer",
    "shared/store.pfx",
    "shared/store.p12",
    "shared/app.publishsettings",
    "shared/id_rsa",
    "shared/id_rsa.pub",
    "shared/.azure/config",
    "shared/.netrc",
    "shared/local.settings.json",
    ".env",
    "prod.env",
    "root.pem",
    "id_ed25519",
    ".databrickscfg",
    "local.settings.json",
    "local.settings.sample.json",
    # junk and backups
    "shared/__pycache__/m.cpython-311.pyc",
    "shared/sub/__pycache__/mod.cpython-311.pyc",
    "shared/stray.pyc",
    "shared/.pytest_cache/v/cache/nodeids",
    "shared/.mypy_cache/3.11/x.json",
    "shared/debug.log",
    "shared/.DS_Store",
    "shared/tests/test_x.py",
    "shared/api.py.bak",
    "shared/api.py.orig",
    "shared/api.py~",
    "requirements.txt.bak",
    "host.json.bak",
    "function_app.py.orig",
    "__pycache__/function_app.cpython-311.pyc",
    # the rest of the repository
    ".venv/bin/python",
    ".venv/lib/python3.11/site-packages/x/__init__.py",
    "node_modules/azurite/package.json",
    "tests/test_a.py",
    "tests/deploy/test_package.py",
    "devhost/host.py",
    "devstack/demo.py",
    "spark_jobs/aggregate_job.py",
    "bench/run.py",
    "infra/main.bicep",
    "deploy/deploy.sh",
    "docs/deploy.md",
    "dist/app.zip",
    ".ci/run",
    ".github/workflows/ci.yml",
    ".vscode/settings.json",
    ".idea/workspace.xml",
    ".git/config",
    ".hypothesis/examples/x",
    ".mypy_cache/3.11/x.json",
    ".pytest_cache/README.md",
    ".ruff_cache/x",
    ".python_packages/lib/site-packages/x.py",
    "__azurite_db_blob__.json",
    "__blobstorage__/x",
    "__queuestorage__/x",
    ".azurite/x",
    ".devstack/x",
    "Makefile",
    "README.md",
    "package.json",
    "package-lock.json",
    "pyproject.toml",
    "requirements-dev.txt",
    ".gitignore",
    ".funcignore",
]


def _tree(root: Path, files: list[str]) -> None:
    for rel in files:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}\n" if rel.endswith(".json") else "\n", encoding="utf-8")


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    _tree(tmp_path, NEEDED + MUST_NOT_SHIP)
    (tmp_path / ".funcignore").write_text(FUNCIGNORE, encoding="utf-8")
    return tmp_path


# ------------------------------------------------------------------ the Core Tools parser itself


def test_core_tools_parser_port() -> None:
    ignore = CoreToolsIgnore("# comment\n\n*.pem\n/tests\n**/__pycache__/\nnode_modules/\n")
    assert ignore.denies("x.pem") and ignore.denies("x.pem.txt")  # prefix match
    assert ignore.accepts("shared/x.pem")  # "*" does not cross "/": root only
    assert ignore.accepts(".pem")  # "*" is one or more characters
    assert ignore.denies("tests/a.py") and ignore.denies("tests_b.py")  # prefix again
    assert ignore.denies("shared/__pycache__/m.pyc") and ignore.accepts("__pycache__/m.pyc")
    assert ignore.denies("node_modules/a/b.js")
    assert ignore.accepts("X.PEM")  # case-sensitive


def test_core_tools_lets_any_negation_win() -> None:
    # Why .funcignore has no "!" line: an allow-list shape that is right for gitignore ...
    allow_list = "/*\n!/function_app.py\n!/requirements.txt\n!/shared/\n*.pem\n.env\n__pycache__/\n"
    ignore = CoreToolsIgnore(allow_list)
    # ... ships whatever a negation is a prefix of, in any order:
    assert ignore.accepts("shared/x.pem")
    assert ignore.accepts("shared/.env")
    assert ignore.accepts("shared/__pycache__/m.cpython-311.pyc")
    assert ignore.accepts("requirements.txt.bak")
    assert ignore.accepts("function_app.py.orig")
    assert CoreToolsIgnore("!/shared/\n/*\n").accepts("shared/x.pem"), "order does not matter"


# ------------------------------------------------------------------ .funcignore under both parsers


def test_funcignore_has_no_negation() -> None:
    lines = [line.strip() for line in FUNCIGNORE.splitlines()]
    assert not [line for line in lines if line.startswith("!")]
    assert not CoreToolsIgnore(FUNCIGNORE).has_negations


def test_core_tools_ships_exactly_the_app(sample: Path) -> None:
    shipped = set(published_files(sample, CoreToolsIgnore(FUNCIGNORE)))
    assert not shipped & set(MUST_NOT_SHIP), sorted(shipped & set(MUST_NOT_SHIP))
    assert shipped == set(NEEDED), sorted(shipped ^ set(NEEDED))
    assert accepted(CoreToolsIgnore(FUNCIGNORE), NEEDED + MUST_NOT_SHIP) == set(NEEDED)


def test_deploy_package_ships_exactly_the_app(sample: Path) -> None:
    shipped = set(collect(sample))
    assert not shipped & set(MUST_NOT_SHIP), sorted(shipped & set(MUST_NOT_SHIP))
    assert shipped == set(NEEDED), sorted(shipped ^ set(NEEDED))
    package = build(sample / "out.zip", sample)
    assert set(package.files) == set(NEEDED)


def test_the_repository_ships_the_same_under_both_parsers() -> None:
    """This working tree (venv, node_modules, caches, __pycache__ included): only the app ships."""
    core = published_files(ROOT, CoreToolsIgnore(FUNCIGNORE))
    ours = collect(ROOT)
    assert core == ours, sorted(set(core) ^ set(ours))
    assert unexpected_files(ours) == [], "only function_app.py, host.json, requirements.txt, shared/"
    sources = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "shared").rglob("*.py")
        if "__pycache__" not in p.parts and "tests" not in p.parts
    }
    assert {"function_app.py", "host.json", "requirements.txt"} | sources <= set(ours)
    assert not [f for f in ours if f.endswith((".pyc", ".pyo")) or "__pycache__" in f]


def test_a_new_top_level_file_fails_the_build(sample: Path) -> None:
    # .funcignore is a deny-list: what it does not name ships, so deploy.package refuses it.
    (sample / "notes.txt").write_text("todo\n", encoding="utf-8")
    assert "notes.txt" in published_files(sample, CoreToolsIgnore(FUNCIGNORE))
    with pytest.raises(PackageError, match=r"outside function_app\.py.*\n  notes\.txt"):
        build(sample / "out.zip", sample)


@pytest.mark.parametrize("name", ["client-secret.json", "storage-credentials.yaml", "secrets.txt"])
def test_a_data_file_named_like_a_secret_fails_the_build(sample: Path, name: str) -> None:
    (sample / "shared" / name).write_text("{}\n", encoding="utf-8")
    with pytest.raises(PackageError, match="secret-looking file name"):
        build(sample / "out.zip", sample)
