"""docs/handlers.md's code blocks are the files that are tested: the doc cannot drift from them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BLOCK = re.compile(r"<!-- file: (?P<path>[^ ]+) -->\n```python\n(?P<code>.*?)```\n", re.DOTALL)


def test_every_file_block_of_the_handler_doc_equals_its_file() -> None:
    doc = (ROOT / "docs" / "handlers.md").read_text(encoding="utf-8")
    blocks = {m["path"]: m["code"] for m in BLOCK.finditer(doc)}
    assert set(blocks) == {
        "docs/examples/webhook.py",
        "tests/unit/jobs/test_webhook_example.py",
        "docs/examples/notify.py",
        "tests/unit/jobs/test_notify_example.py",
    }
    for path, code in blocks.items():
        assert code == (ROOT / path).read_text(encoding="utf-8"), f"docs/handlers.md's copy of {path} differs"


def test_the_worked_example_is_about_60_lines_with_about_80_of_tests() -> None:
    handler = (ROOT / "docs/examples/webhook.py").read_text(encoding="utf-8").count("\n")
    tests = (ROOT / "tests/unit/jobs/test_webhook_example.py").read_text(encoding="utf-8").count("\n")
    assert handler <= 70 and tests <= 90


def doc_names(path: str) -> set[str]:
    """Every name a doc writes outside its code blocks (`ctx.secret(name)` names `ctx`, `secret`
    and `name`; `<KIND>_SECRET_<NAME>` is one name)."""
    text = re.sub(r"```.*?```", "", (ROOT / path).read_text(encoding="utf-8"), flags=re.DOTALL)
    return set(re.findall(r"[A-Za-z_<>][A-Za-z0-9_<>]*", text))


def test_the_handler_doc_names_the_handler_api_the_client_and_the_kit() -> None:
    """Every public name of the context, Continue, the HTTP client and the kit is in handlers.md."""
    import dataclasses
    import inspect

    from shared.jobs.base import Continue, JobContext
    from shared.net.client import HttpClient
    from tests import handlerkit

    internal = {"effects", "record_effect", "monotonic", "sleep", "_local", "method", "url"}
    wanted: dict[str, set[str]] = {
        "JobContext": {f.name for f in dataclasses.fields(JobContext)}
        | {n for n, v in vars(JobContext).items() if callable(v) and not n.startswith("_")},
        "Continue": {f.name for f in dataclasses.fields(Continue)},
        "HttpClient": {f.name for f in dataclasses.fields(HttpClient)}
        | set(inspect.signature(HttpClient.request).parameters) - {"self"},
        "the kit": {
            n
            for n, v in vars(handlerkit).items()
            if inspect.isfunction(v) and v.__module__ == handlerkit.__name__ and not n.startswith("_")
        }
        | {n for n, v in vars(handlerkit.JobRun).items() if not n.startswith("_")}
        | {"reply", "route", "to", "allow", "default", "requests"},
    }
    names = doc_names("docs/handlers.md")
    missing = {what: sorted(n for n in want - internal if n not in names) for what, want in wanted.items()}
    assert not any(missing.values()), f"docs/handlers.md does not name: {missing}"


def test_the_docs_name_the_outbound_settings_as_the_code_reads_them() -> None:
    from shared.jobs.outbound import HOSTS_SUFFIX, OutboundPolicy, secret_setting

    for prefix, doc in (
        ("HTTP_", "docs/settings.md"),
        ("<KIND>_", "docs/settings.md"),
        ("<PREFIX>", "docs/handlers.md"),
    ):
        names = doc_names(doc)
        secret = secret_setting(prefix, "<NAME>")
        for name in (secret, secret + HOSTS_SUFFIX, OutboundPolicy(prefix).allowed_setting):
            assert name in names, f"{doc} does not name {name}"
