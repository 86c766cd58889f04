"""``rerankq inspect``: the deployment at a glance.

Per device queue and lane, the messages waiting and how long the oldest has waited (the
broker's Redis lists, ``kernel.broker_queues``; on RabbitMQ the counts alone); the workers
alive per device (Celery's remote control, one broadcast of ``rerankq_worker``, kept to the
workers serving this namespace's queues) with the model and precision each process runs (the
cards processes write, ``worker.card``); the circuit breaker of every remote member those
workers run; and the fleet's counters.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import click

from rerankq.common import age, client, console, json_option, print_json

if TYPE_CHECKING:
    from rich.console import JustifyMethod


def device_kind(device: str | None) -> str:
    return "gpu" if (device or "").startswith("cuda") else "cpu"


def queue_view(settings: Any) -> list[dict[str, Any]]:
    from kernel.broker_queues import QueueProbe
    from kernel.redis_clients import broker_client

    devices = {settings.queues.cpu_queue: "cpu", settings.queues.gpu_queue: "gpu", settings.queues.any_queue: "any"}
    if settings.store.broker_kind == "amqp":
        from kernel.amqp_broker import AmqpQueueProbe

        amqp = AmqpQueueProbe(settings.store.broker)
        try:
            counts = amqp.counts(list(devices))
        finally:
            amqp.close()
        # RabbitMQ tells how many wait, not how long the oldest has (that would take it off the queue).
        return [
            {"device": devices[c.queue], "queue": c.queue, "lane": c.lane, "waiting": c.waiting, "oldest_age_s": None}
            for c in counts
        ]
    probe = QueueProbe(broker_client(settings.store.broker))
    try:
        depths = probe.lane_depths(list(devices))
    finally:
        probe.client.close()
    return [
        {
            "device": devices[d.queue],
            "queue": d.queue,
            "lane": d.lane,
            "waiting": d.waiting,
            "oldest_age_s": None if d.oldest_age_s is None else round(d.oldest_age_s, 3),
        }
        for d in depths
    ]


def serves_any(queues: object, ours: set[str]) -> bool:
    """Whether a worker's answer names one of this deployment's queues (the answer is a
    worker's word, checked before it is read)."""
    return isinstance(queues, list) and any(isinstance(q, str) and q in ours for q in queues)


def worker_view(rerank: Any, timeout_s: float) -> list[dict[str, Any]]:
    from worker.card import read_cards
    from worker.remote_control import COMMAND

    replies = rerank.dispatcher.app.control.broadcast(COMMAND, reply=True, timeout=timeout_s) or []
    ours = set(rerank.settings.queues.all_queues())
    workers = []
    for reply in replies:
        for hostname, answer in reply.items():
            if not isinstance(answer, dict) or "error" in answer:
                # Alive, but an older worker without the command: say so rather than hide it.
                answer = {"error": str(answer.get("error") if isinstance(answer, dict) else answer)}
            elif not serves_any(answer.get("queues"), ours):
                # Celery's remote control is one broadcast per broker, not per namespace: this
                # is another deployment's worker on the same Redis or RabbitMQ.
                continue
            cards = read_cards(rerank.store.client, rerank.store.keys.worker_card(hostname))
            workers.append(
                {
                    "hostname": hostname,
                    "kind": device_kind(answer.get("device")),
                    **answer,
                    "processes": sorted(cards, key=lambda c: c.get("pid", 0)),
                }
            )
    return sorted(workers, key=lambda w: (w["kind"], w["hostname"]))


def breaker_view(rerank: Any, workers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    members: dict[str, str] = {}
    for w in workers:
        for card in w.get("processes", []):
            for member in card.get("members", []):
                if member.get("breaker"):
                    members[member["breaker"]] = member["label"]
    now_ms = time.time() * 1000
    out = []
    for breaker_id, label in sorted(members.items()):
        found = rerank.store.client.hgetall(rerank.store.keys.breaker(breaker_id))
        raw = {k.decode(): v.decode() for k, v in found.items()}
        state = raw.get("state", "closed")
        open_for = None
        if state == "open" and raw.get("open_until"):
            open_for = max(0.0, (float(raw["open_until"]) - now_ms) / 1000)
        out.append(
            {
                "member": label,
                "breaker": breaker_id,
                "state": state,
                "failures": int(raw.get("failures", 0)),
                "open_for_s": None if open_for is None else round(open_for, 1),
            }
        )
    return out


#: The counters kept per chain member, shown under the totals.
PER_MEMBER = ("failovers:", "members_not_started:", "provider_calls:", "provider_timeouts:")


def counter_view(counters: dict[str, int]) -> dict[str, Any]:
    hits, misses = counters.get("pair_cache_hits", 0), counters.get("pair_cache_misses", 0)
    return {
        "windows_committed": counters.get("windows_committed", 0),
        "windows_failed": counters.get("windows_failed", 0),
        "windows_poisoned": counters.get("windows_poisoned", 0),
        "windows_cancelled": counters.get("windows_cancelled", 0),
        "windows_redelivered": counters.get("windows_redelivered", 0),
        "failovers": counters.get("failovers", 0),
        "members_not_started": counters.get("members_not_started", 0),
        "pair_cache_hit_rate": round(hits / (hits + misses), 4) if hits + misses else None,
        "all": dict(sorted(counters.items())),
    }


@click.command(
    epilog="""\b
Examples:
  rerankq inspect
  rerankq inspect --json | jq '.queues[] | select(.waiting > 0)'
"""
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    help="seconds to wait for workers to answer",
)
@json_option()
def inspect(timeout: float, as_json: bool) -> int:
    """Queues (waiting and the oldest message's age, per device and lane), workers alive per
    device with their model and precision, each remote member's circuit breaker, and counters
    (windows committed, failed, poisoned, failovers, the pair cache's hit rate)."""
    with client() as rerank:
        view: dict[str, Any] = {"queues": queue_view(rerank.settings)}
        view["workers"] = workers = worker_view(rerank, timeout)
        view["breakers"] = breaker_view(rerank, workers)
        view["counters"] = counter_view(rerank.store.counters())
    if as_json:
        print_json(view)
    else:
        render(view)
    return 0


def render(view: dict[str, Any]) -> None:
    from rich.table import Table

    out = console()
    queues = Table(title="queues", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("device", "left"),
        ("queue", "left"),
        ("lane", "left"),
        ("waiting", "right"),
        ("oldest", "right"),
    )
    for name, justify in columns:
        queues.add_column(name, justify=justify)
    for q in view["queues"]:
        queues.add_row(q["device"], q["queue"], q["lane"], str(q["waiting"]), age(q["oldest_age_s"]))
    out.print(queues)

    alive = {kind: sum(1 for w in view["workers"] if w["kind"] == kind) for kind in ("cpu", "gpu")}
    workers = Table(title=f"workers alive: {alive['cpu']} cpu, {alive['gpu']} gpu", title_justify="left")
    for name in ("device", "worker", "pool", "busy", "processed", "members (model, precision)"):
        workers.add_column(name)
    for w in view["workers"]:
        if "error" in w:
            workers.add_row(w["kind"], w["hostname"], "-", "-", "-", f"[yellow]{w['error']}[/]")
            continue
        members = describe_members(w["processes"])
        workers.add_row(
            w.get("device") or w["kind"],
            w["hostname"],
            f"{w.get('pool')} x{w.get('concurrency')}",
            f"{w.get('active', 0)}/{w.get('concurrency')}",
            str(w.get("processed", 0)),
            members,
        )
    out.print(workers)

    if view["breakers"]:
        breakers = Table(title="breakers", title_justify="left")
        for name in ("member", "state", "failures", "open for"):
            breakers.add_column(name)
        for b in view["breakers"]:
            colour = {"open": "red", "half_open": "yellow"}.get(b["state"], "green")
            breakers.add_row(b["member"], f"[{colour}]{b['state']}[/]", str(b["failures"]), age(b["open_for_s"]))
        out.print(breakers)

    c = view["counters"]
    rate = "-" if c["pair_cache_hit_rate"] is None else f"{c['pair_cache_hit_rate']:.1%}"
    out.print(
        f"counters: {c['windows_committed']} windows committed, {c['windows_failed']} failed, "
        f"{c['windows_poisoned']} poisoned, {c['windows_cancelled']} cancelled, "
        f"{c['windows_redelivered']} re-sent; {c['failovers']} failovers, "
        f"{c['members_not_started']} windows passed a member that never started; "
        f"pair cache hit rate {rate}"
    )
    per_member = {k: v for k, v in c["all"].items() if k.startswith(PER_MEMBER)}
    if per_member:
        out.print("  " + ", ".join(f"{k} {v}" for k, v in per_member.items()))


def describe_members(cards: list[dict[str, Any]]) -> str:
    """One line per distinct member setup across a worker's processes, with how many run it."""
    if not cards:
        return "[yellow]no process has reported its chain yet[/]"
    seen: dict[str, int] = {}
    for card in cards:
        for m in card.get("members", []):
            text = (
                m["label"]
                + (f" {m['model']}" if m.get("model") else "")
                + (f" {m['precision']}" if m.get("precision") else "")
                + ("" if m.get("started") else " (not started)")
            )
            seen[text] = seen.get(text, 0) + 1
    return "\n".join(f"{text} ({n} proc)" if n > 1 else text for text, n in seen.items())
