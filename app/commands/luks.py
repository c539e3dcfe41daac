"""``reqcrypt luks``: cryptsetup's verbs on the service's devices.

Passphrases come from a prompt that does not echo (twice for a new one), or from
``--key-file`` (its bytes as they are, as cryptsetup reads a key file); they go to the
service in the request body only. Options are named as cryptsetup names them.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from app.commands.client import Service, fail, with_service

luks_app = typer.Typer(
    help="LUKS1/LUKS2 on devices: format, dump, open, add-key, kill-slot.", no_args_is_help=True
)

PBKDF_SECONDS = 600
"""Client timeout: a key derivation may wait its turn behind others, then cost seconds."""

KeyFileOption = Annotated[
    Path | None,
    typer.Option(
        "--key-file", "-d", help="read the passphrase from this file (its bytes, as they are)"
    ),
]
Device = Annotated[str, typer.Argument(metavar="DEVICE", help="device name (e.g. sda2)")]


def secret(key_file: Path | None, prompt: str, *, confirm: bool = False) -> dict[str, str]:
    """The body fields of a passphrase: a key file's bytes, or a prompt without echo."""
    if key_file is not None:
        try:
            data = key_file.read_bytes()
        except OSError as error:
            fail(f"cannot read key file {key_file}: {error.strerror}")
        return {"key_file": base64.b64encode(data).decode("ascii")}
    text: str = typer.prompt(prompt, hide_input=True, confirmation_prompt=confirm)
    return {"passphrase": text}


def pbkdf_body(
    pbkdf: str | None,
    hash_name: str,
    iterations: int | None,
    memory: int | None,
    parallel: int | None,
    iter_time: int | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"hash": hash_name}
    for key, value in (
        ("type", pbkdf),
        ("iterations", iterations),
        ("memory_kib", memory),
        ("parallel", parallel),
        ("iter_time_ms", iter_time),
    ):
        if value is not None:
            body[key] = value
    return body


PbkdfOption = Annotated[str | None, typer.Option("--pbkdf", help="argon2id, argon2i or pbkdf2")]
HashOption = Annotated[str, typer.Option("--hash", help="PBKDF2, AF and digest hash")]
IterationsOption = Annotated[
    int | None,
    typer.Option("--pbkdf-force-iterations", help="PBKDF2 iterations or Argon2 passes"),
]
MemoryOption = Annotated[int | None, typer.Option("--pbkdf-memory", help="Argon2 memory (KiB)")]
ParallelOption = Annotated[int | None, typer.Option("--pbkdf-parallel", help="Argon2 threads")]
IterTimeOption = Annotated[
    int | None,
    typer.Option(
        "--iter-time",
        "-i",
        help="milliseconds the key derivation takes, timed on the service (as cryptsetup's; "
        "without it: fixed defaults)",
    ),
]


def print_dump(dump: dict[str, Any]) -> None:
    """luksDump's layout, in short."""
    lines = [
        f"Version:      {dump['version']}",
        f"UUID:         {dump['uuid']}",
        f"Label:        {dump['label'] or '(no label)'}",
        f"Cipher:       {dump['cipher']}",
        f"Key:          {dump['key_size']} bits",
        f"Sector size:  {dump['sector_size']}",
        f"Data offset:  {dump['data_offset']} [bytes]",
        f"Data length:  {dump['data_length']} [bytes]",
        "Keyslots:",
    ]
    for slot in dump["keyslots"]:
        pbkdf = ", ".join(f"{key} {value}" for key, value in slot["pbkdf"].items())
        lines.append(f"  {slot['slot']}: {slot['cipher']}, {pbkdf}")
    typer.echo("\n".join(lines))


@luks_app.command("format")
@with_service(timeout=PBKDF_SECONDS)
def format_device(
    service: Service,
    device: Device,
    type_: Annotated[str, typer.Option("--type", help="luks2 or luks1")] = "luks2",
    cipher: Annotated[str, typer.Option("--cipher", help="data and keyslot cipher")] = (
        "aes-xts-plain64"
    ),
    key_size: Annotated[int, typer.Option("--key-size", help="volume key size in bits")] = 512,
    sector_size: Annotated[
        int, typer.Option("--sector-size", help="encryption unit: 512..4096 (LUKS1: 512)")
    ] = 512,
    pbkdf: PbkdfOption = None,
    hash_name: HashOption = "sha256",
    iterations: IterationsOption = None,
    memory: MemoryOption = None,
    parallel: ParallelOption = None,
    iter_time: IterTimeOption = None,
    label: Annotated[str, typer.Option("--label", help="LUKS2 label (47 bytes at most)")] = "",
    key_file: KeyFileOption = None,
) -> None:
    """luksFormat: a new volume key in keyslot 0; whatever the device held is lost."""
    body: dict[str, Any] = {
        "type": type_,
        "cipher": cipher,
        "key_size": key_size,
        "sector_size": sector_size,
        "pbkdf": pbkdf_body(pbkdf, hash_name, iterations, memory, parallel, iter_time),
        "label": label,
        **secret(key_file, "Enter passphrase", confirm=True),
    }
    dump = service.request("POST", f"/v1/devices/{device}/luks", json=body).json()
    print_dump(dump)


@luks_app.command("dump")
@with_service()
def dump_header(
    service: Service,
    device: Device,
    as_json: Annotated[bool, typer.Option("--json", help="the service's JSON")] = False,
) -> None:
    """luksDump: the header, never key material."""
    dump = service.request("GET", f"/v1/devices/{device}/luks").json()
    if as_json:
        typer.echo(json.dumps(dump, indent=2))
    else:
        print_dump(dump)


@luks_app.command("open")
@with_service(timeout=PBKDF_SECONDS)
def open_volume(
    service: Service,
    device: Device,
    name: Annotated[str, typer.Argument(metavar="NAME", help="the volume to create")],
    allow_discards: Annotated[
        bool, typer.Option("--allow-discards", help="pass discards down (as cryptsetup's)")
    ] = False,
    key_file: KeyFileOption = None,
) -> None:
    """luksOpen: volume NAME maps the device's data with the key the passphrase unlocks."""
    luks = {"device": device, "allow_discards": allow_discards}
    luks |= secret(key_file, f"Enter passphrase for {device}")
    service.request("POST", "/v1/volumes", json={"name": name, "luks": luks})


@luks_app.command("add-key")
@with_service(timeout=PBKDF_SECONDS)
def add_key(
    service: Service,
    device: Device,
    new_key_file: Annotated[
        Path | None, typer.Argument(metavar="[NEW_KEY_FILE]", help="the new passphrase's file")
    ] = None,
    pbkdf: PbkdfOption = None,
    hash_name: HashOption = "sha256",
    iterations: IterationsOption = None,
    memory: MemoryOption = None,
    parallel: ParallelOption = None,
    iter_time: IterTimeOption = None,
    key_file: KeyFileOption = None,
) -> None:
    """luksAddKey: a free keyslot opens with a new passphrase too."""
    body: dict[str, Any] = secret(key_file, "Enter any existing passphrase")
    if new_key_file is not None:
        try:
            body["new_passphrase"] = new_key_file.read_bytes().decode()
        except (OSError, UnicodeDecodeError):
            fail(f"cannot read {new_key_file} as UTF-8 text")
    else:
        body["new_passphrase"] = typer.prompt(
            "Enter new passphrase for key slot", hide_input=True, confirmation_prompt=True
        )
    body["pbkdf"] = pbkdf_body(pbkdf, hash_name, iterations, memory, parallel, iter_time)
    added = service.request("POST", f"/v1/devices/{device}/luks/keyslots", json=body).json()
    typer.echo(f"Key slot {added['slot']} created.")


@luks_app.command("kill-slot")
@with_service(timeout=PBKDF_SECONDS)
def kill_slot(
    service: Service,
    device: Device,
    slot: Annotated[int, typer.Argument(metavar="SLOT", help="the keyslot to remove")],
    force: Annotated[
        bool, typer.Option("--force", help="kill the last keyslot: the data is lost for good")
    ] = False,
    key_file: KeyFileOption = None,
) -> None:
    """luksKillSlot: needs a passphrase of another keyslot (none with --force alone)."""
    body: dict[str, Any] = {"force": force}
    if key_file is not None or not force:
        body |= secret(key_file, "Enter any remaining passphrase")
    service.request("DELETE", f"/v1/devices/{device}/luks/keyslots/{slot}", json=body)
