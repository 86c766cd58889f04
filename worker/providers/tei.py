"""Hugging Face Text Embeddings Inference: ``POST {url}/rerank``.

TEI answers a bare JSON array of ``{"index", "score"}`` sorted by score, not in input
order (one reference stage misread this shape and silently fell back). TEI caps the texts
per request (``--max-client-batch-size``, 32 by default) and answers 429 when its permit
pool is full, so a window is sent in batches of ``batch_size`` and 429 is retried. TEI's
rerank API has no instruction: a window this member serves records that it was not used.
"""

from __future__ import annotations

from kernel.settings import MemberSettings, Settings
from worker.control_strings import REMOTE, RULE
from worker.providers.base import Remedy, Scale, ScoreRequest, cache_identity
from worker.providers.remote import (
    RemoteClient,
    check_base_url,
    check_member_numbers,
    check_subset_size,
    refuse_instruction_field,
    scores_from_pairs,
)

# Texts longer than the model's limit are cut by TEI rather than refused.
TRUNCATE = True


class TeiProvider:
    kind = "tei"
    remote = True
    accepts_instruction = False

    @staticmethod
    def check_config(member: MemberSettings) -> str:
        """The base URL; MemberConfigError naming the field for what can be wrong before anything is called."""
        base = check_base_url(member.url)
        assert base is not None
        refuse_instruction_field(member, "TEI's rerank API")
        check_member_numbers(member)
        return base

    def __init__(self, member: MemberSettings, settings: Settings) -> None:
        base = self.check_config(member)
        self.endpoint = base if base.endswith("/rerank") else base + "/rerank"
        # TEI applies the model's sigmoid unless asked for raw scores; declaring the scale
        # "logit" asks for the raw ones and lets scoring apply the sigmoid itself.
        self.scale: Scale | None = member.scale or "probability"
        self._raw_scores = self.scale == "logit"
        self.batch_size = member.batch_size
        # TEI scores each pair on its own (and batches across requests itself), so the
        # client-side batch size changes no score and stays out of the identity. The model
        # is the server's; MODEL is named anyway, as the operator's label for what it serves.
        self.cache_identity = cache_identity(
            self.kind,
            url=self.endpoint,
            model=member.model,
            scale=self.scale,
            raw_scores=self._raw_scores,
            truncate=TRUNCATE,
            control_strings=RULE,
        )
        self.client = RemoteClient(
            member, not_found=Remedy("url", "check {variable}: TEI serves POST /rerank at the root of its base URL")
        )

    def score(self, request: ScoreRequest, *, deadline: float) -> list[float | None]:
        # TEI tokenises the pair with the model's tokenizer, which reads "[SEP]" or "</s>" in the
        # text as the token: its control strings are broken here (``worker.control_strings``).
        query, documents = REMOTE.neutralise(request.query), REMOTE.neutralise_all(request.documents)
        headers = self.client.headers(request)
        scores: list[float | None] = []
        for start in range(0, len(documents), self.batch_size):
            batch = documents[start : start + self.batch_size]
            payload = {"query": query, "texts": batch, "raw_scores": self._raw_scores, "truncate": TRUNCATE}
            answer = self.client.post_json(self.endpoint, payload, headers, deadline=deadline)
            batch_scores = scores_from_pairs(answer, len(batch), score_field="score")
            check_subset_size(batch_scores, len(batch), None)
            scores.extend(batch_scores)
        return scores

    def close(self) -> None:
        self.client.close()
