"""What a deployment allows: read-only or not, and the caps on jobs, from LOOPSCOPE_READ_ONLY and LOOPSCOPE_MAX_*
(or st.secrets, adopted into the environment). No torch and no engine here, so the dashboard asks on every page
without importing the training code; engine.runtime.jobs re-exports all of it."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path

CAPS = {"max_seeds": 16, "max_steps": 20_000, "max_loops": 64}  # LOOPSCOPE_MAX_SEEDS etc. override these
YES, NO = ("1", "true", "yes", "on"), ("0", "false", "no", "off")  # the only spellings LOOPSCOPE_READ_ONLY takes


class Refused(PermissionError):
    """The deployment does not allow this job (read-only, or over a cap); the message says which."""


def _setting(name: str) -> str:
    """LOOPSCOPE_<NAME>, stripped; empty when unset (an empty variable counts as unset)."""
    return os.environ.get(f"LOOPSCOPE_{name.upper()}", "").strip()


def read_only_setting() -> bool | None:
    """LOOPSCOPE_READ_ONLY as True/False, None when unset. Anything but a clear yes or no raises Refused:
    a typo such as 'enabled' must not leave a public copy writable."""
    value = _setting("read_only")
    if not value:
        return None
    if value.lower() in YES + NO:
        return value.lower() in YES
    raise Refused(
        f"LOOPSCOPE_READ_ONLY={value!r} is neither yes ({', '.join(YES)}) nor no ({', '.join(NO)}), "
        "so this loopscope stays read-only; set it to one of those."
    )


def read_only() -> bool:
    """Fails closed: an unclear setting reads as read-only (read_only_setting says what is wrong)."""
    try:
        return bool(read_only_setting())
    except Refused:
        return True


def refuse_writes() -> None:
    """Raise Refused, with the reason, on a read-only deployment: every writer below calls this first."""
    if read_only_setting():  # raises itself on an unclear setting
        raise Refused("this loopscope is read-only (LOOPSCOPE_READ_ONLY is set): it shows results but runs nothing.")


def adopt_settings(secrets) -> None:
    """Take read_only, remote_jobs and the caps from a mapping such as st.secrets into the environment, where
    check() reads them (so the worker side refuses what the page hides); a variable already set, and not empty,
    wins."""
    for name in ("read_only", "remote_jobs", *CAPS):
        try:
            value = secrets[name]
        except Exception:  # not set, or no secrets file at all
            continue
        if not _setting(name):
            os.environ[f"LOOPSCOPE_{name.upper()}"] = str(value).strip().lower()


def caps() -> dict[str, int]:
    """The caps, LOOPSCOPE_MAX_* where set; Refused if one is not a whole number (no cap is no guess)."""
    found = {}
    for name, default in CAPS.items():
        value = _setting(name) or str(default)
        if not re.fullmatch(r"[0-9]{1,9}", value):
            raise Refused(f"LOOPSCOPE_{name.upper()}={value!r} is not a whole number; set it to one, e.g. {default}.")
        found[name] = int(value)
    return found


# ---------------------------------------------------------------- who can reach the server, and what it shows


def is_local_address(address: str | None) -> bool:
    """Whether a server bound to this address is reachable from this machine only. Empty (Streamlit's default:
    every interface), 0.0.0.0, :: or a host name other than localhost are not."""
    text = (address or "").strip().strip("[]")
    if text == "localhost":
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def remote_jobs() -> bool:
    """LOOPSCOPE_REMOTE_JOBS (or remote_jobs in st.secrets): a clear yes lets a server beyond localhost run jobs."""
    return _setting("remote_jobs").lower() in YES


def guard_address(address: str | None) -> str | None:
    """Make a server beyond localhost read-only unless LOOPSCOPE_REMOTE_JOBS says yes: anyone on the network
    could otherwise submit jobs. Sets LOOPSCOPE_READ_ONLY=1 in this process (its workers inherit it) and
    returns the sentence that says why; None where nothing changed."""
    if is_local_address(address) or remote_jobs() or read_only():
        return None
    os.environ["LOOPSCOPE_READ_ONLY"] = "1"
    where = f"on {address}" if (address or "").strip() else "on every network interface"
    return (
        f"Read-only because this server listens {where}: anyone who can reach it could run jobs. "
        "Serve on 127.0.0.1 (loopscope dashboard does by default) or set LOOPSCOPE_REMOTE_JOBS=1 to allow them."
    )


ABSOLUTE_PATH = re.compile(r"(?<![\w.~/:])(?:/[^/\s'\"`:,;()\[\]]+)+/?")


def shown_path(path: str | Path) -> str:
    """A server path as a page may show it: in full where the dashboard is writable (a local user's own server),
    only its last part on a read-only copy, which must not disclose the server's folders."""
    return Path(path).name or str(path) if read_only() else str(path)


def redact(text: str) -> str:
    """Text for a read-only page: every absolute path cut to its last part (`…/name`)."""
    if not read_only():
        return text
    return ABSOLUTE_PATH.sub(lambda m: "…/" + (Path(m.group(0)).name or "…"), text)
