"""One provider of the chain: ``RERANKQ_RERANKER_<FIELD>`` for member 0,
``RERANKQ_RERANKER_<n>_<FIELD>`` for member n."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import msgspec

from kernel.settings.secret import Secret
from kernel.settings.types import CountOrOff, PositiveInt, Seconds, doc


class MemberSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One provider in the chain. Unset fields take built-in defaults, never another member's."""

    prefix: ClassVar[str] = "RERANKER_"

    provider: Annotated[
        str,
        doc(
            "local, embedding, tei, cohere, vllm, http, listwise, rrf, or pkg.module:Class"
            " (required for members 1 and up)"
        ),
    ] = "local"
    model: Annotated[
        str | None,
        doc(
            "model name, or a local path for local and embedding "
            "(unset: the default cross-encoder, the packaged bi-encoder)"
        ),
    ] = None
    url: Annotated[str | None, doc("base URL (tei, vllm, http and listwise require it); no user:password@")] = None
    api_key: Annotated[Secret | None, doc("sent as Authorization: Bearer ...; never logged")] = None
    api_version: Annotated[Literal["v1", "v2"], doc("cohere: the v1 or v2 request shape")] = "v2"
    timeout_s: Annotated[
        Seconds,
        doc("the member's whole budget for one window: every batch, retry and Retry-After wait fits in it"),
    ] = 10.0
    connect_timeout_s: Annotated[Seconds, doc("TCP/TLS connect timeout")] = 2.0
    max_retries: Annotated[CountOrOff, doc("retries of a 429 or 5xx (full-jitter backoff)")] = 2
    batch_size: Annotated[PositiveInt, doc("tei: texts per request")] = 32
    top_n: Annotated[PositiveInt | None, doc("ask for a subset (cohere, http); the rest are omitted")] = None
    max_tokens_per_doc: Annotated[PositiveInt | None, doc("cohere v2: max_tokens_per_doc")] = None
    scale: Annotated[
        Literal["logit", "probability"] | None, doc("how the member's scores are read (default: per provider)")
    ] = None
    device: Annotated[str | None, doc("local, embedding: cpu, cuda, cuda:N, mps (default: RERANKQ_DEVICE)")] = None
    allow_mps: Annotated[
        bool, doc("local, embedding: let the member run on mps (opt-in: MPS never frees its per-shape kernels)")
    ] = False
    send_tenant: Annotated[bool, doc("send the stream's tenant as X-Rerankq-Tenant")] = False
    endpoint: Annotated[
        Literal["rerank", "score"],
        doc("vllm: which API it calls, POST /rerank (Cohere-like) or POST /score (text_1 against text_2)"),
    ] = "rerank"
    truncate_prompt_tokens: Annotated[
        int | None,
        doc("vllm: the tokens each pair is cut to, -1 for the model's limit (unset: an over-long pair is refused)"),
    ] = None
    instruction_field: Annotated[
        str | None,
        doc(
            "the request field a remote member sends the stream's "
            "instruction in (unset: the provider's own; empty: none)"
        ),
    ] = None
    passages_per_prompt: Annotated[
        PositiveInt,
        doc("listwise: the passages one prompt ranks, numbered [1]..[m] (RankGPT's window, 20); at least 2"),
    ] = 20
    prompt_step: Annotated[
        PositiveInt,
        doc(
            "listwise: how far each prompt moves up the list from the bottom, less than"
            " PASSAGES_PER_PROMPT so prompts overlap and the best can rise (RankGPT's step, 10)"
        ),
    ] = 10
    words_per_passage: Annotated[
        PositiveInt, doc("listwise: the words each passage is cut to in the prompt (rank_llm's 300 at 20 a prompt)")
    ] = 300
    # torch runs the transformers model; onnx (ONNX Runtime) and openvino run an export of it,
    # made once beside the model and reused, adopted only if it ranks a parity probe as torch
    # fp32 does; an export that fails or falls short of parity falls back to torch.
    backend: Annotated[
        Literal["auto", "torch", "onnx", "openvino"],
        doc(
            "local: the inference backend; auto measures on a CPU (with PRECISION=auto) and keeps the "
            "fastest at parity beside the model, else openvino on a CPU where installed, else torch"
        ),
    ] = "auto"
    onnx_optimization: Annotated[
        Literal["O1", "O2", "O3"],
        doc("local on onnx: O1 basic, O2 with the transformer fusions, O3 also approximating GELU"),
    ] = "O2"
    quantization: Annotated[
        Literal["none", "int8", "int8-ffn", "int8-weights", "int8-dynamic"],
        doc(
            "local on onnx or openvino: an int8 recipe, kept only at ranking parity: int8 (static), "
            "int8-ffn (static, the feed-forward outputs kept in the higher precision), int8-weights "
            "(openvino, weight-only), int8-dynamic (onnx, activations quantised per batch)"
        ),
    ] = "none"
    calibration: Annotated[
        str | None,
        doc(
            'a JSON-lines file of real windows ({"query": ..., "documents": [...]}), required with '
            "QUANTIZATION=int8 or int8-ffn"
        ),
    ] = None
