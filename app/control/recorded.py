"""The read model of volumes as SQL records them: what a cluster node can tell of a
volume another node serves without asking that node (a frozen one cannot stall it).

Every lifecycle change is committed to SQL before its owner applies it (ADR 0003), so
the record says what the owner's ``Volume.info`` says, modelled queue depth included.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.blk.tuning import CryptSplit
from app.control.catalog import DeviceCatalog
from app.db.records import Records, StoredVolume
from app.dm.volume import QueueSettings, VolumeInfo, queue_depth, wipe_replaced_keys
from app.engine.registry import EngineRegistry
from app.vocab import SECTOR_SIZE


@dataclass(frozen=True, slots=True)
class RecordedVolume:
    """A volume as SQL records it: what a node that does not serve it can tell."""

    info: VolumeInfo
    targets: tuple[tuple[int, int, str, str], ...]
    """(start, length, target type, parameters with keys hidden) of each live line."""
    maps: tuple[frozenset[str], ...]
    """``DeviceRef.key`` of everything each of its tables (live, inactive) maps."""
    nbd_export: bool


@dataclass
class RecordedVolumes:
    records: Records
    catalog: DeviceCatalog
    engines: EngineRegistry
    plug_window_us: int = field(kw_only=True)
    crypt_split: CryptSplit = field(default=(None, None), kw_only=True)

    def all(self) -> list[RecordedVolume]:
        """Every volume of the cluster as SQL records it, by name; keys wiped once read."""
        with self.records.transaction() as records:
            stored = records.volumes()
        recorded = []
        for volume in sorted(stored, key=lambda volume: volume.name):
            tables = [t for t in (volume.live, volume.inactive) if t is not None]
            recorded.append(
                RecordedVolume(
                    self.info(volume),
                    tuple(
                        (
                            line.start,
                            line.length,
                            line.target_type,
                            line.target.format(show_keys=False),
                        )
                        for line in (volume.live.lines if volume.live else ())
                    ),
                    tuple(frozenset(table.devices()) for table in tables),
                    volume.nbd_export,
                )
            )
            for table in tables:
                wipe_replaced_keys(table)
        return recorded

    def info(self, stored: StoredVolume) -> VolumeInfo:
        """What ``Volume.info`` would say of the volume ``stored`` records."""
        tuning = stored.tuning
        block_size = stored.live.logical_block_size if stored.live else SECTOR_SIZE
        models = [
            self.catalog.model_of(ref.name)
            for ref in (stored.live.device_refs() if stored.live else ())
            if ref.kind == "device"
        ]
        known = {model.name: model.queue_depth for model in self.engines.device_models()}
        queue = QueueSettings(
            dispatch_mode=tuning.dispatch_mode,
            elevator=tuning.elevator,
            limits=tuning.limits_for(block_size),
            plug_window_us=tuning.plug_window(self.plug_window_us),
            queue_depth=queue_depth(known[model] for model in models if model in known),
        )
        return VolumeInfo.of(
            stored.name,
            stored.uuid,
            stored.state,
            stored.event_nr,
            queue=queue,
            engine=stored.engine,
            live=stored.live,
            inactive=stored.inactive,
            crypt_split=tuning.crypt_split(self.crypt_split),
        )
