"""Engine and device-model presets (the registry that serves them is ``registry``).

The hardware numbers are ``app.engine.fit`` results rounded to four figures;
``tests/unit/engine/test_fit.py`` refits and fails if they drift. The
``software`` engine is measured, not modelled: its cost model only serves
``predict_workload`` and holds figures measured on a 2-core EPYC: about 4.5 µs per
OpenSSL call whatever the mode, and about 1.6 GB/s on the vectorized bulk path.
"""

from __future__ import annotations

from app.engine.model import (
    DERIVABLE_IV_MODES,
    Capabilities,
    CostModel,
    DeviceModel,
    EngineProfile,
)

__all__ = [
    "AESNI_G9",
    "BRD_G9",
    "DEVICE_MODELS",
    "ENGINES",
    "HDD_WD3000",
    "MV_CESA",
    "NONE_DEVICE",
    "OMAP_AES_AM335X",
    "SDCARD_BBB",
    "SOFTWARE",
]

_MIB = 1024 * 1024

SOFTWARE = EngineProfile(
    name="software",
    description=(
        "This machine's CPU through OpenSSL (pyca/cryptography): every planned call is "
        "really made and its wall time is the engine time."
    ),
    capabilities=Capabilities(
        ciphers=None,
        chainmodes=None,
        bulk_ivmodes=DERIVABLE_IV_MODES,
        keyed_iv=True,
        max_bytes_per_call=4 * _MIB,  # bulk paths stay in cache; OpenSSL XTS stops at 16 MiB
        max_segments_per_call=4096,
        channels=1,  # the GIL serialises the Python around each OpenSSL call
    ),
    cost=CostModel.symmetric(setup_ns=4500.0, bytes_per_s=1.6e9),
    measured=True,
)

OMAP_AES_AM335X = EngineProfile(
    name="omap-aes-am335x",
    description=(
        "TI AM335x (BeagleBone Black) AES engine, omap-aes with the bulk-mode RFC: derives "
        "sector-number IVs itself, up to 1 MiB per call. Fitted to the RFC's dd figures."
    ),
    capabilities=Capabilities(
        ciphers=frozenset({"aes"}),
        chainmodes=frozenset({"ecb", "cbc", "ctr"}),
        bulk_ivmodes=frozenset({"plain", "plain64", "plain64be", "null", "benbi"}),
        keyed_iv=False,
        max_bytes_per_call=1 * _MIB,
        max_segments_per_call=256,
        channels=1,
    ),
    cost=CostModel.symmetric(setup_ns=48_010.0, bytes_per_s=29.39e6),
    cpu_iv_ns=300.0,
)

MV_CESA = EngineProfile(
    name="mv-cesa",
    description=(
        "Marvell CESA on a Kirkwood NAS (mv_cesa): cbc/ecb(aes) without IV derivation, so "
        "every data unit is one call and its ESSIV is computed on the CPU."
    ),
    capabilities=Capabilities(
        ciphers=frozenset({"aes"}),
        chainmodes=frozenset({"ecb", "cbc"}),
        bulk_ivmodes=frozenset(),
        max_bytes_per_call=64 * 1024,
        max_segments_per_call=16,
        channels=1,
    ),
    cost=CostModel.symmetric(setup_ns=29_410.0, bytes_per_s=86.76e6),
    cpu_iv_ns=1500.0,
)

AESNI_G9 = EngineProfile(
    name="aesni-g9",
    description=(
        "AES-NI through Linux's xts(aes) on the Cloudflare blog's G9 server, as stock "
        "dm-crypt calls it: one call per data unit at the cryptsetup benchmark's speeds, "
        "and dm-crypt's queue hop fitted to the blog's stock figure (app.engine.queuefit)."
    ),
    capabilities=Capabilities(
        ciphers=frozenset({"aes"}),
        chainmodes=frozenset({"ecb", "cbc", "xts"}),
        bulk_ivmodes=frozenset(),
        max_bytes_per_call=4096,
        max_segments_per_call=1,
        channels=1,  # the blog does not state how many CPUs served kcryptd
    ),
    cost=CostModel(
        setup_ns=0.0, encrypt_bytes_per_s=1823.1 * _MIB, decrypt_bytes_per_s=1900.3 * _MIB
    ),
    queue_hop_ns=3769.0,
)

ENGINES: dict[str, EngineProfile] = {
    profile.name: profile for profile in (SOFTWARE, OMAP_AES_AM335X, MV_CESA, AESNI_G9)
}

NONE_DEVICE = DeviceModel(
    name="none", description="Instant: a plain file whose time is whatever the host takes."
)
SDCARD_BBB = DeviceModel(
    name="sdcard-bbb",
    description=(
        "microSD card in a BeagleBone Black, direct I/O, with a write buffer: 64 MiB from "
        "idle at the burst rate, then the sustained rate. Fitted to the RFC's dd figures; "
        "writes under 16 KiB pay the SD class's median page merge (docs/engines.md)."
    ),
    read_latency_ns=727_100.0,
    read_bytes_per_s=23.12e6,
    write_latency_ns=727_100.0,
    write_bytes_per_s=13.62e6,
    write_buffer_bytes=64 * _MIB,
    write_sustained_bytes_per_s=9.697e6,
    small_write_bytes=16 * 1024,
    small_write_ns=3_248_400.0,
    queue_depth=1,
)
HDD_WD3000 = DeviceModel(
    name="hdd-wd3000",
    description=(
        "WD3000 SATA disk behind the Kirkwood NAS, sequential I/O; latency is a prior, "
        "bandwidth fitted to 177/178 MB/s raw."
    ),
    read_latency_ns=500_000.0,
    read_bytes_per_s=193.3e6,
    write_latency_ns=500_000.0,
    write_bytes_per_s=194.5e6,
    queue_depth=32,
)

BRD_G9 = DeviceModel(
    name="brd-g9",
    description=(
        "The blog's brd ramdisk: a 4 KiB direct I/O in 1.734 µs (its ram0 fio figure), "
        "8 GB/s beyond 4 KiB (a prior)."
    ),
    read_latency_ns=1221.8,
    read_bytes_per_s=8e9,
    write_latency_ns=1221.8,
    write_bytes_per_s=8e9,
)

DEVICE_MODELS: dict[str, DeviceModel] = {
    model.name: model for model in (NONE_DEVICE, SDCARD_BBB, HDD_WD3000, BRD_G9)
}
