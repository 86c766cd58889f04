"""Which precision a device runs at, and the fixed probe that checks it keeps fp32's ranking."""

from __future__ import annotations

from typing import Any

from worker.engine.backend import BackendUnavailable

# torch's dynamic int8 (the linear layers) was evaluated and is not offered: on MiniLM-L6
# it reached about 1.3-1.6x fp32 here but Spearman 0.4-0.99 per window against fp32 (BERT's
# outlier activations do not survive per-tensor int8), short of the 0.99 bar.
# ops/bench/scoring.py still measures it. Static int8 is offered on the exported backends,
# held to the same bar at load (BackendChoice.quantization).
PRECISIONS = ("fp32", "bf16", "fp16")


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_native_bf16() -> bool:
    """AMX or AVX512-BF16: without them torch emulates bf16 and runs slower than fp32."""
    return bool(cpu_flags() & {"amx_bf16", "avx512_bf16"})


def cpu_has_fast_bf16() -> bool:
    """AMX: the bf16 matrix units. AVX512-BF16 alone is native but not faster: on the
    2-core development VM (avx512_bf16, no AMX) a 2048-square bf16 matmul ran at 0.6x the
    fp32 one, and the engine in bf16 at 0.6x fp32 (torch and OpenVINO alike)."""
    return "amx_bf16" in cpu_flags()


def resolve_precision(requested: str, device: str) -> str:
    """The precision to try: ``auto`` means the fastest native one for this device."""
    if requested != "auto":
        if requested not in PRECISIONS:
            raise ValueError(f"unknown precision {requested!r}; one of auto, {', '.join(PRECISIONS)}")
        if requested == "fp16" and device.startswith("cpu"):
            raise ValueError("fp16 has no fast CPU kernels; use bf16 or fp32")
        return requested
    if device.startswith("cuda"):
        return "fp16"
    if device.startswith("cpu") and cpu_has_fast_bf16():
        return "bf16"
    return "fp32"


def exported_precisions(choice: Any, requested: str, device: str) -> list[str]:
    """The precisions to try, in order, for an exported backend (for an int8 export, the one its
    unquantised rest runs at); each is held to parity.

    ONNX Runtime runs the export in fp32 (its CPU kernels have no fast bf16 path); OpenVINO
    runs it in bf16 where the CPU has AMX (``auto`` falls back to fp32 below parity).
    """
    resolved = resolve_precision(requested, device)
    if choice.name == "onnx":
        if requested not in ("auto", "fp32"):
            raise BackendUnavailable(
                f"the onnx backend runs fp32 (or int8 by quantization), not {requested}; "
                "set RERANKQ_PRECISION=auto or fp32"
            )
        return ["fp32"]
    if requested == "auto":
        return ["bf16", "fp32"] if resolved == "bf16" else ["fp32"]
    return [resolved]


# A fixed probe: one query over documents of varied length and relevance, scored at
# load in fp32 and in the candidate precision. Synthetic, but a precision that cannot
# keep these in order will not keep a real window in order either.
_PROBE_QUERY = "how do i recover from a payment gateway outage after a tls certificate expired"
_PROBE_DOCUMENTS = (
    "Payment gateway outage runbook: renew the TLS certificate, restart the gateway pods, then retry failed payments.",
    "The TLS certificate on the load balancer expired at midnight and checkout returned 502 errors for an hour.",
    "Coffee machine on the third floor is out of order.",
    "Recovery steps after a gateway outage: drain the region, fail over DNS, replay the payment queue.",
    "Quarterly invoice from the CDN vendor, due at the end of March.",
    "Certificates are renewed automatically thirty days before expiry; a failed renewal pages the on-call engineer.",
    "The mobile release was delayed by a design review of colour and spacing tokens.",
    "Database migration plan for the search index, with a rollback if replication lags.",
    "Checkout errors spiked during the outage; the payment provider confirmed a partial failure in one region.",
    "Leave requests must be filed two weeks in advance.",
    "Email bounces rose after the DNS change; the SPF record was missing the new relay.",
    "Restarting the payment gateway without renewing the certificate only reproduces the outage.",
    "Tracing dashboard shows retries to the payment service doubling latency during failover.",
    "Laptop refresh schedule for the support team.",
    "A post-mortem of the certificate expiry: monitoring checked the wrong endpoint, so no alert fired.",
    "Cache purge instructions for the CDN after a bad deploy.",
    " ".join(["The gateway status page lists every incident with its cause and recovery time."] * 6),
    " ".join(["Vendor contract terms and renewal dates for all third-party services."] * 8),
)


def probe_pairs() -> list[tuple[str, str]]:
    return [(_PROBE_QUERY, d) for d in _PROBE_DOCUMENTS]


#: An instruction for the probe, so the path a stream's instruction takes is held to the library too.
PROBE_INSTRUCTION = "Given an incident report, find the runbook steps that resolve it"


def library_probe() -> list[tuple[list[tuple[str, str]], str | None]]:
    """The windows an engine is held to sentence-transformers on at load: the probe with the
    model's default prompt, and its first eight documents again with an instruction (a large
    causal reranker on a CPU pays for every probe pair at start)."""
    return [(probe_pairs(), None), (probe_pairs()[:8], PROBE_INSTRUCTION)]
