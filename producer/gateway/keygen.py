"""``rerankq serve keygen``: make an API key and add its entry to the keys file.

The key itself goes to stdout, once, and nowhere else: the file keeps only its SHA-256
(``producer.gateway.auth``). The file is replaced atomically, so a gateway reading it
never sees half of it, and only when it already is a keys file: a file that is not one
is left as it was. Runs at once on one file each keep their entry: the read, the check and
the replace happen under an exclusive lock on the file's directory (a lock on the file
itself would be lost with the inode the replace retires). A keys file that is a symbolic
link is written through to its target, so the link stays a link.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from kernel.errors import ConfigError
from kernel.setting_files import read_regular_file
from producer.gateway.auth import ALL_DEVICES, MAX_KEYS_FILE_BYTES, TENANT_NAME, digest, new_key, parse_entries
from producer.gateway.config import variable

EPILOG = """\b
Examples:
  rerankq serve keygen --tenant acme --keys-file keys.json            # adds the entry, prints the key
  rerankq serve keygen --tenant acme --devices cpu,gpu --chain private
  KEY=$(rerankq serve keygen --tenant ci)                              # RERANKQ_GATEWAY_KEYS_FILE names the file
"""


class KeygenError(click.ClickException):
    """A refused request: a bad option value or a keys file that cannot be used."""

    exit_code = 2


def _devices(value: str) -> list[str]:
    devices = [d.strip() for d in value.split(",") if d.strip()]
    if not devices or any(d not in ALL_DEVICES for d in devices) or len(set(devices)) != len(devices):
        raise click.BadParameter(f"distinct devices of {', '.join(ALL_DEVICES)}, comma-separated; got {value!r}")
    return devices


def _tenant(value: str) -> str:
    if not TENANT_NAME.fullmatch(value):
        raise click.BadParameter("1-64 characters of A-Z a-z 0-9 _ . -")
    return value


@click.command(epilog=EPILOG)
@click.option(
    "--tenant",
    required=True,
    callback=lambda ctx, param, value: _tenant(value),
    help="the tenant the key acts for (1-64 of A-Z a-z 0-9 _ . -)",
)
@click.option("--chain", default=None, help="chain profile the key is bound to (RERANKQ_CHAIN_<NAME> must exist)")
@click.option(
    "--devices",
    default="cpu",
    show_default=True,
    callback=lambda ctx, param, value: _devices(value),
    help="comma-separated of cpu, gpu, any: the queues the key may use; the first is its default",
)
@click.option(
    "--keys-file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=variable("keys_file"),
    show_envvar=True,
    default=None,
    help="the keys file to add the entry to (created when missing); without one the entry is printed",
)
@click.option("--json", "as_json", is_flag=True, help="print the key, its entry and the file as one JSON document")
def keygen(tenant: str, chain: str | None, devices: list[str], keys_file: Path | None, as_json: bool) -> int:
    """Make an API key for a tenant; add its hash to the keys file.

    The key is printed once, on stdout: give it to the client, it is not stored anywhere.
    A running gateway reads the keys file when it starts: restart it to accept the new key.
    """
    key = new_key()
    entry: dict[str, Any] = {"key_sha256": digest(key), "tenant": tenant, "devices": devices}
    if chain:
        entry["chain"] = chain.lower()
    try:
        if chain:
            _check_chain(entry)
        count = _append(keys_file, entry) if keys_file is not None else None
    except ConfigError as exc:
        raise KeygenError(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"key": key, "entry": entry, "keys_file": str(keys_file) if keys_file else None}))
        return 0
    click.echo(key)
    if keys_file is None:
        click.echo(
            f"the key above is shown once; add this entry to the file {variable('keys_file')} names:\n"
            f"{json.dumps(entry)}",
            err=True,
        )
    else:
        click.echo(
            f"the key above is shown once; its entry for tenant {tenant} is in {keys_file} "
            f"({count} key{'s' if count != 1 else ''}); restart the gateway to accept it",
            err=True,
        )
    return 0


def _check_chain(entry: dict[str, Any]) -> None:
    from kernel.settings import chain_profile_variable, load_settings

    if entry["chain"] not in load_settings().chain.profiles:
        raise ConfigError(
            "--chain",
            f"{entry['chain']!r} names no chain profile; "
            f"set {chain_profile_variable(entry['chain'])} where the gateway runs",
        )


@contextlib.contextmanager
def _directory_locked(directory: Path, source: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``directory``: it leaves no lock file behind, and every
    keygen on a file in it waits its turn (released when the descriptor closes)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise ConfigError(source, f"cannot open its directory {directory}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _append(path: Path, entry: dict[str, Any]) -> int:
    """Add ``entry`` to the keys file at ``path`` atomically; the number of keys it holds now."""
    source = f"--keys-file {path}"
    # Through a symbolic link to the file it names: replacing the link would cut it.
    target = Path(os.path.realpath(path))
    directory = target.parent
    with _directory_locked(directory, source):
        return _append_locked(target, entry, source)


def _append_locked(path: Path, entry: dict[str, Any], source: str) -> int:
    if os.path.lexists(path):  # no one else creates it while the directory is locked
        # What the gateway will read, checked as it checks it: a regular file of bounded size.
        raw = read_regular_file(str(path), limit=MAX_KEYS_FILE_BYTES, variable=source)
        mode = stat.S_IMODE(path.stat().st_mode)
    else:
        raw, mode = b"", 0o600
    existing: list[dict[str, Any]] = []
    if raw.strip() not in (b"", b"[]"):
        try:
            # Its chain profiles are the gateway host's to check: this one may not have them.
            parse_entries(raw, source=source, settings=None)
        except ConfigError as exc:
            raise ConfigError(source, f"{exc.message}; it was left as it was") from None
        existing = json.loads(raw)  # as the file has them: checked above, rewritten unchanged
    entries_out = [*existing, entry]
    data = (json.dumps(entries_out, indent=1) + "\n").encode()
    try:
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise ConfigError(source, f"cannot write beside it: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return len(entries_out)
