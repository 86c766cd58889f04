"""The in-process engine: precision, batch sizing and coalescing of the local and embedding members."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import msgspec

from kernel.settings.types import Milliseconds, PositiveInt, doc


class EngineSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    prefix: ClassVar[str] = ""

    # Each reduced precision is kept only if a ranking-parity probe at load passes.
    precision: Annotated[
        Literal["auto", "fp32", "bf16", "fp16"],
        doc(
            "auto: measured with the backend on a CPU (a member's BACKEND=auto), else bf16 with AMX, "
            "fp16 on CUDA, each kept only at ranking parity"
        ),
    ] = "auto"
    # Static int8 needs calibrating (a minute or more of a first start on a small CPU), and
    # reached parity on neither benchmark model here, so auto measures it only when asked.
    auto_int8: Annotated[
        bool,
        doc(
            "auto also measures static int8 (ONNX Runtime, OpenVINO), calibrated on a member's "
            "CALIBRATION windows or else the shipped collection's; on whenever a member names "
            "CALIBRATION windows; int8 is adopted only at parity"
        ),
    ] = False
    # Batches are sized by padded tokens, not pair count, so short documents share a batch
    # and long ones do not pad it.
    token_budget: Annotated[
        PositiveInt | None, doc("padded tokens per forward batch (default 8192 on a CPU, 65536 on CUDA)")
    ] = None
    coalesce: Annotated[
        bool | None,
        doc(
            "score windows of many streams in one forward pass (default: on "
            "for the GPU worker and the threads pool, off for prefork)"
        ),
    ] = None
    coalesce_delay_ms: Annotated[Milliseconds, doc("how long a coalesced batch waits for more windows")] = 5.0
    coalesce_max_pairs: Annotated[PositiveInt, doc("pairs at which a coalesced batch closes")] = 256
