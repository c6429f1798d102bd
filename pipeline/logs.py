"""Log output: one JSON object per line (`TIERFLOW_LOG_JSON=true`) and a scrubber for secrets.

Every line passes through `scrub()`, whatever its source: librdkafka and redis-py errors quote their
configuration (SASL passwords, `redis://user:pass@host` URLs) and a log line must never carry them.
Settings hold secrets as `SecretStr`, so the scrubber is the second fence, not the first.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from typing import Any

import orjson

REDACTED = "***"

# `scheme://user:password@host` (also `redis://:password@host`): keep the user, drop the password.
_URL_USERINFO = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s:/@]*):(?P<secret>[^\s@/]*)@")
# `password=x`, `sasl.password: x`, `'ssl.key.password': 'x'`, `"api_key": "x"`, `token=x`, ...: the key must
# end in the secret word, so `tokens=12` or `password_file=/x` stay readable.
_KEY_VALUE = re.compile(
    r"(?P<key>[\w.\-]*(?:passw(?:or)?d|passphrase|secret(?:[_\-.]?key)?|api[_\-.]?key|access[_\-.]?key|token"
    r"|credentials?))"
    r"(?P<sep>['\"]?\s*[:=]\s*)"
    r"(?P<value>'[^']*'|\"[^\"]*\"|[^\s,;&}\])]+)",
    re.IGNORECASE,
)
# HTTP credentials (the OpenAI-compatible backend's API key travels as a bearer token).
_BEARER = re.compile(r"(?P<head>\b(?:Bearer\s+|Authorization:\s*Basic\s+))(?P<secret>[A-Za-z0-9._~+/=\-]+)",
                     re.IGNORECASE)


def _redact_value(m: re.Match[str]) -> str:
    value = m.group("value")
    quote = value[0] if value[:1] in ("'", '"') else ""
    return f"{m.group('key')}{m.group('sep')}{quote}{REDACTED}{quote}"


def scrub(text: str) -> str:
    """`text` with passwords, tokens and URL credentials replaced by `***`."""
    if not text:
        return text
    text = _URL_USERINFO.sub(lambda m: f"{m.group('head')}:{REDACTED}@", text)
    text = _KEY_VALUE.sub(_redact_value, text)
    return _BEARER.sub(lambda m: f"{m.group('head')}{REDACTED}", text)


# Attributes every LogRecord has; anything else on a record came in through `extra=`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ISO 8601, ms), level, logger, msg, the `extra=` fields
    (request_id, tier, ...), and `exc` with the traceback when there is one. All text is scrubbed."""

    def format(self, record: logging.LogRecord) -> str:
        ts = dt.datetime.fromtimestamp(record.created, tz=dt.UTC)
        out: dict[str, Any] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": scrub(record.getMessage()),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key not in out:
                out[key] = scrub(value) if isinstance(value, str) else value
        if record.exc_info:
            out["exc"] = scrub(self.formatException(record.exc_info))
        elif record.exc_text:
            out["exc"] = scrub(record.exc_text)
        if record.stack_info:
            out["stack"] = scrub(self.formatStack(record.stack_info))
        # default=str: an odd `extra` value (a Path, an enum) must not cost the log line
        return orjson.dumps(out, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


class ScrubbingFormatter(logging.Formatter):
    """The plain-text formatter with `scrub()` applied to the whole line (message and traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record))


class ScrubFilter(logging.Filter):
    """Scrubs a record's message in place, for handlers whose formatter is not ours."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = scrub(record.getMessage())
        record.args = None
        return True
