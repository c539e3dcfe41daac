"""The API manual: a summary, a description and examples for every operation.

Kept in one table rather than spread over the routers so a reader (and the test
that every operation is covered) sees the whole manual at once; route docstrings,
where present, follow the manual's text. ``apply`` merges it into the generated
OpenAPI document: summaries, descriptions, named request examples, documented
request headers (Range, Content-Range, If-Match…) and the readiness 503.
"""

from __future__ import annotations

from typing import Any

KEY = "0" * 128
XTS_TABLE = f"0 131072 crypt aes-xts-plain64 {KEY} 0 sda2 0"
GROWN = XTS_TABLE.replace("131072", "262144")
ESSIV_TABLE = (
    "0 1024 crypt aes-cbc-essiv:sha256 "
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f 0 sda2 0 "
    "2 allow_discards sector_size:4096"
)


def header(name: str, description: str, example: str, required: bool = False) -> dict[str, Any]:
    return {
        "name": name,
        "in": "header",
        "required": required,
        "description": description,
        "schema": {"type": "string"},
        "example": example,
    }


RANGE = header(
    "Range",
    "`bytes=a-b`, `bytes=a-` or `bytes=-N`; several ranges (a batch: read in one "
    "submission, up to REQCRYPT_MAX_RANGES and REQCRYPT_MAX_BATCH_BYTES) answer "
    "`multipart/byteranges`. Without it the whole volume is sent (200).",
    "bytes=0-4095",
)
del RANGE["example"]  # a parameter has example or examples, not both
RANGE["examples"] = {
    "one range": {"value": "bytes=0-4095"},
    "offset to the end": {"value": "bytes=1048576-"},
    "the last 512 bytes": {"value": "bytes=-512"},
    "several (multipart/byteranges)": {"value": "bytes=0-511,4096-4607"},
}
IF_MATCH = header("If-Match", "the volume's ETag: 412 when the volume changed", '"<uuid>.<n>"')
IF_NONE_MATCH = header("If-None-Match", "the ETag you hold: 304 when unchanged", '"<uuid>.<n>"')
IF_RANGE = header("If-Range", "the ETag you hold: a stale one drops Range (200)", '"<uuid>.<n>"')
CONTENT_RANGE = header(
    "Content-Range",
    "where the body goes: `bytes a-b/*` (inclusive, b - a + 1 == body length); "
    "unaligned ranges are read-modify-written",
    "bytes 0-4095/*",
    required=True,
)


RETRY_AFTER = {
    "Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}
}
WAIT = {
    "description": "I/O to a suspended volume waits for its resume up to "
    "REQCRYPT_SUSPEND_WAIT_SECONDS (default 30 s) before this answer, with Retry-After: "
    "that wait in seconds (at least 1). Also at once, with Retry-After: 1, when "
    "REQCRYPT_MAX_VOLUME_IOS I/Os are in flight on the volume, or when a cluster's owner "
    "of the volume cannot be reached. Set a client timeout above the suspend wait.",
    "headers": RETRY_AFTER,
}
STALE = "If-Match names another ETag than the volume's current one: it changed since"
OUTSIDE = (
    "the range lies outside the volume; Content-Range: bytes */SIZE gives its size "
    "(a property of the volume, not of the request)"
)
DATA_RESPONSES: dict[str, Any] = {"503": WAIT, "416": OUTSIDE}


def body(*examples: tuple[str, Any], media: str = "application/json") -> dict[str, Any]:
    return {
        media: {"examples": {name: {"summary": name, "value": value} for name, value in examples}}
    }


OPERATIONS: dict[tuple[str, str], dict[str, Any]] = {
    ("get", "/healthz"): {
        "summary": "Liveness",
        "description": "200 while the process serves HTTP. No token needed.",
    },
    ("get", "/readyz"): {
        "summary": "Readiness: database, migrations, data directory",
        "description": "200 when the database answers, its schema is at the migrations' "
        "head and the data directory is writable; otherwise 503 with the failing checks.",
        "responses": {"503": "not ready: the problem lists each failing check"},
    },
    ("get", "/metrics"): {
        "summary": "Prometheus metrics",
        "description": "HTTP request counters and latencies per route, and per volume: "
        "bios, requests, merges, sectors, in-flight requests, engine calls.",
    },
    ("get", "/v1/devices"): {
        "summary": "List backing devices",
        "description": "Each device's size, bytes allocated in its sparse file, timing "
        "model and the volumes that map it.",
    },
    ("post", "/v1/devices"): {
        "summary": "Create a backing device",
        "description": "A sparse file of `size_bytes` (a multiple of 512) under the data "
        "directory, named in tables as `NAME` or `/dev/NAME`. `model` picks a device timing "
        "model (`GET /v1/device-models`).",
        "examples": body(
            ("64 MiB", {"name": "sda2", "size_bytes": 64 << 20}),
            ("SD card model", {"name": "mmcblk0", "size_bytes": 1 << 30, "model": "sdcard-bbb"}),
        ),
    },
    ("get", "/v1/devices/{name}"): {
        "summary": "Inspect a backing device",
        "description": "Size, allocation, model and the volumes mapping it.",
    },
    ("delete", "/v1/devices/{name}"): {
        "summary": "Delete a backing device",
        "description": "Removes the file. 409 while a volume maps the device.",
    },
    ("post", "/v1/devices/{name}/luks"): {
        "summary": "Format a device as LUKS (cryptsetup luksFormat)",
        "description": "A new random volume key, sealed in keyslot 0 by the passphrase (or "
        "the base64 bytes of a key file). Defaults are cryptsetup's: LUKS2, aes-xts-plain64, "
        "512-bit key, argon2id (LUKS1: pbkdf2), 16 MiB of header before the data. PBKDF costs "
        "above the service's REQCRYPT_LUKS_MAX_PBKDF_* ceiling are refused (422), as is a "
        "device a volume maps (409). The answer is the new header's dump.",
        "examples": body(
            ("LUKS2, 4 KiB sectors", {"passphrase": "correct horse", "sector_size": 4096}),
            (
                "LUKS1 for qemu, cheap PBKDF2",
                {
                    "type": "luks1",
                    "passphrase": "correct horse",
                    "pbkdf": {"type": "pbkdf2", "hash": "sha256", "iterations": 100000},
                },
            ),
        ),
    },
    ("get", "/v1/devices/{name}/luks"): {
        "summary": "Show a device's LUKS header (cryptsetup luksDump)",
        "description": "Version, UUID, label, cipher, sector size, data offset and length, "
        "keyslots with their PBKDF parameters, the digest and tokens; never key material or "
        "salts. `header_copy` says `secondary` when the primary LUKS2 copy is corrupt. 404 "
        "when the device holds no LUKS header, 422 when it holds one reqcrypt refuses.",
    },
    ("post", "/v1/devices/{name}/luks/keyslots"): {
        "summary": "Add a passphrase (cryptsetup luksAddKey)",
        "description": "`passphrase` (or `key_file`) opens an existing keyslot; the lowest "
        "free keyslot then also opens with `new_passphrase`. A wrong passphrase is 403.",
        "examples": body(
            ("second passphrase", {"passphrase": "correct horse", "new_passphrase": "battery"}),
        ),
    },
    ("delete", "/v1/devices/{name}/luks/keyslots/{slot}"): {
        "summary": "Remove a keyslot (cryptsetup luksKillSlot)",
        "description": "`passphrase` must open another keyslot (403 otherwise). The last "
        "keyslot goes only with `force`: the data is then unreadable for good (409 without).",
        "examples": body(
            ("with another slot's passphrase", {"passphrase": "battery"}),
            ("the last slot", {"force": True}),
        ),
    },
    ("get", "/v1/volumes"): {
        "summary": "List volumes (dmsetup ls)",
        "description": "Every volume with its state, size, dispatch mode, engine and "
        "tables; keys are never shown here.",
    },
    ("post", "/v1/volumes"): {
        "summary": "Create and activate a volume (dmsetup create)",
        "description": "`table` is dmsetup's table text: `<start> <length> <target> <args…>` "
        "per line, in 512-byte sectors. Targets: crypt, linear, zero, error. "
        "`dispatch_mode` is `bio` (every bio alone) or `request` (bios merged in the plug "
        "window); `engine` names a crypto engine model. Instead of `table`, `luks` opens a "
        "LUKS device (cryptsetup open): the table is derived from its header and the "
        "passphrase, which is never stored; a wrong one is 403.",
        "examples": body(
            ("aes-xts-plain64", {"name": "secret", "table": XTS_TABLE}),
            ("LUKS", {"name": "secret", "luks": {"device": "sda2", "passphrase": "correct horse"}}),
            (
                "cbc-essiv, bio mode, engine model",
                {
                    "name": "legacy",
                    "table": ESSIV_TABLE,
                    "dispatch_mode": "bio",
                    "engine": "mv-cesa",
                },
            ),
        ),
    },
    ("get", "/v1/volumes/{name}"): {
        "summary": "Volume info (dmsetup info)",
        "description": "State, open count, event number, tables present, targets (keys "
        "zeroed), dispatch mode, engine, elevator and queue limits.",
    },
    ("patch", "/v1/volumes/{name}"): {
        "summary": "Retune a live volume",
        "description": "Change dispatch mode, engine, elevator, queue limits or the plug "
        "window without suspending; I/O in flight finishes under the old settings.",
        "examples": body(
            ("request mode", {"dispatch_mode": "request"}),
            ("queue limits", {"queue_limits": {"max_sectors_kb": 512, "max_segments": 64}}),
        ),
    },
    ("delete", "/v1/volumes/{name}"): {
        "summary": "Remove a volume (dmsetup remove)",
        "description": "409 while the volume is open or mapped by another volume; "
        "`force=true` first replaces its table with an error target, as dmsetup "
        "remove --force does.",
    },
    ("get", "/v1/volumes/{name}/table"): {
        "summary": "Table text (dmsetup table)",
        "description": "Exactly dmsetup's format. Keys are zeroed unless `show_keys=true` "
        "with the admin token.",
    },
    ("put", "/v1/volumes/{name}/table"): {
        "summary": "Load an inactive table (dmsetup load)",
        "description": 'The table text as the body (`text/plain`) or `{"table": …}`; it '
        "replaces the live table on the next resume.",
        "examples": {
            **body(("grow to 128 MiB", GROWN), media="text/plain"),
            **body(("grow to 128 MiB", {"table": GROWN})),
        },
    },
    ("delete", "/v1/volumes/{name}/table"): {
        "summary": "Drop the inactive table (dmsetup clear)",
        "description": "The live table is untouched.",
    },
    ("post", "/v1/volumes/{name}/suspend"): {
        "summary": "Suspend (dmsetup suspend)",
        "description": "Drains in-flight I/O (unless `noflush`), then holds new I/O until "
        "resume; 503 when draining takes longer than the suspend wait.",
        "examples": body(("drain", {}), ("noflush", {"noflush": True})),
    },
    ("post", "/v1/volumes/{name}/resume"): {
        "summary": "Resume (dmsetup resume)",
        "description": "Swaps in the inactive table if there is one, then releases held I/O.",
    },
    ("post", "/v1/volumes/{name}/message"): {
        "summary": "Target message (dmsetup message)",
        "description": "crypt understands `key wipe` and `key set <hex>`, on a suspended "
        "volume; `sector` selects the target as dmsetup's sector argument does.",
        "examples": body(
            ("wipe the key", {"message": "key wipe", "sector": 0}),
            ("set the key", {"message": f"key set {KEY}", "sector": 0}),
        ),
    },
    ("post", "/v1/volumes/{name}/rename"): {
        "summary": "Rename (dmsetup rename)",
        "description": "409 when the new name is taken.",
        "examples": body(("rename", {"new_name": "vault"})),
    },
    ("post", "/v1/volumes/{name}/move"): {
        "summary": "Hand the volume to another cluster node",
        "description": "The owner drains it, makes it durable, releases its devices and "
        "gives the lease to `node`, which must be live; the answer is the volume as its new "
        "owner serves it. 409 on a single node (no REQCRYPT_NODE_ID).",
        "examples": body(("move", {"node": "node-b"})),
    },
    ("get", "/v1/volumes/{name}/status"): {
        "summary": "Status and I/O statistics (dmsetup status, iostat -x)",
    },
    ("post", "/v1/volumes/{name}/stats/reset"): {
        "summary": "Reset the I/O statistics",
        "description": "Counters and averages start again from zero; in-flight requests "
        "stay counted.",
    },
    ("get", "/v1/volumes/{name}/trace"): {
        "summary": "Trace the block layer (blktrace, blkparse's text)",
        "description": "Streams the volume's block-layer events for `seconds` as `blktrace "
        "-d DEV -o - | blkparse -i -` prints them: Q (bio queued), M/F (back/front merge), "
        "G (new request), P/U (plug opened/flushed), I (into the elevator), D (dispatched), "
        "C (completed, with its status) and `m` lines for the crypt engine calls (calls, "
        "bulk or per-unit, data units, IV mode). Admin token only. A listener holds a "
        "bounded buffer: events a slow reader misses are dropped, never waited for, and "
        "counted in the closing `Skips:` line. At most four traces per volume (503). "
        "`reqcrypt trace NAME --summary` turns it into btt's latencies and merge ratio.",
    },
    ("get", "/v1/volumes/{name}/data"): {
        "summary": "Read bytes (Range)",
        "headers": [RANGE, IF_MATCH, IF_NONE_MATCH, IF_RANGE],
        "responses": {**DATA_RESPONSES, "412": STALE},
    },
    ("head", "/v1/volumes/{name}/data"): {
        "summary": "Size, ETag and Content-Range without the bytes",
        "headers": [RANGE, IF_MATCH, IF_NONE_MATCH, IF_RANGE],
        "responses": {**DATA_RESPONSES, "412": STALE},
    },
    ("put", "/v1/volumes/{name}/data"): {
        "summary": "Write bytes (Content-Range), or a batch (multipart/byteranges)",
        "description": "Durable after a flush, or at once with `fua=true` (REQ_FUA). 416 "
        "outside the volume, 413 over the body limit, 411 without Content-Length. A "
        "`multipart/byteranges` body is a batch: one part per write, each with its own "
        "Content-Range; the whole body is checked before anything is written, then the "
        "parts enter the queue together.",
        "headers": [IF_MATCH],
        "responses": {**DATA_RESPONSES, "412": STALE},
        "examples": {
            "application/octet-stream": {
                "examples": {
                    "4 KiB at offset 0": {
                        "summary": "curl -T file -H 'Content-Range: bytes 0-4095/*'",
                        "value": "<4096 bytes>",
                    }
                }
            },
            "multipart/byteranges": {
                "examples": {
                    "two writes in one request": {
                        "summary": "Content-Type: multipart/byteranges; boundary=b0undary",
                        "value": "--b0undary\r\nContent-Range: bytes 0-4095/*\r\n\r\n"
                        "<4096 bytes>\r\n--b0undary\r\nContent-Range: bytes 65536-65541/*"
                        "\r\n\r\nhello!\r\n--b0undary--\r\n",
                    }
                }
            },
        },
    },
    ("post", "/v1/volumes/{name}/flush"): {
        "summary": "Flush (REQ_PREFLUSH)",
        "responses": {"503": WAIT},
    },
    ("post", "/v1/volumes/{name}/discard"): {
        "summary": "Discard a range",
        "examples": body(("first MiB", {"offset": 0, "length": 1 << 20})),
        "responses": {
            **DATA_RESPONSES,
            "409": "a crypt target of the table has no allow_discards",
            "422": "offset and length must be whole logical blocks of this volume",
        },
    },
    ("post", "/v1/volumes/{name}/write-zeroes"): {
        "summary": "Write zeroes to a range",
        "examples": body(("first MiB", {"offset": 0, "length": 1 << 20})),
        "responses": {
            **DATA_RESPONSES,
            "422": "offset and length must be whole logical blocks of this volume",
        },
    },
    ("get", "/v1/benchmarks"): {
        "summary": "List benchmark runs",
        "description": "Every run with its state and progress, newest first.",
    },
    ("post", "/v1/benchmarks"): {
        "summary": "Start a benchmark",
        "examples": body(
            (
                "bio vs request on a template volume",
                {
                    "volume_template": {
                        "table": "0 131072 crypt aes-cbc-essiv:sha256 "
                        "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f "
                        "0 {dev} 0",
                        "device_size": "64M",
                        "device_model": "sdcard-bbb",
                    },
                    "engine": "omap-aes-am335x",
                    "workload": {"rw": "read", "bs": "512k", "size": "8M"},
                    "sweep": {"dispatch_mode": ["bio", "request"]},
                    "label": "dd 512k",
                },
            ),
            (
                "an existing volume",
                {"volume": "secret", "workload": {"rw": "randwrite", "bs": "4k", "iodepth": 8}},
            ),
            (
                "replay a blkparse trace",
                {
                    "label": "my database's disk",
                    "replay": {
                        "trace": "  8,16   1        1     0.000000000  2233  Q  WS 4096 + 8 "
                        "[postgres]\n  8,16   1        2     0.000004100  2233  Q  WS 4104 + 8 "
                        "[postgres]\n  8,16   0        3     0.000950000  2240  Q   R 81920 + 256 "
                        "[postgres]\n",
                        "cipher": "aes-cbc-plain64",
                        "engine": "omap-aes-am335x",
                        "device_model": "sdcard-bbb",
                    },
                },
            ),
            (
                "replay a fio iolog in closed loop",
                {
                    "replay": {
                        "trace": "fio version 3 iolog\n0 /dev/sdb add\n0 /dev/sdb open\n"
                        "1 /dev/sdb write 0 4096\n1 /dev/sdb write 4096 4096\n"
                        "2 /dev/sdb read 1048576 65536\n3 /dev/sdb close\n",
                        "cipher": "aes-xts-plain64",
                        "engine": "software",
                        "loop": "closed",
                        "iodepth": 8,
                    }
                },
            ),
        ),
    },
    ("get", "/v1/benchmarks/{run_id}"): {"summary": "A benchmark run"},
    ("get", "/v1/benchmarks/{run_id}/results.json"): {"summary": "A run's results as JSON"},
    ("get", "/v1/benchmarks/{run_id}/results.csv"): {
        "summary": "A run's cells as CSV",
        "description": "One row per cell: the swept parameters and the measured or "
        "modelled figures.",
    },
    ("get", "/v1/benchmarks/{run_id}/plot.png"): {"summary": "A run's plot (PNG)"},
    ("get", "/v1/engines"): {
        "summary": "List crypto engine models",
        "description": "Presets (software, mv-cesa, omap-aes-am335x…) and custom models: "
        "capabilities (bulk IV modes, largest call), cost model and live statistics.",
    },
    ("post", "/v1/engines"): {
        "summary": "Add a crypto engine model",
        "description": "A custom engine: which ciphers and IV modes it takes in bulk, how "
        "much per call, and its cost (fixed setup per call plus bytes per second).",
        "examples": body(
            (
                "a bulk-capable engine",
                {
                    "name": "bulk-xts",
                    "description": "takes 1 MiB per call, derives plain64 IVs",
                    "capabilities": {"bulk_ivmodes": ["plain64"], "max_bytes_per_call": 1 << 20},
                    "cost": {
                        "setup_ns": 40000,
                        "encrypt_bytes_per_s": 30e6,
                        "decrypt_bytes_per_s": 30e6,
                    },
                },
            )
        ),
    },
    ("get", "/v1/engines/{name}"): {"summary": "A crypto engine model"},
    ("get", "/v1/device-models"): {
        "summary": "List device timing models",
        "description": "Latency and throughput per direction, and flush cost, that a "
        "device with this model is paced by.",
    },
    ("post", "/v1/device-models"): {
        "summary": "Add a device timing model",
        "description": "Reads and writes cost `latency + bytes / bytes_per_s`; flushes "
        "`flush_ns`. With a write buffer, a write stream from idle takes its first "
        "`write_buffer_bytes` at `write_bytes_per_s` (the burst) and the rest at "
        "`write_sustained_bytes_per_s`; idle time drains the buffer. Both or neither, the "
        "sustained rate at most the burst rate (422 otherwise).",
        "examples": body(
            (
                "an SD card",
                {
                    "name": "slow-card",
                    "read_latency_ns": 300000,
                    "read_bytes_per_s": 18.4e6,
                    "write_latency_ns": 800000,
                    "write_bytes_per_s": 8.9e6,
                    "flush_ns": 2000000,
                },
            ),
            (
                "an SSD with an SLC write cache",
                {
                    "name": "ssd-slc",
                    "read_latency_ns": 80000,
                    "read_bytes_per_s": 500e6,
                    "write_latency_ns": 30000,
                    "write_bytes_per_s": 450e6,
                    "write_buffer_bytes": 8589934592,
                    "write_sustained_bytes_per_s": 120e6,
                    "queue_depth": 32,
                },
            ),
        ),
    },
    ("get", "/v1/device-models/{name}"): {
        "summary": "A device timing model",
        "description": "The model and the time it has charged so far.",
    },
}


XTS_KEY = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"

NAME = "$response.body#/name"
VOLUME_LINKS = {
    "Info": ("get", "/v1/volumes/{name}"),
    "Retune": ("patch", "/v1/volumes/{name}"),
    "Remove": ("delete", "/v1/volumes/{name}"),
    "Table": ("get", "/v1/volumes/{name}/table"),
    "LoadTable": ("put", "/v1/volumes/{name}/table"),
    "ClearTable": ("delete", "/v1/volumes/{name}/table"),
    "Suspend": ("post", "/v1/volumes/{name}/suspend"),
    "Resume": ("post", "/v1/volumes/{name}/resume"),
    "Message": ("post", "/v1/volumes/{name}/message"),
    "Rename": ("post", "/v1/volumes/{name}/rename"),
    "Status": ("get", "/v1/volumes/{name}/status"),
    "ResetStats": ("post", "/v1/volumes/{name}/stats/reset"),
    "Read": ("get", "/v1/volumes/{name}/data"),
    "ReadHeaders": ("head", "/v1/volumes/{name}/data"),
    "Write": ("put", "/v1/volumes/{name}/data"),
    "Flush": ("post", "/v1/volumes/{name}/flush"),
    "Discard": ("post", "/v1/volumes/{name}/discard"),
    "WriteZeroes": ("post", "/v1/volumes/{name}/write-zeroes"),
}
RUN_LINKS = {
    "Run": ("get", "/v1/benchmarks/{run_id}"),
    "ResultsJson": ("get", "/v1/benchmarks/{run_id}/results.json"),
    "ResultsCsv": ("get", "/v1/benchmarks/{run_id}/results.csv"),
    "Plot": ("get", "/v1/benchmarks/{run_id}/plot.png"),
}

LINKS: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {
    # What a created resource lets a client call next (OpenAPI links): the manual's
    # "then", and the walk a stateful test takes from a device to a volume's bytes.
    ("post", "/v1/devices", "201"): {
        "Info": {"target": ("get", "/v1/devices/{name}"), "parameters": {"name": NAME}},
        "Map": {
            "target": ("post", "/v1/volumes"),
            "description": "a one-sector aes-xts-plain64 volume on the new device",
            "requestBody": {
                "table": f"0 1 crypt aes-xts-plain64 {XTS_KEY} 0 {{{NAME}}} 0",
                "engine": "software",
                "queue_limits": None,
            },
        },
    },
    ("post", "/v1/volumes", "201"): {
        **{
            name: {"target": target, "parameters": {"name": NAME}}
            for name, target in VOLUME_LINKS.items()
        },
        "Benchmark": {
            "target": ("post", "/v1/benchmarks"),
            "description": "a small read benchmark of the new volume",
            "requestBody": {
                "volume": NAME,
                "volume_template": None,
                "engine": None,
                "workload": {"rw": "read", "bs": 512, "size": 512},
                "sweep": {},
            },
        },
    },
    ("post", "/v1/benchmarks", "202"): {
        name: {"target": target, "parameters": {"run_id": "$response.body#/id"}}
        for name, target in RUN_LINKS.items()
    },
}


def operation_id(schema: dict[str, Any], method: str, path: str) -> str:
    identifier: str = schema["paths"][path][method]["operationId"]
    return identifier


def links(schema: dict[str, Any]) -> None:
    """Put ``LINKS`` into the responses they follow, naming targets by operationId."""
    for (method, path, status), entries in LINKS.items():
        response = schema["paths"][path][method]["responses"][status]
        response["links"] = {
            name: {
                "operationId": operation_id(schema, *entry["target"]),
                **{key: value for key, value in entry.items() if key != "target"},
            }
            for name, entry in entries.items()
        }


def apply(schema: dict[str, Any], problem: dict[str, Any]) -> None:
    """Merge the manual into ``schema`` (FastAPI's generated document), in place."""
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            entry = OPERATIONS.get((method, path))
            if entry is None:
                continue
            operation["summary"] = entry["summary"]
            text = [entry.get("description", ""), operation.get("description", "")]
            operation["description"] = "\n\n".join(part for part in text if part)
            if "headers" in entry:
                known = {p["name"].lower() for p in operation.get("parameters", [])}
                added = [h for h in entry["headers"] if h["name"].lower() not in known]
                operation["parameters"] = [*operation.get("parameters", []), *added]
            for parameter in operation.get("parameters", []):
                if parameter["name"] == "Content-Range":
                    parameter.update(CONTENT_RANGE)
            if "examples" in entry:
                content = operation.setdefault("requestBody", {}).setdefault("content", {})
                for media, examples in entry["examples"].items():
                    content.setdefault(media, {}).update(examples)
            for status, answer in entry.get("responses", {}).items():
                answer = answer if isinstance(answer, dict) else {"description": answer}
                operation["responses"][status] = {
                    **answer,
                    "content": {"application/problem+json": problem},
                }
    links(schema)
