"""Recognising secrets by name or shape, so they never reach logs, params or artifacts."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

# Names like HF_TOKEN, --hf-token, VLLM_API_KEY, api_key, WANDB_KEY, AWS_SECRET_ACCESS_KEY, password.
# "tokens" (e.g. max_num_batched_tokens) is a count, not a secret.
_SECRET_NAME = re.compile(
    r"(api[_-]?key|(^|[_\-.])(access_)?token$|(^|[_\-.])key$|secret|passw(or)?d|credential|authorization)", re.I
)
# Values that look like well-known token formats, wherever they appear in free text.
_SECRET_VALUE = re.compile(r"\b(hf_[A-Za-z0-9]{8,}|sk-[A-Za-z0-9_\-]{8,}|ghp_[A-Za-z0-9]{8,})")
# The password of a URL's user (https://user:PASSWORD@host, postgresql://user:PASSWORD@host/db).
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*:)([^\s/]+)(@)")
REDACTED = "***"


def is_secret_name(name: str) -> bool:
    """A name that holds a secret. ``api_key_env`` names the variable that holds one: not a secret."""
    name = name.strip("-")
    return bool(_SECRET_NAME.search(name)) and not name.lower().endswith(("_env", "-env"))


def redact_text(text: str) -> str:
    """Hide token-looking substrings (``hf_...``, ``sk-...``, ``ghp_...``) and the passwords of
    URLs (``https://user:***@host``, a tracking URI's) in free text."""
    return _URL_PASSWORD.sub(rf"\1{REDACTED}\3", _SECRET_VALUE.sub(REDACTED, text))


def redact_argv(argv: list[str]) -> list[str]:
    """Hide the value after flags such as ``--api-key`` / ``--hf-token`` (and ``--flag=value`` forms)."""
    out: list[str] = []
    hide_next = False
    for arg in (str(a) for a in argv):
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg.startswith("--") and is_secret_name(arg.split("=", 1)[0]):
            if "=" in arg:
                out.append(arg.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(arg)
                hide_next = True
        else:
            out.append(redact_text(arg))
    return out


def redact_override(override: str) -> str:
    """``engine.env.HF_TOKEN=abc`` -> ``engine.env.HF_TOKEN=***`` (Hydra override strings); in a
    list or dict value, the value after a secret flag or under a secret key
    (``engine.extra_args=[--api-key,***]``, ``engine.env={HF_TOKEN:***}``)."""
    key, sep, value = override.partition("=")
    if sep and is_secret_name(key.lstrip("+~").split(".")[-1]):
        return f"{key}={REDACTED}"
    if sep and value.lstrip().startswith(("[", "{")):
        return f"{key}={_redact_collection(value)}"
    return redact_text(override)


# One element of a Hydra list or dict value: a quoted string, or the text up to the next
# delimiter that is not escaped (Hydra takes `a b c` and `abc\:def` as one value each).
_PIECE = re.compile(r"""'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*"|(?:\\.|[^\[\]{},:'"\\])+""")


def _redact_collection(value: str, hidden: list[str] | None = None) -> str:
    """A Hydra list/dict value's text with the element after a secret flag, a secret flag's
    ``=value`` and a secret key's value hidden; everything else as written. ``hidden`` gets
    each hidden text as it was written (escapes and all)."""
    found: list[str] = [] if hidden is None else hidden
    out: list[str] = []
    last, hide = 0, False
    for m in _PIECE.finditer(value):
        out.append(value[last : m.start()])
        last = m.end()
        raw = m.group(0)
        piece = raw.strip()
        if not piece:  # the space between delimiters
            out.append(raw)
            continue
        lead, trail = raw[: len(raw) - len(raw.lstrip())], raw[len(raw.rstrip()) :]
        quote = piece[0] if piece[0] in "'\"" else ""
        inner = piece[1:-1] if quote else piece
        if value[m.end() :].lstrip().startswith(":"):  # a dict's key
            hide = is_secret_name(inner)
        elif hide:
            found.append(inner)
            inner, hide = REDACTED, False
        else:
            flag, eq, held = inner.partition("=")
            if flag.startswith("--") and is_secret_name(flag):
                if eq:
                    found.append(held)
                inner, hide = (f"{flag}={REDACTED}", False) if eq else (inner, True)
            else:
                inner = redact_text(inner)
        out.append(f"{lead}{quote}{inner}{quote}{trail}")
    out.append(value[last:])
    return "".join(out)


def redact_mapping(value: Any, key: str = "") -> Any:
    """A copy of nested data with secret-named keys hidden and argv-like lists redacted."""
    if key and is_secret_name(key) and value is not None:  # an unset one is shown unset
        return REDACTED
    if isinstance(value, dict):
        return {k: redact_mapping(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, (str, int, float)) for v in value):
            return redact_argv([str(v) for v in value]) if any(isinstance(v, str) for v in value) else list(value)
        return [redact_mapping(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def secret_values(value: Any, key: str = "") -> set[str]:
    """The secrets in nested data: values under secret-named keys (``engine.env.HF_TOKEN``'s, every
    item of a list held there), the element after a secret flag in a list (``[--api-key, X]``) and
    a secret flag's ``=value``, and the values of secret-named Hydra overrides
    (``+engine.env.HF_TOKEN=...``)."""
    found: set[str] = set()
    if key and is_secret_name(key):
        items = value if isinstance(value, (list, tuple)) else [value]
        found |= {str(v) for v in items if isinstance(v, (str, int)) and not isinstance(v, bool)}
    elif isinstance(value, dict):
        for k, v in value.items():
            found |= secret_values(v, str(k))
    elif isinstance(value, (list, tuple)):
        after_flag = False
        for v in value:
            if after_flag and isinstance(v, (str, int)) and not isinstance(v, bool):
                found.add(str(v))
                after_flag = False
                continue
            if isinstance(v, str) and v.startswith("--") and is_secret_name(v.partition("=")[0]):
                flag_value = v.partition("=")[2]
                if flag_value:
                    found.add(flag_value)
                else:
                    after_flag = True
                continue
            found |= secret_values(v)
    elif isinstance(value, str) and "=" in value:
        name, _, held = value.partition("=")
        if held and is_secret_name(name.lstrip("+~").split(".")[-1]):
            found.add(held)
        elif held.lstrip().startswith(("[", "{")):  # as written in the override (escapes and all)
            pieces: list[str] = []
            _redact_collection(held, pieces)
            found |= set(pieces)
    return found


def hide(text: str, secrets: set[str]) -> str:
    """``text`` with each of ``secrets`` (4 characters or more, where it stands as a word of its
    own: a key "test" leaves "pytest" alone) and every token-looking value or URL password
    hidden. Under 4 characters a value is no secret worth the name and would hide every "1" or
    "yes" of the text."""
    # the longer first: a secret inside a longer one
    for secret in sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True):
        text = re.sub(rf"(?<![A-Za-z0-9_-]){re.escape(secret)}(?![A-Za-z0-9_-])", REDACTED, text)
    return redact_text(text)


def scrub_file(path: Path, secrets: set[str], block_bytes: int = 4 << 20) -> None:
    """Rewrite a file somebody else wrote (Hydra's ``multirun.yaml``, a server's raw log) with
    ``secrets`` hidden (:func:`hide`); a missing file is left missing. Read in blocks of whole
    lines (a log may be large), bytes that are not UTF-8 (a line cut by a KILL) kept as they
    are, and the file replaced at once (a temporary beside it, renamed): an interrupt leaves the
    old file or the new one, never half of it; unchanged, it is not rewritten."""
    try:
        src = open(path, "rb")
    except FileNotFoundError:
        return
    tmp = path.with_name(f".{path.name}.scrub")
    changed = False
    try:
        with src, open(tmp, "wb") as out:
            while True:
                block = src.read(block_bytes)
                if not block:
                    break
                block += src.readline()  # to the end of its line: a secret is not cut in two
                text = block.decode("utf-8", errors="surrogateescape")
                scrubbed = hide(text, secrets)
                changed |= scrubbed != text
                out.write(scrubbed.encode("utf-8", errors="surrogateescape"))
        if changed:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
