"""The OpenAI-compatible HTTP backend against a real local HTTP server.

The server is a small deterministic stand-in for vLLM/TGI written here with `http.server`: it speaks
`/v1/models` and `/v1/chat/completions` and misbehaves on cue (503s, 429s, slowness, off-list labels,
prose instead of JSON), so the client's real retry, timeout, validation and fallback code runs.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from pydantic import SecretStr

from pipeline.errors import ModelError
from pipeline.settings import Settings
from workers.model import Item, Prediction
from workers.models.generator import with_generator
from workers.models.http import (
    LLM_CONFIDENCE,
    UNKNOWN,
    UNKNOWN_CONFIDENCE,
    OpenAIChatClassifier,
    banking77_labels,
    match_label,
    parse_reply,
)
from workers.models.prompts import GenerationRequest
from workers.models.registry import generator_from_settings

API_KEY = "sk-test-do-not-log-4242"
MODEL = "stub-llm"


@dataclass
class StubState:
    """What the stub server saw and how it should misbehave."""

    delay_s: float = 0.0
    reject_json_mode: bool = False
    attempts: dict[str, int] = field(default_factory=dict)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _intent_for(message: str) -> str:
    if "bogus" in message:
        return "definitely_not_a_banking_label"
    if "lost" in message or "丢" in message:
        return "Lost or stolen card"  # a sloppy spelling of lost_or_stolen_card the client must accept
    if "declin" in message or "拒绝" in message:
        return "declined_card_payment"
    return "card_arrival"


class StubHandler(BaseHTTPRequestHandler):
    """A deterministic OpenAI-compatible chat server."""

    state: StubState  # set per server

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass

    counted = False  # this request is in StubState.in_flight

    def _leave(self) -> None:
        # Before the reply is written: once the client has it, its next request may reach another handler
        # thread before this one's `finally` runs (a CI run counted 4 in flight against a bound of 3 that way).
        if self.counted:
            self.counted = False
            with self.state.lock:
                self.state.in_flight -= 1

    def _send(self, status: int, payload: object, headers: dict[str, str] | None = None) -> None:
        self._leave()
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        st = self.state
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        auth = self.headers.get("Authorization")
        with st.lock:
            st.bodies.append(body)
            st.auth.append(auth)
            st.in_flight += 1
            st.max_in_flight = max(st.max_in_flight, st.in_flight)
        self.counted = True
        try:
            self._chat(body, auth)
        finally:
            self._leave()

    def _chat(self, body: dict[str, Any], auth: str | None) -> None:
        st = self.state
        if self.path != "/v1/chat/completions":
            return self._send(404, {"error": "not found"})
        if auth != f"Bearer {API_KEY}":
            return self._send(401, {"error": "invalid api key"})
        if st.reject_json_mode and "response_format" in body:
            return self._send(400, {"error": "response_format not supported"})
        system, message = body["messages"][0]["content"], body["messages"][-1]["content"]
        with st.lock:
            n = st.attempts[message] = st.attempts.get(message, 0) + 1
        time.sleep(st.delay_s)
        if "slow" in message:
            time.sleep(1.0)
        if "down" in message:
            return self._send(500, {"error": "overloaded"})
        if "flaky" in message and n <= 2:
            return self._send(503, {"error": "warming up"})
        if "throttle" in message and n == 1:
            return self._send(429, {"error": "rate limited"}, {"Retry-After": "0"})
        if "JSON" not in system:  # a generation prompt: write a reply
            topic = message.split("Topic: ", 1)[1].split("\n", 1)[0] if "Topic: " in message else "your request"
            content = f"Thanks for writing about {topic}. We are on it."
        elif "garbage" in message:
            content = "I think this is about a card, but I cannot say."
        else:
            zh = any("\u4e00" <= ch <= "\u9fff" for ch in message)
            answer = "我们会帮您处理。" if zh else f"Answer for: {message[:30]}"
            content = json.dumps({"intent": _intent_for(message), "answer": answer}, ensure_ascii=False)
            if "fenced" in message:
                content = f"Here you go:\n```json\n{content}\n```"
        choice = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        self._send(200, {"id": "chatcmpl-1", "object": "chat.completion", "model": body.get("model"),
                         "choices": [choice]})


@dataclass
class Stub:
    url: str
    state: StubState


@pytest.fixture
def stub() -> Iterator[Stub]:
    state = StubState()
    handler = type("Handler", (StubHandler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield Stub(f"http://127.0.0.1:{server.server_address[1]}/v1", state)
    finally:
        server.shutdown()
        server.server_close()


class KeywordClassifier:
    """A small real local classifier, the fallback when the LLM cannot answer."""

    name = "kw"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def setup(self, device: str) -> None:
        pass

    def predict(self, batch: Sequence[Item]) -> list[Prediction]:
        self.calls.append([it.text for it in batch])
        return [Prediction("declined_card_payment" if "declin" in it.text else "card_arrival", 0.6,
                           "template answer", self.name) for it in batch]


def _client(stub: Stub, **kw: Any) -> OpenAIChatClassifier:
    kw.setdefault("api_key", SecretStr(API_KEY))
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("timeout_s", 5.0)
    return OpenAIChatClassifier(stub.url, MODEL, banking77_labels(), **kw)


def test_a_batch_is_classified_in_order_with_valid_labels(stub: Stub) -> None:
    client = _client(stub)
    client.setup("cpu")
    batch = [Item("my card was declined"), Item("I lost my card"), Item("where is my card?"),
             Item("我的卡被拒绝了", "zh")]
    preds = client.predict(batch)
    assert [p.intent for p in preds] == ["declined_card_payment", "lost_or_stolen_card", "card_arrival",
                                         "declined_card_payment"]
    assert all(p.confidence == LLM_CONFIDENCE and p.model == f"http:{MODEL}" for p in preds)
    assert preds[0].answer == "Answer for: my card was declined"
    assert preds[3].answer == "我们会帮您处理。"
    body = stub.state.bodies[0]
    assert body["model"] == MODEL and body["temperature"] == 0
    assert body["response_format"] == {"type": "json_object"}
    assert "lost_or_stolen_card" in body["messages"][0]["content"]  # the allowed labels are in the prompt


def test_503s_and_429s_are_retried_until_they_succeed(stub: Stub) -> None:
    client = _client(stub, max_retries=3)
    preds = client.predict([Item("flaky: card declined"), Item("throttle: card declined")])
    assert [p.intent for p in preds] == ["declined_card_payment", "declined_card_payment"]
    assert stub.state.attempts["flaky: card declined"] == 3  # 503, 503, 200
    assert stub.state.attempts["throttle: card declined"] == 2  # 429 (Retry-After: 0), 200


def test_an_off_list_intent_goes_to_the_fallback_classifier(stub: Stub) -> None:
    fallback = KeywordClassifier()
    client = _client(stub, fallback=fallback)
    preds = client.predict([Item("bogus declined thing"), Item("my card was declined")])
    assert preds[0] == Prediction("declined_card_payment", 0.6, "template answer", "kw")
    assert preds[1].model == f"http:{MODEL}"
    assert fallback.calls == [["bogus declined thing"]]  # only the item the LLM got wrong


def test_an_off_list_intent_without_fallback_is_unknown_with_low_confidence(stub: Stub) -> None:
    preds = _client(stub).predict([Item("bogus request")])
    assert preds[0].intent == UNKNOWN and preds[0].confidence == UNKNOWN_CONFIDENCE
    assert preds[0].answer  # the customer still gets a reply


def test_replies_in_prose_or_fences_are_handled(stub: Stub) -> None:
    fallback = KeywordClassifier()
    preds = _client(stub, fallback=fallback).predict([Item("fenced: card declined"), Item("garbage")])
    assert preds[0].intent == "declined_card_payment" and preds[0].model == f"http:{MODEL}"
    assert preds[1].model == "kw"  # no JSON at all: the fallback answers


def test_a_slow_server_times_out_and_falls_back_within_a_bound(stub: Stub) -> None:
    fallback = KeywordClassifier()
    client = _client(stub, fallback=fallback, timeout_s=0.2, max_retries=1)
    t0 = time.perf_counter()
    preds = client.predict([Item("slow: card declined")])
    elapsed = time.perf_counter() - t0
    assert preds[0].model == "kw"
    assert elapsed < 1.5  # 2 attempts x 0.2 s + backoff, not the server's 2 x 1 s


def test_a_server_that_stays_down_raises_without_fallback_and_degrades_with_one(stub: Stub) -> None:
    with pytest.raises(ModelError, match="HTTP 500"):
        _client(stub, max_retries=2).predict([Item("down: card declined")])
    assert stub.state.attempts["down: card declined"] == 3
    preds = _client(stub, max_retries=0, fallback=KeywordClassifier()).predict([Item("down: declined")])
    assert preds[0].model == "kw"


def test_concurrency_is_bounded_and_used(stub: Stub) -> None:
    stub.state.delay_s = 0.2
    # A generous timeout: a request timed out on a loaded box is retried while the server still holds the first
    # (a CI run saw 4 in flight that way), which is the retry's business, not the bound's.
    client = _client(stub, max_concurrency=3, timeout_s=60.0)
    preds = client.predict([Item(f"card declined #{i}") for i in range(9)])
    assert len(preds) == 9 and [p.answer for p in preds] == [f"Answer for: card declined #{i}" for i in range(9)]
    assert 2 <= stub.state.max_in_flight <= 3  # used: concurrent, not one after the other; bounded


def test_the_api_key_is_sent_but_never_shown(stub: Stub, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client = _client(stub)
    client.setup("cpu")
    client.predict([Item("card declined"), Item("bogus"), Item("garbage")])
    assert stub.state.auth[0] == f"Bearer {API_KEY}"
    assert API_KEY not in repr(client)
    wrong = _client(stub, api_key=SecretStr("sk-wrong-key-777"), max_retries=0)
    with pytest.raises(ModelError) as err:
        wrong.predict([Item("card declined")])
    assert "401" in str(err.value) and "sk-wrong-key-777" not in str(err.value)
    assert API_KEY not in caplog.text and "sk-wrong-key-777" not in caplog.text
    settings = Settings(http_base_url=stub.url, http_api_key=API_KEY)
    assert API_KEY not in repr(settings) and API_KEY not in str(settings.model_dump())


def test_a_server_without_json_mode_is_used_without_it(stub: Stub) -> None:
    stub.state.reject_json_mode = True
    client = _client(stub)
    preds = client.predict([Item("card declined")])
    assert preds[0].intent == "declined_card_payment" and not client.json_mode
    assert "response_format" not in stub.state.bodies[-1]


def test_setup_learns_the_served_model_when_none_is_configured(stub: Stub) -> None:
    client = OpenAIChatClassifier(stub.url, None, banking77_labels(), api_key=SecretStr(API_KEY))
    client.setup("cpu")
    assert client.model == MODEL and client.name == f"http:{MODEL}"


def test_as_a_generator_it_words_answers_for_another_classifier(stub: Stub) -> None:
    gen = _client(stub, max_retries=0)
    model = with_generator(KeywordClassifier(), generator=gen)
    preds = model.predict([Item("card declined"), Item("down: declined")])
    assert preds[0].intent == "declined_card_payment"
    assert preds[0].answer == "Thanks for writing about declined card payment. We are on it."
    assert preds[0].model == f"kw+http:{MODEL}"
    assert preds[1].answer == "template answer" and preds[1].model == "kw"  # that request failed
    assert "response_format" not in stub.state.bodies[0]  # free text, not JSON, when generating
    assert gen.generate([GenerationRequest("hi", "en", "card_arrival")]) == [
        "Thanks for writing about card arrival. We are on it."]


def test_settings_select_the_http_generator(stub: Stub) -> None:
    settings = Settings(heavy_generator="http", http_base_url=stub.url, http_model=MODEL,
                        http_api_key=API_KEY, http_timeout_s=3, generator_max_new_tokens=40)
    gen = generator_from_settings(settings)
    assert isinstance(gen, OpenAIChatClassifier) and gen.fallback is None
    assert gen.generate([GenerationRequest("hi", "en", "card_arrival")])[0].startswith("Thanks")
    assert stub.state.bodies[-1]["max_tokens"] == 40
    assert OpenAIChatClassifier.from_settings(settings).labels[0] == "cancel_order"  # the default pack's, sorted


@pytest.mark.parametrize(("content", "want"), [
    ('{"intent": "card_arrival", "answer": "soon"}', {"intent": "card_arrival", "answer": "soon"}),
    ('```json\n{"intent": "x"}\n```', {"intent": "x"}),
    ('Sure! {"intent": "x"} Hope that helps.', {"intent": "x"}),
    ("no json here", None),
    ("[1, 2]", None),
])
def test_parse_reply(content: str, want: dict[str, str] | None) -> None:
    assert parse_reply(content) == want


def test_match_label_is_forgiving_but_only_returns_allowed_labels() -> None:
    labels = banking77_labels()
    assert len(labels) == 77
    assert match_label("Card Arrival", labels) == "card_arrival"
    assert match_label("reverted card payment", labels) == "reverted_card_payment?"
    assert match_label("refund_not_showing_up", labels) == "Refund_not_showing_up"
    assert match_label("phone_repair", labels) is None
    assert match_label(42, labels) is None
