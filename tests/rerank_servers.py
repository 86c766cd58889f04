"""Real rerank HTTP servers on loopback, one per response shape, that misbehave on demand.

Each server scores a document by a fixed function of its text (``expected_score``), so a
test can check that scores reached Redis against the right candidates. ``mode`` sets how
it answers every request; ``plan`` queues modes for the next requests first. Every request
it sees is recorded (path, headers, JSON body), so a test can count calls.

Like the real servers: TEI answers raw logits when asked for ``raw_scores``; Infinity
serves ``/rerank`` only and answers 404 elsewhere; a 422 echoes the request it refused
(FastAPI's validation errors quote their ``input``). ``vllm`` serves vLLM's rerank
(``/rerank``, ``/v1/rerank``, ``/v2/rerank``) and score (``/score``, ``/v1/score``) APIs,
answers raw logits for ``use_activation: false``, and scores a document under the request's
``instruction`` differently (``expected_score``), as an instruction-aware reranker would.
It is stricter than vLLM, which accepts and ignores a field it does not know: it answers 400
to any field outside vLLM's protocol, so a field vLLM would drop silently fails the test.
``chat`` serves OpenAI's ``POST /v1/chat/completions`` as vLLM, llama.cpp's server and hosted
APIs answer it (``id``, ``object``, ``created``, ``model``, ``choices[0].message.content``,
``usage``), as a listwise ranking model: it reads the passages numbered ``[1]..[m]`` in the
user message and answers their ids by ``expected_score`` (``[2] > [1] > ...``), or, by mode, a
malformed permutation (``CHAT_MODES``). It answers 400 to a body that is no chat request.
With ``chat_model`` set (a function of the request body), ``ok`` answers what it generates.
"""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SHAPES = ("tei", "cohere", "infinity", "scores", "rankings", "vllm", "chat")
MODES = (
    "ok",
    "hang",
    "500",
    "429",
    "malformed",
    "wrong_count",
    "repeated_index",
    "out_of_range",
    "nan",
    "flat",
    "subset",
    "logits",
    "echo_auth",
    "echo_422",
    "echo_400_code",
)
# The paths each shape serves; None: any path.
VLLM_RERANK_PATHS = frozenset({"/rerank", "/v1/rerank", "/v2/rerank"})
VLLM_SCORE_PATHS = frozenset({"/score", "/v1/score"})
CHAT_PATH = "/v1/chat/completions"
PATHS: dict[str, frozenset[str] | None] = {
    "infinity": frozenset({"/rerank"}),
    "vllm": VLLM_RERANK_PATHS | VLLM_SCORE_PATHS,
    "chat": frozenset({CHAT_PATH}),
}
#: How the chat server answers a listwise prompt, besides the modes every shape has.
CHAT_MODES = (
    "ok",  # the ids by expected_score: [2] > [1] > [3]
    "missing",  # the last two ids left out
    "repeated",  # the first two ids named again after themselves
    "out_of_range",  # [0] and [m + 1] first, [99] last
    "prose",  # sentences around the ids, with bare numbers in them ("In 1 line, the 6 passages")
    "think",  # a reasoning block naming other ids before the answer
    "bare",  # ids without brackets: 2 > 1 > 3
    "empty",  # content ""
    "null_content",  # content null (a refusal)
    "no_choices",  # choices []
)
#: The request fields of OpenAI's chat completions this server takes (others are refused).
CHAT_FIELDS = frozenset(
    {"model", "messages", "temperature", "max_tokens", "max_completion_tokens", "stream", "n", "top_p", "seed", "stop"}
)
# vLLM's request fields (vllm/entrypoints/pooling/scoring/protocol.py and base/protocol.py):
# those every scoring request shares, then each API's own.
VLLM_COMMON_FIELDS = frozenset(
    {
        "model",
        "user",
        "truncate_prompt_tokens",
        "padding",
        "truncation_side",
        "request_id",
        "priority",
        "mm_processor_kwargs",
        "cache_salt",
        "use_activation",
        "max_tokens_per_query",
        "max_tokens_per_doc",
        "instruction",
        "chat_template_kwargs",
    }
)
VLLM_RERANK_FIELDS = VLLM_COMMON_FIELDS | {"query", "documents", "top_n"}
VLLM_SCORE_FIELDS = VLLM_COMMON_FIELDS | {"text_1", "text_2"}


def expected_score(document: str, instruction: str | None = None) -> float:
    """A score in (0.05, 0.95) that depends only on the text (and the instruction it was scored under)."""
    text = document if instruction is None else f"{instruction}\n{document}"
    return 0.05 + 0.9 * (zlib.crc32(text.encode()) % 1000) / 1000


def logit(p: float) -> float:
    return math.log(p / (1 - p))


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any


class RerankServer:
    def __init__(self, shape: str) -> None:
        assert shape in SHAPES, shape
        self.shape = shape
        self.mode = "ok"
        self.plan: list[str] = []
        self.retry_after = "1"
        self.hang_s = 3.0
        self.subset_size = 3
        # echo_auth: characters of padding before the echoed Authorization header.
        self.echo_pad = 0
        self.paths = PATHS.get(shape)
        # Scores as another model would: every score depends on the salt too (``expected_score``).
        self.salt: str | None = None
        #: chat: what generates the answer of an ``ok`` request (a model), from the request body.
        self.chat_model: Callable[[Any], str] | None = None
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False  # a hanging handler must not hold up the test's end
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def start(self) -> RerankServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _next_mode(self, seen: Seen) -> str:
        with self._lock:
            self.requests.append(seen)
            return self.plan.pop(0) if self.plan else self.mode

    # -- answers -------------------------------------------------------------

    def answer(self, mode: str, body: Any, path: str = "") -> tuple[int, dict[str, str], bytes]:
        if self.shape == "vllm":
            refused = vllm_refusal(body, path)
            if refused is not None:
                return (
                    400,
                    {},
                    json.dumps({"error": {"message": refused, "type": "BadRequestError", "code": 400}}).encode(),
                )
        if mode == "500":
            return 500, {}, b'{"error": "internal"}'
        if mode == "429":
            return 429, {"Retry-After": self.retry_after}, b'{"error": "model is overloaded"}'
        if mode == "malformed":
            return 200, {}, b'{"results": [{"index": 0, "relevance'
        if mode == "echo_auth":
            return 401, {}, json.dumps({"error": "bad key", "pad": "x" * self.echo_pad, "got": self._auth}).encode()
        if mode == "echo_422":
            detail = [{"type": "value_error", "loc": ["body"], "msg": "Value error, refused", "input": body}]
            return 422, {}, json.dumps({"detail": detail}).encode()
        if self.shape == "chat" and mode != "echo_400_code":
            return chat_answer(mode, body, model=self.chat_model)
        if mode == "echo_400_code":
            query = body.get("query") if isinstance(body, dict) else None
            return (
                400,
                {},
                json.dumps({"error": {"code": "too_many_tokens", "message": f"query {query!r} is too long"}}).encode(),
            )
        documents = body.get("texts") or body.get("documents") or body.get("text_2") or []
        documents = [d if isinstance(d, str) else d.get("text", "") for d in documents]
        n = len(documents)
        instruction = body.get("instruction") if self.shape == "vllm" else self.salt
        pairs = [(i, expected_score(d, instruction)) for i, d in enumerate(documents)]
        if mode == "flat":
            pairs = [(i, 0.5) for i in range(n)]
        elif mode == "nan":
            pairs[0] = (0, float("nan"))
        elif mode == "logits":
            pairs = [(i, s * 12 - 6) for i, s in pairs]
        elif body.get("raw_scores") is True or body.get("use_activation") is False:
            pairs = [(i, logit(s)) for i, s in pairs]  # TEI without its sigmoid, vLLM without its activation
        ranked = sorted(pairs, key=lambda p: -p[1])
        if mode == "subset":
            ranked = ranked[: int(body.get("top_n") or self.subset_size)]
        elif mode == "wrong_count":
            ranked = ranked[:-1]
        elif mode == "repeated_index":
            ranked[-1] = (ranked[0][0], ranked[-1][1])
        elif mode == "out_of_range":
            ranked[-1] = (n, ranked[-1][1])
        return 200, {}, json.dumps(self.render(ranked, documents, mode, path=path, body=body)).encode()

    def render(
        self, ranked: list[tuple[int, float]], documents: list[str], mode: str, *, path: str = "", body: Any = None
    ) -> Any:
        if self.shape == "vllm":
            return vllm_answer(ranked, documents, mode, score_api=path in VLLM_SCORE_PATHS, body=body)
        if self.shape == "tei":
            return [{"index": i, "score": s} for i, s in ranked]
        if self.shape == "cohere":
            return {
                "id": "r-1",
                "results": [{"index": i, "relevance_score": s} for i, s in ranked],
                "meta": {"api_version": {"version": "2"}},
            }
        if self.shape == "infinity":
            return {
                "object": "rerank",
                "model": "m",
                "usage": {"total_tokens": 1},
                "results": [
                    {"index": i, "relevance_score": s, "document": documents[i] if i < len(documents) else ""}
                    for i, s in ranked
                ],
            }
        if self.shape == "rankings":
            return {"rankings": [{"index": i, "score": s} for i, s in ranked]}
        # "scores": input order; a subset or a dropped one shortens the list.
        by_index = dict(ranked)
        keep = sorted(by_index) if mode in ("subset", "wrong_count") else range(len(documents))
        return {"scores": [by_index.get(i, 0.0) for i in keep]}

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, so the client's pool is exercised

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                seen = Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                mode = server._next_mode(seen)
                server._auth = seen.headers.get("authorization", "")
                if mode == "hang":
                    time.sleep(server.hang_s)
                    mode = "ok"
                if server.paths is not None and self.path not in server.paths:
                    status, headers, payload = 404, {}, b'{"detail":"Not Found"}'
                else:
                    status, headers, payload = server.answer(mode, body, self.path)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the client gave up (timeout); nothing to answer

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    _auth = ""


def vllm_refusal(body: Any, path: str) -> str | None:
    """What vLLM's request validation would refuse (and what it would silently drop), or None."""
    if not isinstance(body, dict):
        return "body is not a JSON object"
    score_api = path in VLLM_SCORE_PATHS
    allowed = VLLM_SCORE_FIELDS if score_api else VLLM_RERANK_FIELDS
    unknown = sorted(set(body) - allowed)
    if unknown:
        return f"fields outside vLLM's protocol: {unknown}"
    query, documents = (
        (body.get("text_1"), body.get("text_2")) if score_api else (body.get("query"), body.get("documents"))
    )
    if not isinstance(query, str) or not isinstance(documents, list) or not all(isinstance(d, str) for d in documents):
        return "a text query and a list of text documents are required"
    truncate = body.get("truncate_prompt_tokens")
    if truncate is not None and (not isinstance(truncate, int) or truncate < -1):
        return "truncate_prompt_tokens must be an integer >= -1"
    if not isinstance(body.get("top_n", 0), int) or not isinstance(body.get("instruction", ""), str):
        return "top_n must be an integer and instruction a string"
    if not isinstance(body.get("use_activation", True), bool):
        return "use_activation must be a boolean"
    return None


def vllm_answer(ranked: list[tuple[int, float]], documents: list[str], mode: str, *, score_api: bool, body: Any) -> Any:
    model = body.get("model") or "served-model"
    tokens = sum(len(d.split()) for d in documents)
    if score_api:
        # In input order; a dropped one shortens the list.
        data = [{"index": i, "object": "score", "score": s} for i, s in sorted(ranked)]
        return {
            "id": "score-1",
            "object": "list",
            "created": 1,
            "model": model,
            "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
        }
    # vLLM answers every document for top_n 0 (or absent), the best top_n otherwise.
    top_n = body.get("top_n") or 0
    if top_n and mode == "ok":
        ranked = ranked[:top_n]
    results = [
        {"index": i, "document": {"text": documents[i] if i < len(documents) else ""}, "relevance_score": s}
        for i, s in ranked
    ]
    return {
        "id": "rerank-1",
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": results,
    }


_SHOWN = re.compile(r"^\[(\d+)\] (.*)$", re.MULTILINE)


def chat_refusal(body: Any) -> str | None:
    """What a chat-completions server would refuse, or None."""
    if not isinstance(body, dict):
        return "body is not a JSON object"
    unknown = sorted(set(body) - CHAT_FIELDS)
    if unknown:
        return f"fields outside the chat completions API: {unknown}"
    chat = body.get("messages")
    if not isinstance(chat, list) or not chat:
        return "messages must be a non-empty list"
    for message in chat:
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            return "each message is {role, content}"
        if message["role"] not in ("system", "user", "assistant") or not isinstance(message["content"], str):
            return "a message's role is system, user or assistant and its content text"
    if body.get("stream", False) is not False or not isinstance(body.get("max_tokens", 1), int):
        return "stream must be false and max_tokens an integer"
    return None


def shown_passages(body: Any) -> list[str]:
    """The passages a listwise prompt shows, in the order of their ids [1]..[m]."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return [text for _, text in _SHOWN.findall(user)]


def judged_ids(passages: list[str]) -> list[int]:
    """The 1-based ids of the passages by expected_score, best first (ties: the lower id)."""
    return sorted(range(1, len(passages) + 1), key=lambda i: (-expected_score(passages[i - 1]), i))


def chat_completion(content: str | None, *, model: str, prompt_tokens: int, choices: bool = True) -> dict[str, Any]:
    """OpenAI's chat completion object, as vLLM and llama.cpp's server answer it."""
    completion_tokens = len((content or "").split())
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ]
        if choices
        else [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def chat_answer(
    mode: str, body: Any, *, model: Callable[[Any], str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    refused = chat_refusal(body)
    if refused is not None:
        return 400, {}, json.dumps({"error": {"message": refused, "type": "BadRequestError", "code": 400}}).encode()
    passages = shown_passages(body)
    m, ids = len(passages), judged_ids(passages)
    ranked = " > ".join(f"[{i}]" for i in ids)
    content: str | None
    if model is not None and mode == "ok":
        content = model(body)
    elif mode == "missing":
        content = " > ".join(f"[{i}]" for i in ids[:-2])
    elif mode == "repeated":
        content = " > ".join(f"[{i}]" for i in [*ids[:2], *ids[:2], *ids[2:]])
    elif mode == "out_of_range":
        content = " > ".join(f"[{i}]" for i in [0, m + 1, *ids, 99])
    elif mode == "prose":
        content = f"Sure! In 1 line, the {m} passages ranked: {ranked}.\nPassage [{ids[0]}] answers it best."
    elif mode == "think":
        content = f"<think>\nPassage [{ids[-1]}] looks best, or [{m}]?\n</think>\n\n{ranked}"
    elif mode == "bare":
        content = " > ".join(str(i) for i in ids)
    elif mode == "empty":
        content = ""
    elif mode == "null_content":
        content = None
    else:
        content = ranked
    tokens = sum(len(m["content"].split()) for m in body["messages"])
    answer = chat_completion(
        content, model=body.get("model") or "served-model", prompt_tokens=tokens, choices=mode != "no_choices"
    )
    return 200, {}, json.dumps(answer).encode()


def closed_port_url() -> str:
    """A loopback URL nothing listens on: connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
