"""An OpenAI-compatible chat backend (`/v1/chat/completions`): the heavy tier in front of vLLM or TGI.

As a classifier it asks the LLM for `{"intent": <one allowed label>, "answer": <reply>}` and checks the
intent against the label list: an unknown label, an unparsable reply or a server that stays down
after the retries goes to the fallback classifier (a local model), so the LLM can only add quality.
As a generator (`heavy_generator=http`) it words answers for another classifier's intents.

A batch runs concurrently on a bounded thread pool sharing one bounded `httpx.Client`; 429 and 5xx
answers and transport errors are retried with capped exponential backoff (honouring `Retry-After`).
The API key lives in a `SecretStr` and only ever goes into the Authorization header.
"""

from __future__ import annotations

import json
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import SecretStr

from pipeline.errors import ConfigError, ModelError
from workers.model import BuildModel, InferenceModel, Item, Prediction, checked_predict
from workers.models.prompts import GenerationRequest, build_messages, in_language, language_name, tidy

if TYPE_CHECKING:
    from pipeline.contracts.topics import Tier
    from pipeline.settings import Settings

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
UNKNOWN = "unknown"
# An LLM gives no calibrated probability. A valid label gets this constant: above the light tier's
# escalation thresholds, below a perfect score; the feedback loop's labels are what calibrate it.
LLM_CONFIDENCE = 0.9
UNKNOWN_CONFIDENCE = 0.05
_HOLDING_ANSWER = {
    "en": "Thanks for your message. A colleague will look into it and get back to you shortly.",
    "zh": "感谢您的留言，我们的同事会尽快处理并回复您。",
}


def banking77_labels() -> list[str]:
    """The 77 BANKING77 intent labels, as packaged in `workers/data/banking77/categories.json`."""
    path = resources.files("workers").joinpath("data/banking77/categories.json")
    return [str(x) for x in json.loads(path.read_text(encoding="utf-8"))]


def _norm(label: str) -> str:
    return re.sub(r"[\s_\-]+", "_", label.strip().strip("?").lower())


def match_label(intent: object, labels: Sequence[str]) -> str | None:
    """The allowed label `intent` names, forgiving case, spaces for underscores and a trailing '?'."""
    if not isinstance(intent, str):
        return None
    if intent in labels:
        return intent
    wanted = _norm(intent)
    return next((lab for lab in labels if _norm(lab) == wanted), None)


def parse_reply(content: str) -> dict[str, Any] | None:
    """The JSON object in an LLM reply, also inside a ```json fence or prose; None if there is none."""
    text = content.strip()
    candidates = [text]
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start:end + 1])
    for c in candidates:
        try:
            obj = json.loads(c)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


@dataclass(frozen=True, slots=True)
class _Verdict:
    intent: str | None  # an allowed label, or None: unknown label, unparsable reply or failed call
    answer: str
    error: Exception | None = None


class OpenAIChatClassifier:
    """Intent + answer from an OpenAI-compatible chat server; also a `Generator` for `with_generator`."""

    def __init__(self, base_url: str, model: str | None, labels: Sequence[str], *,
                 api_key: SecretStr | None = None, timeout_s: float = 30.0, max_concurrency: int = 8,
                 max_retries: int = 3, backoff_s: float = 0.5, max_backoff_s: float = 8.0,
                 fallback: InferenceModel | None = None, answer_for: Callable[[str, str], str] | None = None,
                 max_tokens: int = 256, generate_max_tokens: int = 64, json_mode: bool = True,
                 confidence: float = LLM_CONFIDENCE, transport: httpx.BaseTransport | None = None,
                 business: str = "a bank's card and payments app") -> None:
        if not labels:
            raise ConfigError("OpenAIChatClassifier needs the allowed intent labels")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.labels = list(labels)
        self.fallback = fallback
        self.answer_for = answer_for
        self.business = business  # who the customer writes to, for the prompt
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_tokens = max_tokens
        self.generate_max_tokens = generate_max_tokens
        self.json_mode = json_mode
        self.confidence = confidence
        self.name = f"http:{model}" if model else "http"
        headers = {"Authorization": f"Bearer {api_key.get_secret_value()}"} if api_key else {}
        # One pool of connections and one of threads, both bounded: a batch of 32 must not open 32
        # sockets to a server that is already queueing.
        self._client = httpx.Client(
            headers=headers, timeout=httpx.Timeout(timeout_s), transport=transport,
            limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency),
        )
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="tierflow-http")
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # the client's headers hold the key: never show them
        return f"OpenAIChatClassifier(base_url={self.base_url!r}, model={self.model!r})"

    @classmethod
    def from_settings(cls, settings: Settings, tier: Tier | None = None,
                      build: BuildModel | None = None) -> OpenAIChatClassifier:
        """The server `http_base_url` names. As a tier's classifier (the registry passes its `build`) the local
        fallback is the multilingual `zh_model`, built by `build` when one is set, and a reply that is missing or in
        the wrong language becomes the intent's answer template; as a generator (`from_settings(settings)`) it needs
        neither."""
        from workers.domains import load_domain

        domain = load_domain(settings.domain)
        fallback: InferenceModel | None = None
        answer_for: Callable[[str, str], str] | None = None
        if build is not None and tier is not None:
            answer_for = domain.answers.answer
            fallback = build(settings.zh_model, settings, tier) if settings.zh_model else None
        if not settings.http.base_url:
            raise ConfigError("the http backend needs TIERFLOW_HTTP_BASE_URL (e.g. http://vllm:8000/v1)")
        return cls(settings.http.base_url, settings.http.model, sorted(domain.answers.known()),
                   api_key=settings.http.api_key, timeout_s=settings.http.timeout_s, fallback=fallback,
                   answer_for=answer_for, generate_max_tokens=settings.generator.max_new_tokens,
                   business=domain.business_of("en"))

    # --- InferenceModel ---
    def setup(self, device: str) -> None:
        """Resolve the served model name if unset, and check the server answers; set up the fallback."""
        if self.fallback is not None:
            self.fallback.setup(device)
        try:
            resp = self._client.get(f"{self.base_url}/models")
            resp.raise_for_status()
            served = [m.get("id") for m in resp.json().get("data", []) if isinstance(m, dict)]
        except (httpx.HTTPError, ValueError, AttributeError) as e:
            served = []
            # Not fatal: the server may still be starting; requests retry and fall back meanwhile.
            log.warning("%s: %s/models not reachable (%s)", self.name, self.base_url, e.__class__.__name__)
        if self.model is None:
            if not served:
                raise ConfigError(f"no model named and none listed by {self.base_url}/models; set http_model")
            self.model = str(served[0])
            self.name = f"http:{self.model}"

    def predict(self, batch: Sequence[Item]) -> list[Prediction]:
        verdicts = list(self._pool.map(self._classify, batch))
        out: list[Prediction | None] = [None] * len(batch)
        redo: list[int] = []
        for i, (item, v) in enumerate(zip(batch, verdicts, strict=True)):
            if v.intent is not None:
                out[i] = Prediction(v.intent, self.confidence, self._answer(v, item.lang), self.name)
            else:
                redo.append(i)
        if redo and self.fallback is not None:
            for i, p in zip(redo, checked_predict(self.fallback, [batch[i] for i in redo]), strict=True):
                out[i] = p
        elif redo:
            failed = [verdicts[i].error for i in redo if verdicts[i].error is not None]
            if failed:  # the server is down and nothing local can answer: let the worker retry / dead-letter
                raise ModelError(f"{self.name}: {len(failed)} of {len(batch)} requests failed: {failed[0]}")
            for i in redo:
                answer = verdicts[i].answer or _HOLDING_ANSWER.get(batch[i].lang, _HOLDING_ANSWER["en"])
                # the server named none of the intents: out of scope as far as it can tell
                out[i] = Prediction(UNKNOWN, UNKNOWN_CONFIDENCE, answer, self.name, oos=1.0)
        return [p for p in out if p is not None]

    # --- Generator ---
    def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        """One reply per request; "" for a request that failed (the caller falls back to its template)."""
        return list(self._pool.map(self._generate_one, requests))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    # --- internals ---
    def _answer(self, v: _Verdict, lang: str) -> str:
        if v.answer and in_language(v.answer, lang):
            return v.answer
        if self.answer_for is not None and v.intent is not None:
            return self.answer_for(v.intent, lang)
        return v.answer or _HOLDING_ANSWER.get(lang, _HOLDING_ANSWER["en"])

    def _classify_messages(self, item: Item) -> list[dict[str, str]]:
        language = language_name(item.lang)
        system = (
            f"You classify customer messages for {self.business} and answer them.\n"
            'Respond with only a JSON object: {"intent": "<label>", "answer": "<reply>"}.\n'
            f"<label> is exactly one of: {', '.join(self.labels)}.\n"
            f"<reply> is a short, helpful reply to the customer in {language}; never invent account details."
        )
        return [{"role": "system", "content": system}, {"role": "user", "content": item.text[:4000]}]

    def _classify(self, item: Item) -> _Verdict:
        try:
            content = self._chat(self._classify_messages(item), self.max_tokens, want_json=True)
        except ModelError as e:
            return _Verdict(None, "", e)
        obj = parse_reply(content)
        if obj is None:
            log.info("%s: reply was not a JSON object; using the fallback", self.name)
            return _Verdict(None, "")
        answer = obj.get("answer")
        answer = tidy(answer) if isinstance(answer, str) else ""
        intent = match_label(obj.get("intent"), self.labels)
        if intent is None:
            log.info("%s: intent outside the label list; using the fallback", self.name)
        return _Verdict(intent, answer)

    def _generate_one(self, req: GenerationRequest) -> str:
        try:
            return tidy(self._chat(build_messages(req), self.generate_max_tokens, want_json=False))
        except ModelError as e:
            log.warning("%s: generation failed (%s)", self.name, e)
            return ""

    def _chat(self, messages: list[dict[str, str]], max_tokens: int, want_json: bool) -> str:
        """POST one chat completion with retries; the reply's text. Raises ModelError when it gives up."""
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": max_tokens,
                                "temperature": 0}
        if want_json and self.json_mode:
            body["response_format"] = {"type": "json_object"}
        url = f"{self.base_url}/chat/completions"
        last = "no attempt"
        for attempt in range(self.max_retries + 1):
            retry_after: float | None = None
            try:
                resp = self._client.post(url, json=body)
            except httpx.TransportError as e:  # connect/read timeouts, refused, reset
                last = f"{e.__class__.__name__}"
            else:
                if resp.status_code == 200:
                    return self._content(resp)
                last = f"HTTP {resp.status_code}"
                if resp.status_code in (400, 422) and "response_format" in body:
                    # Some servers (older TGI) reject json_object mode: drop it for good, the parser copes.
                    log.warning("%s: server refused response_format (%s); going on without it",
                                self.name, last)
                    with self._lock:
                        self.json_mode = False
                    body.pop("response_format")
                    continue
                if resp.status_code not in RETRY_STATUSES:
                    raise ModelError(f"{self.name}: {last}: {resp.text[:200]}")
                retry_after = _retry_after(resp)
            if attempt < self.max_retries:
                time.sleep(self._backoff(attempt, retry_after))
        raise ModelError(f"{self.name}: gave up after {self.max_retries + 1} attempts: {last}")

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Seconds before retry `attempt` + 1: the server's Retry-After, else capped exponential + jitter."""
        if retry_after is not None:
            return min(retry_after, self.max_backoff_s)
        delay = min(self.backoff_s * 2**attempt, self.max_backoff_s)
        # Jitter so a batch's threads, throttled together, do not come back together.
        return delay / 2 + random.uniform(0, delay / 2)

    def _content(self, resp: httpx.Response) -> str:
        try:
            content = resp.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise ModelError(f"{self.name}: malformed chat completion ({e.__class__.__name__})") from e
        return content if isinstance(content, str) else ""


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP date: rare from inference servers, fall back to our own backoff
        return None
