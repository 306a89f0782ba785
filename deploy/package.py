"""Build the zip that is deployed to the function app: `python -m deploy.package --out dist/app.zip`.

The content is the repository minus what `.funcignore` excludes (gitignore syntax, read with the
pathspec library; the same file `func azure functionapp publish` honours), i.e. function_app.py,
host.json, requirements.txt, shared/** and native/** (the C scanner's source). Dependencies are not vendored: the deployment asks for a
remote build, which installs requirements.txt on the platform's Linux image (see deploy/deploy.sh
and docs/deploy.md).

The build fails when a required file is missing, when a file outside that layout would be included
(.funcignore is a deny-list, see its header: a new top-level file must be listed there), or when an
included file looks like it holds a secret (a private key, a storage account key, a SAS signature,
a key or certificate file, a data file named like a secret). It is reproducible: entries are sorted
and carry a fixed timestamp, so the same tree gives byte-identical zips (same SHA-256).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

try:
    import pathspec
except ImportError:  # pragma: no cover - exercised by hand
    sys.exit("package: error: the pathspec package is needed: pip install -r requirements-dev.txt")

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = ("function_app.py", "host.json", "requirements.txt")
APP_FOLDERS = ("shared", "native")
"""The folders that ship: with REQUIRED, the whole allowed top level of the zip (native/ is the C
scanner's source, which the remote build compiles: requirements.txt names it)."""
FIXED_TIME = (1980, 1, 1, 0, 0, 0)

# The storage emulator's published development key (devstoreaccount1) is not a secret.
_EMULATOR_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_SECRET_CONTENT = (
    ("private key", re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----")),
    ("storage account key", re.compile(rb"AccountKey=(?P<value>[A-Za-z0-9+/]{40,}={0,2})")),
    ("SAS signature", re.compile(rb"[?&;]sig=(?P<value>[A-Za-z0-9%+/]{20,}={0,2})")),
    ("Databricks token", re.compile(rb"\bdapi[0-9a-f]{32}\b")),
)
_SECRET_NAMES = re.compile(
    r"(^|/)(\.env(\..*)?|local\.settings.*\.json|id_(rsa|ed25519|ecdsa)\S*|\.databrickscfg|\.netrc|\.pypirc)$"
    r"|\.(pem|key|pfx|p12|crt|cer|jks|keystore|kdbx|publishsettings|env)$"
    # a data file named like a secret (code is judged by its content, e.g. shared/credentials.py)
    r"|(^|/)[^/]*(secret|credential)[^/]*(?<!\.py)$",
    re.IGNORECASE,
)


class PackageError(Exception):
    """The package cannot be built (missing file, secret found)."""


# --------------------------------------------------------------------------- .funcignore


def parse_ignore(lines: Iterable[str]) -> pathspec.GitIgnoreSpec:
    """The rules of a .funcignore / .gitignore file (gitignore semantics, by pathspec)."""
    return pathspec.GitIgnoreSpec.from_lines(list(lines))


def is_ignored(rules: pathspec.GitIgnoreSpec, path: str, is_dir: bool) -> bool:
    """Whether `path` (relative, forward slashes) itself is excluded; the last matching rule wins."""
    return bool(rules.match_file(path + "/" if is_dir else path))


def collect(root: Path = ROOT, ignore_file: str = ".funcignore") -> list[str]:
    """Relative paths of the files that go into the package, sorted.

    As in git, a file inside an excluded directory stays excluded whatever later rules say.
    """
    ignore_path = root / ignore_file
    if not ignore_path.is_file():
        raise PackageError(f"{ignore_file} not found in {root}: refusing to package the whole tree")
    rules = parse_ignore(ignore_path.read_text(encoding="utf-8").splitlines())
    files: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        kept = []
        for d in sorted(dirnames):
            full = Path(dirpath, d)
            if full.is_symlink() or is_ignored(rules, rel_dir + d, is_dir=True):
                continue
            kept.append(d)
        dirnames[:] = kept
        for f in sorted(filenames):
            full = Path(dirpath, f)
            if full.is_symlink() or not full.is_file():
                continue
            if not is_ignored(rules, rel_dir + f, is_dir=False):
                files.append(rel_dir + f)
    return sorted(files)


# --------------------------------------------------------------------------- checks and build


def unexpected_files(files: Iterable[str]) -> list[str]:
    """Included files outside the app's layout (REQUIRED at the top level, APP_FOLDERS below it)."""
    return [
        rel
        for rel in files
        if rel not in REQUIRED and not any(rel.startswith(folder + "/") for folder in APP_FOLDERS)
    ]


def secret_findings(root: Path, files: Iterable[str]) -> list[str]:
    """'path: reason' for each included file that looks like it holds a secret."""
    findings = []
    for rel in files:
        if _SECRET_NAMES.search(rel):
            findings.append(f"{rel}: secret-looking file name")
            continue
        data = (root / rel).read_bytes()
        for label, pattern in _SECRET_CONTENT:
            for match in pattern.finditer(data):
                value = match.groupdict().get("value")
                if value is not None and value.decode() == _EMULATOR_KEY:
                    continue
                findings.append(f"{rel}: contains a {label}")
                break
    return findings


@dataclass(frozen=True)
class Package:
    path: Path
    files: tuple[str, ...]
    sha256: str
    size: int


def build(out: Path, root: Path = ROOT) -> Package:
    """Write the deployment zip to `out` and return what is in it."""
    files = collect(root)
    missing = [name for name in REQUIRED if name not in files]
    if missing:
        raise PackageError(f"required file(s) missing from the package: {', '.join(missing)}")
    unexpected = unexpected_files(files)
    if unexpected:
        raise PackageError(
            "refusing to package files outside function_app.py, host.json, requirements.txt, "
            "shared/ and native/ (list them in .funcignore, which has no allow-list):\n  "
            + "\n  ".join(unexpected)
        )
    findings = secret_findings(root, files)
    if findings:
        raise PackageError("refusing to package secret-looking content:\n  " + "\n  ".join(findings))
    out = out if out.is_absolute() else Path.cwd() / out
    if (
        out.resolve().is_relative_to(root.resolve())
        and out.resolve().relative_to(root.resolve()).as_posix() in files
    ):
        raise PackageError(f"the output {out} would be packaged into itself; add its folder to .funcignore")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for rel in files:
            info = zipfile.ZipInfo(rel, date_time=FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (0o100644 & 0xFFFF) << 16
            info.create_system = 3  # unix, so the mode bits are honoured on Linux
            zf.writestr(info, (root / rel).read_bytes())
    os.replace(tmp, out)
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    return Package(path=out, files=tuple(files), sha256=digest, size=out.stat().st_size)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.package", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("dist/app.zip"), help="zip to write (dist/app.zip)")
    parser.add_argument("--root", type=Path, default=ROOT, help="project root holding .funcignore")
    parser.add_argument("--list", action="store_true", help="only list the files that would be packaged")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        if args.list:
            for rel in collect(root):
                print(rel)
            return 0
        package = build(args.out, root)
    except PackageError as exc:
        print(f"package: error: {exc}", file=sys.stderr)
        return 1
    print(
        f"{package.path}  {len(package.files)} files  {package.size} bytes  sha256 {package.sha256}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
