"""The shape of an API key, known in one place: auth makes keys, logging refuses to write them.

A key is :data:`KEY_PREFIX` followed by ``secrets.token_urlsafe(SECRET_BYTES)``: 43 characters of
the URL-safe base64 alphabet ``[A-Za-z0-9_-]``. This module imports nothing of the service, so
every layer may use it.
"""

from __future__ import annotations

import re
import secrets

KEY_PREFIX = "dpss_"
#: Random bytes of a key's secret part (256 bits).
SECRET_BYTES = 32
#: A run of base64 characters mixing upper and lower case letters, at least 16 long (96 bits of
#: a key's 256): random base64 looks like this, the ids people make (UUIDs, hex trace ids,
#: ULIDs, ``req-42``) do not.
_BASE64_RUN = re.compile(r"[A-Za-z0-9_-]{16,}")


def generate_secret() -> str:
    """A new key's secret, shown once and stored only as its SHA-256."""
    return KEY_PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def looks_like_key(text: str) -> bool:
    """Whether ``text`` could be a key or a sizable piece of one: it names the prefix, or holds
    a long run of mixed-case base64. Such text is never logged or echoed."""
    if KEY_PREFIX in text.lower():
        return True
    return any(
        any(c.islower() for c in run) and any(c.isupper() for c in run)
        for run in _BASE64_RUN.findall(text)
    )


#: The prefix (any case) and whatever key characters follow it.
_PREFIXED = re.compile(re.escape(KEY_PREFIX) + r"[A-Za-z0-9_-]*", re.IGNORECASE)
REDACTED = "[redacted]"


def _redact_run(match: re.Match[str]) -> str:
    run = match.group(0)
    mixed = any(c.islower() for c in run) and any(c.isupper() for c in run)
    return REDACTED if mixed else run


def redact_keys(text: str) -> str:
    """``text`` with every key, or sizable piece of one (what :func:`looks_like_key` finds),
    replaced by :data:`REDACTED`; the rest (UUIDs, hex ids, words) unchanged."""
    return _BASE64_RUN.sub(_redact_run, _PREFIXED.sub(REDACTED, text))
