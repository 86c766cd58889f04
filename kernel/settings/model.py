"""The whole configuration: one struct of sections, each a small struct of its own module."""

from __future__ import annotations

import typing

import msgspec

from kernel.settings.breaker import BreakerSettings
from kernel.settings.budget import BudgetSettings
from kernel.settings.chain import ChainSettings
from kernel.settings.engine import EngineSettings
from kernel.settings.exporter import ExporterSettings
from kernel.settings.fairness import FairnessSettings
from kernel.settings.gateway import GatewaySettings
from kernel.settings.metrics import MetricsSettings
from kernel.settings.queues import QueueSettings
from kernel.settings.store import StoreSettings
from kernel.settings.streams import StreamSettings
from kernel.settings.worker import WorkerSettings


class Settings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Every setting, by section; built by ``load_settings`` at the edge and passed in."""

    store: StoreSettings = msgspec.field(default_factory=StoreSettings)
    queues: QueueSettings = msgspec.field(default_factory=QueueSettings)
    streams: StreamSettings = msgspec.field(default_factory=StreamSettings)
    fairness: FairnessSettings = msgspec.field(default_factory=FairnessSettings)
    budget: BudgetSettings = msgspec.field(default_factory=BudgetSettings)
    worker: WorkerSettings = msgspec.field(default_factory=WorkerSettings)
    engine: EngineSettings = msgspec.field(default_factory=EngineSettings)
    chain: ChainSettings = msgspec.field(default_factory=ChainSettings)
    breaker: BreakerSettings = msgspec.field(default_factory=BreakerSettings)
    metrics: MetricsSettings = msgspec.field(default_factory=MetricsSettings)
    exporter: ExporterSettings = msgspec.field(default_factory=ExporterSettings)
    gateway: GatewaySettings = msgspec.field(default_factory=GatewaySettings)


#: Section name -> its struct, in the order the reference prints them.
SECTIONS: dict[str, type[msgspec.Struct]] = {
    name: typing.get_type_hints(Settings)[name] for name in Settings.__struct_fields__
}
