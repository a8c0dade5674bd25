"""Whose recorded command is this: the dumper signs what `wb redump` would re-run, `wb redump` checks it.

A dump's `wb_manifest.json` (and the catalog's `runs.meta`, a copy of it) records the command that made the
dump. Dumps and catalogs are shared, and a manifest is a text file anyone can edit, so the dumper signs the
fields a re-run executes (`SIGNED`) with an HMAC-SHA256 keyed by a per-user secret that `wb` creates on first
use (`$XDG_CONFIG_HOME/wb/dump.key`, else `~/.config/wb/dump.key`, mode 0600). A signature that verifies means
"recorded on this machine by this user, unchanged since"; anything else (no signature, another user's or
machine's key, an edited manifest or catalog) is shown as recorded elsewhere or edited. Either way `wb redump`
asks before running (docs/security.md, "Recorded commands").
"""

from __future__ import annotations

import getpass
import hashlib
import hmac
import json
import os
import secrets
import socket
import stat
from pathlib import Path
from typing import Any

SIGNED = ("command", "executable", "cwd", "exec", "config")  # argv, interpreter, folder, zero-code env, dump dir
SIGNATURE_KEY = "signature"  # the manifest field holding {"by": "user@host", "hmac": hex}
KEY_NAME = "dump.key"

_key_cache: dict[str, bytes] = {}


def key_path() -> Path:
    """Where this user's signing key lives."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".config"
    return root / "wb" / KEY_NAME


def _read_key(path: Path) -> bytes | None:
    """The key, when it is a regular file of this user that nobody else can read or write."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077 or st.st_size > 4096:
            return None
        data = os.read(fd, 4096).strip()
    finally:
        os.close(fd)
    return data if len(data) >= 32 else None


def user_key(create: bool) -> bytes | None:
    """This user's key; made (0600, in a 0700 folder) on first use when `create`. None: none usable."""
    path = key_path()
    cached = _key_cache.get(str(path))
    if cached is not None:
        return cached
    key = _read_key(path)
    if key is None and create and not os.path.lexists(path):
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32) + "\n")
        except FileExistsError:
            pass  # another process made it first: read theirs
        except OSError:
            return None
        key = _read_key(path)
    if key is not None:
        _key_cache[str(path)] = key
    return key


def _mac(key: bytes, meta: dict[str, Any], by: str) -> str:
    payload = json.dumps(
        {"by": by, **{k: meta.get(k) for k in SIGNED}}, sort_keys=True, separators=(",", ":"), default=str
    )
    return hmac.new(key, payload.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def sign(meta: dict[str, Any]) -> dict[str, str] | None:
    """The signature of `meta`'s recorded command (None when no key can be made: the run is then unsigned)."""
    key = user_key(create=True)
    if key is None:
        return None
    by = _who()
    return {"by": by, "hmac": _mac(key, meta, by)}


def unverified(meta: dict[str, Any]) -> str | None:
    """None when `meta`'s recorded command was signed by this user on this machine and is unchanged;
    otherwise why it is not trusted (one phrase)."""
    sig = meta.get(SIGNATURE_KEY)
    if not isinstance(sig, dict) or not isinstance(sig.get("hmac"), str) or not isinstance(sig.get("by"), str):
        return "no signature (an older wb, another dumper, or the signature was removed)"
    by = str(sig["by"])
    key = user_key(create=False)
    if key is None:
        return f"signed by {by}, and this user has no key on this machine ({key_path()})"
    if not hmac.compare_digest(_mac(key, meta, by), str(sig["hmac"])):
        return f"the signature (by {by}) does not match: another user or machine, or the record was edited"
    return None
