"""How Azure Functions Core Tools reads .funcignore for `func azure functionapp publish`.

A port of Core Tools' `GitIgnoreParser` (src/Azure.Functions.Cli/Common/GitIgnoreParser.cs, itself a
port of the codemix `gitignore-parser` npm package) and of the file walk around it
(`FileSystemHelpers.GetLocalFiles`). It is NOT gitignore:

- blank lines and `#` lines are skipped; one leading `/` is dropped; nothing else is special;
- every other character that is special in a regex is escaped (so `[...]` and `?` are literal),
  then `**` becomes `(.+)` and `*` becomes `([^/]+)`: a star matches ONE OR MORE characters;
- all patterns are joined into `^((p1)|(p2)|...)`: anchored at the start only, so a pattern matches
  every path it is a prefix of (`*.pem` is `^[^/]+\\.pem`: root files only, and also `a.pem.txt`);
- a path is published when it matches any `!` pattern, or no other pattern: a negation wins
  wherever it stands in the file;
- matching is case-sensitive (ECMAScript regex without the ignore-case flag);
- the walk never descends into `.git` or `.vscode`, and never publishes files named `.funcignore`,
  `.gitignore`, `local.settings.json` or `project.lock.json`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

ALWAYS_SKIPPED_DIRS = frozenset({".git", ".vscode"})
ALWAYS_SKIPPED_FILES = frozenset({".funcignore", ".gitignore", "local.settings.json", "project.lock.json"})
_SPECIAL = re.compile(r"[\-\[\]/{}()+?.\\^$|]")


def _pattern(glob: str) -> str:
    escaped = _SPECIAL.sub(lambda m: "\\" + m.group(0), glob)
    return escaped.replace("**", "(.+)").replace("*", "([^\\/]+)")


def _compile(patterns: list[str]) -> re.Pattern[str]:
    if not patterns:
        return re.compile("$^")
    return re.compile("^((" + ")|(".join(_pattern(p) for p in sorted(patterns)) + "))")


class CoreToolsIgnore:
    """`GitIgnoreParser` of Core Tools: `accepts(path)` is what `func ... publish` uploads."""

    def __init__(self, text: str) -> None:
        positive: list[str] = []
        negative: list[str] = []
        for raw in text.split("\n"):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            is_negative = line.startswith("!")
            if is_negative:
                line = line[1:]
            if line.startswith("/"):
                line = line[1:]
            (negative if is_negative else positive).append(line)
        self.has_negations = bool(negative)
        self._positive = _compile(positive)
        self._negative = _compile(negative)

    def accepts(self, path: str) -> bool:
        return bool(self._negative.match(path)) or not self._positive.match(path)

    def denies(self, path: str) -> bool:
        return not self.accepts(path)


def published_files(root: Path, ignore: CoreToolsIgnore) -> list[str]:
    """Relative paths `func azure functionapp publish` would zip from `root`, sorted.

    Core Tools tests every file; to keep walking .venv or node_modules cheap, a folder is skipped
    when its own path plus "/" is denied and the file has no negation: with start-anchored patterns
    that deny every path under it too (exact, not a heuristic).
    """
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = [
            d
            for d in sorted(dirnames)
            if d not in ALWAYS_SKIPPED_DIRS
            and not (not ignore.has_negations and ignore.denies(prefix + d + "/"))
        ]
        for name in sorted(filenames):
            if name in ALWAYS_SKIPPED_FILES:
                continue
            if ignore.accepts(prefix + name):
                out.append(prefix + name)
    return sorted(out)


def accepted(ignore: CoreToolsIgnore, paths: Iterable[str]) -> set[str]:
    """The given relative file paths that Core Tools would publish."""
    out = set()
    for path in paths:
        *folders, name = path.split("/")
        if ALWAYS_SKIPPED_DIRS & set(folders) or name in ALWAYS_SKIPPED_FILES:
            continue
        if ignore.accepts(path):
            out.add(path)
    return out
