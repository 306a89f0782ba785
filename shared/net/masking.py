"""Masking secret values in text and bytes, in the encodings a downstream may echo them in (pure).

`Masker(secrets)` replaces with `***` every occurrence of each secret as sent, and as
- JSON-escaped (any character as `\\uXXXX`, either case; `/` as `\\/`; `"` and `\\` escaped),
- URL-encoded (any character as `%XX`, either case; a space as `+`),
  mixed freely within one occurrence,
- base64 and base64url (at each of the three alignments, with or without padding),
- UTF-16 (LE and BE) for bytes, and hexadecimal (either case).
Mask the whole text before cutting it: `Masker.window` is the longest form a secret takes, so a text
read `window` bytes past where it will be cut has every occurrence that starts before the cut whole.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from functools import cached_property

MASK = "***"
MIN_SECRET_CHARS = 4
"""Shorter values are not masked inside other text (they would mask half of every answer)."""


def _char_forms(ch: str, as_bytes: bool) -> str:
    """A regular expression matching one character as written (its UTF-8 bytes read as Latin-1
    when `as_bytes`), JSON-escaped or URL-encoded."""
    utf8 = ch.encode("utf-8")
    forms = [re.escape(utf8.decode("latin-1") if as_bytes else ch)]
    code = ord(ch)
    units = (
        [code] if code < 0x10000 else [0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)]
    )
    forms.append("".join(rf"\\u(?i:{u:04x})" for u in units))
    if ch in '/"\\':
        forms.append(re.escape("\\" + ch))
    if ch == " ":
        forms.append(r"\+")
    forms.append("".join(f"%(?i:{b:02x})" for b in utf8))
    return f"(?:{'|'.join(forms)})"


def _encoded_pattern(value: str, as_bytes: bool = False) -> str:
    return "".join(_char_forms(ch, as_bytes) for ch in value)


def _base64_forms(raw: bytes) -> list[str]:
    """The base64 (and base64url) text every occurrence of `raw` in a longer encoded stream
    contains, whatever its alignment: the part of its encoding not mixed with neighbours."""
    forms = []
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + raw).decode()
        start = (shift * 8 + 5) // 6 if shift else 0
        tail = (len(raw) + shift) % 3
        end = len(encoded.rstrip("=")) - (1 if tail else 0)
        core = encoded[start:end]
        if len(core) >= MIN_SECRET_CHARS:
            forms.append(core)
            forms.append(core.replace("+", "-").replace("/", "_"))
    return forms


class Masker:
    """Masks a set of secret values in any text or bytes (immutable once made)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = tuple(sorted({s for s in secrets if s}, key=len, reverse=True))

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def with_(self, secrets: Iterable[str]) -> Masker:
        return Masker((*self.secrets, *secrets))

    @cached_property
    def _literals(self) -> tuple[str, ...]:
        """The forms that are plain strings (replaced at C speed): as sent, base64, hex."""
        forms: list[str] = []
        for value in self.secrets:
            forms.append(value)
            if len(value) >= MIN_SECRET_CHARS:
                raw = value.encode("utf-8")
                forms += [*_base64_forms(raw), raw.hex(), raw.hex().upper()]
        return tuple(sorted(set(forms), key=len, reverse=True))

    def _escaped(self, as_bytes: bool) -> tuple[re.Pattern[str], re.Pattern[str]] | None:
        """(the escaped forms, the marks one of them must contain): JSON escapes and URL-encoding."""
        values = [v for v in self.secrets if len(v) >= MIN_SECRET_CHARS]
        if not values:
            return None
        marks = [r"\\u[0-9a-fA-F]{4}", "%[0-9a-fA-F]{2}"]
        marks += [re.escape("\\" + c) for c in '/"\\' if any(c in v for v in values)]
        marks += [r"\+"] if any(" " in v for v in values) else []
        pattern = re.compile("|".join(_encoded_pattern(v, as_bytes) for v in values))
        return pattern, re.compile("|".join(marks))

    @cached_property
    def _text_escaped(self) -> tuple[re.Pattern[str], re.Pattern[str]] | None:
        return self._escaped(as_bytes=False)

    @cached_property
    def _bytes_escaped(self) -> tuple[re.Pattern[str], re.Pattern[str]] | None:
        """Over bytes read as Latin-1 (one character per byte): the UTF-8 forms."""
        return self._escaped(as_bytes=True)

    @cached_property
    def window(self) -> int:
        """The longest form (in bytes or characters) a secret may take: read this much past a cut."""
        longest = max((len(v.encode("utf-8")) for v in self.secrets), default=0)
        return longest * 12 + 8  # %XX per byte, or \\uXXXX + surrogate pairs; base64 and hex shorter

    def _masked(self, text: str, escaped: tuple[re.Pattern[str], re.Pattern[str]] | None) -> str:
        for form in self._literals:
            text = text.replace(form, MASK)
        return self._escaped_masked(text, escaped)

    def _escaped_masked(self, text: str, escaped: tuple[re.Pattern[str], re.Pattern[str]] | None) -> str:
        if escaped is None:
            return text
        pattern, marks = escaped
        # an escaped form holds a mark: only the text around the marks is searched (fast when few)
        spans: list[list[int]] = []
        for mark in marks.finditer(text):
            start, end = max(0, mark.start() - self.window), mark.end() + self.window
            if spans and start <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], end)
            else:
                spans.append([start, end])
        out, done = [], 0
        for start, end in spans:
            out += [text[done:start], pattern.sub(MASK, text[start:end])]
            done = end
        out.append(text[done:])
        return "".join(out)

    def text(self, text: str) -> str:
        """`text` with every secret, in every form above, replaced by `***`."""
        return self._masked(text, self._text_escaped) if self.secrets else text

    def bytes(self, data: bytes) -> bytes:
        """`data` with every secret (UTF-8, UTF-16, escaped, encoded) replaced by `***`."""
        if not self.secrets:
            return data
        for value in self.secrets:
            for codec in ("utf-16-le", "utf-16-be"):  # masked in the same encoding: the text still decodes
                data = data.replace(value.encode(codec), MASK.encode(codec))
        text = data.decode("latin-1")
        for form in self._byte_literals:
            text = text.replace(form, MASK)
        return self._escaped_masked(text, self._bytes_escaped).encode("latin-1")

    @cached_property
    def _byte_literals(self) -> tuple[str, ...]:
        """The plain forms in bytes read as Latin-1: the UTF-8 bytes as sent, base64 and hex (ASCII)."""
        raw = {v.encode("utf-8").decode("latin-1") for v in self.secrets}
        forms = raw | (set(self._literals) - set(self.secrets))
        return tuple(sorted(forms, key=len, reverse=True))

    def value(self, value: object) -> object:
        """A decoded JSON value with every string (and key) masked."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if isinstance(value, dict):
            return {self.text(str(k)): self.value(v) for k, v in value.items()}
        return value
