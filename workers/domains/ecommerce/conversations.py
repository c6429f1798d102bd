"""Maple Market's multi-turn evaluation set: customer conversations in English and Chinese, with their generator.

Each scenario below is a short conversation a customer of the shop might have: per turn, the intent the shop should
answer at that point, whether the turn only makes sense after the earlier ones (`follow_up`: "order 58213", "要多久？"),
and a few wordings of it. `{order}`, `{order2}`, `{product}` and `{amount}` are filled in per conversation and become
the turn's slots (`order_id`, `product`, `amount`), each a substring of the turn's text. The build is deterministic
(`random.Random(SEED)`); `python -m workers.domains.ecommerce.conversations` writes `conversations.jsonl` beside this
file. The Chinese scenarios were written in Chinese, not translated from the English ones.

tierflow's authors wrote this script and the set it writes for the project, under the project's licence. The set
is for evaluation only and is never used for training.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import NamedTuple, TypedDict

SEED = 20241130
PER_LANG = 80
CLOSE_P = 0.2  # chance that a conversation shorter than 5 turns ends with a thanks-and-bye (chitchat) turn
OUT = Path(__file__).with_name("conversations.jsonl")
SLOTS = (("order", "order_id"), ("order2", "order_id"), ("product", "product"), ("amount", "amount"))


class Turn(NamedTuple):
    intent: str
    follow_up: bool
    texts: tuple[str, ...]  # alternative wordings; a conversation uses one


class Scenario(NamedTuple):
    products: tuple[str, ...]
    turns: tuple[Turn, ...]


class TurnRecord(TypedDict):
    text: str
    intent: str
    slots: dict[str, str]
    follow_up: bool


class Conversation(TypedDict):
    id: str
    lang: str
    turns: list[TurnRecord]


def ask(intent: str, *texts: str) -> Turn:
    """A turn that states its own intent (including a switch of topic)."""
    return Turn(intent, False, texts)


def then(intent: str, *texts: str) -> Turn:
    """A turn whose intent only follows from the earlier turns."""
    return Turn(intent, True, texts)


def s(*turns: Turn, products: tuple[str, ...] = ()) -> Scenario:
    return Scenario(products, turns)


# ---------------------------------------------------------------------------------------------------------------------
# English

SCREENS_EN = ("phone", "laptop", "tablet", "smartwatch")
AUDIO_EN = ("headphones", "earbuds", "speaker")
HOME_EN = ("kettle", "blender", "toaster", "hair dryer", "rice cooker")
EXTRAS_EN = ("charger", "mouse", "power bank", "USB cable")
ANY_EN = SCREENS_EN + AUDIO_EN + HOME_EN + ("monitor", "keyboard")
ORDER_EN = ("order {order}", "it's {order}", "the order number is {order}", "{order}", "order no. {order}",
            "sure, {order}", "here you go: {order}")
CLOSE_EN = ("thanks, bye", "great, thank you!", "ok cheers", "that's all, thanks", "perfect, thanks for the help",
            "got it, thanks. bye!")

EN = (
    s(ask("warranty_repair", "my {product} stopped working after just a few months",
          "the {product} I got from you won't turn on anymore, is that covered?",
          "hi, my {product} died after four months. warranty?"),
      then("warranty_repair", *ORDER_EN),
      then("warranty_repair", "and if I lost the invoice?", "what if I can't find the receipt?",
           "problem is I threw the paper invoice away"),
      products=SCREENS_EN + AUDIO_EN),
    s(ask("warranty_repair", "I dropped my {product} and the screen cracked, can you repair it?",
          "cracked the screen on my {product}, does the warranty cover that?"),
      then("warranty_repair", "how much would that cost?", "so I have to pay for it?",
           "even though it's under a year old?"),
      products=SCREENS_EN),
    s(ask("warranty_repair", "my {product} makes a rattling noise now, can you fix it?",
          "the {product} from you is faulty, how do I get it repaired?"),
      then("warranty_repair", "do I have to post it myself?", "ok, how do I send it in?", "can someone pick it up?"),
      then("warranty_repair", "it was order {order}", "here's the order: {order}", "{order} is the order number"),
      products=("speaker", *HOME_EN)),
    s(ask("complaint", "you repaired my {product} and it broke again after a week",
          "the {product} came back from repair with the same fault, I'm not happy"),
      then("complaint", *ORDER_EN),
      then("complaint", "I'm not paying for this again", "what are you going to do about it?"),
      ask("get_refund", "I'd rather just have a refund at this point", "honestly, just give me my money back"),
      products=SCREENS_EN),
    s(ask("check_refund_policy", "can I return the {product} if I haven't opened the box?",
          "I changed my mind about the {product}, can I still send it back?",
          "what's your returns policy? the {product} isn't what I expected"),
      then("get_refund", "how long until I get my money?", "and when would I get the money back?",
           "ok, how quickly is the refund done?"),
      products=ANY_EN),
    s(ask("track_refund", "I sent the {product} back last week and still no refund",
          "my refund for the {product} hasn't shown up yet", "where's my refund? you got the {product} back days ago"),
      then("track_refund", *ORDER_EN),
      then("track_refund", "I paid {amount} by card", "it was {amount}, paid with my credit card",
           "the amount was {amount}"),
      products=ANY_EN),
    s(ask("get_refund", "the {product} arrived broken, I want a refund",
          "I'd like my money back for the {product}, it came damaged"),
      then("get_refund", *ORDER_EN),
      ask("complaint", "the courier was rude as well, I want to complain about him",
          "and I want to make a complaint about the delivery guy"),
      then("get_refund", "so when do I get my money?", "how long will the refund take?"),
      products=HOME_EN),
    s(ask("track_refund", "my refund still hasn't arrived and it's been two weeks",
          "still waiting on a refund from ages ago"),
      then("track_refund", "order {order}, I paid {amount}", "it's order {order}, {amount}"),
      then("complaint", "this is the second time I've had to chase you!", "this is the second time!",
           "seriously, I asked about this last week too"),
      ask("contact_human_agent", "just put me through to a real person", "I want to talk to a human now"),
      then("contact_human_agent", "how long is the wait?", "still nobody here after ten minutes")),
    s(ask("cancel_order", "I want to cancel my order", "please cancel the order I placed yesterday",
          "how do I cancel something I just ordered?"),
      then("cancel_order", *ORDER_EN),
      then("check_cancellation_fee", "will I be charged anything for that?", "is there a fee?",
           "does that cost me anything?")),
    s(ask("cancel_order", "can I still cancel order {order}? it says shipped",
          "order {order} has already shipped but I don't want it anymore, can I cancel?"),
      then("check_cancellation_fee", "so what would it cost me?", "do I lose any money then?",
           "and do I pay for the return shipping?")),
    s(ask("check_cancellation_fee", "does it cost anything to cancel an order?", "is cancelling free?"),
      then("cancel_order", "ok, do it then, order {order}", "great, then go ahead with {order}")),
    s(ask("change_order", "I need to change the size on my order", "can I swap the colour of something I just ordered?",
          "I ordered the wrong model, can I change it?"),
      then("change_order", *ORDER_EN),
      then("change_order", "I paid about an hour ago, is that too late?", "I only paid 20 minutes ago",
           "what if it's already packed?")),
    s(ask("change_order", "can I add a {product} to order {order}?",
          "I forgot a {product}, can it go in order {order}?"),
      then("change_order", "and if it's already packed?", "is it too late if I paid this morning?"),
      products=EXTRAS_EN),
    s(ask("change_order", "can I change the quantity on order {order}?",
          "I need three instead of one on order {order}"),
      then("change_order", "it was paid this morning", "I paid yesterday evening"),
      ask("cancel_order", "then I'll just cancel it and order again", "ok, how do I cancel it instead?")),
    s(ask("track_order", "where is my order? it's been a week", "my parcel still hasn't turned up",
          "any news on my delivery?"),
      then("track_order", *ORDER_EN),
      ask("change_shipping_address", "can you send it to my office instead?",
          "actually, can it go to my work address?", "I won't be home, can you deliver it somewhere else?"),
      then("track_order", "will that delay it?", "and when will it get there then?")),
    s(ask("track_order", "has order {order} shipped yet?", "what's the status of {order}?"),
      ask("change_shipping_address", "thanks. also, how do I change my address?",
          "ok. one more thing, I need to update the delivery address")),
    s(ask("change_shipping_address", "I put the wrong address on my order",
          "typo in my delivery address, can you fix it?"),
      then("change_shipping_address", *ORDER_EN),
      then("change_shipping_address", "what if it's already shipped?", "and if it's on its way already?")),
    s(ask("chitchat", "hi there, quick question", "hello, is this the help chat?", "hey, anyone around?"),
      ask("track_order", "my order hasn't shown up yet", "I'm waiting for a parcel that's late"),
      then("track_order", *ORDER_EN)),
    s(ask("track_order", "I placed two orders, is {order} on its way?",
          "can you check order {order} for me? I have two open"),
      then("track_order", "what about the other one?", "and the other order?"),
      then("track_order", "{order2}", "it's {order2}")),
    s(ask("track_order", "order {order} was supposed to arrive on Monday",
          "where is {order}? it should be here by now"),
      ask("track_order", "the tracking hasn't moved in three days", "the tracking page shows nothing new since Friday"),
      ask("complaint", "honestly this is the worst delivery I've had, I want to complain",
          "I'm really unhappy with this, I want to file a complaint"),
      then("complaint", "how long until someone gets back to me?", "who will reply and when?")),
    s(ask("complaint", "the courier left my parcel in the rain and the {product} got soaked",
          "your driver threw the box over the fence and the {product} got damaged"),
      then("complaint", *ORDER_EN),
      then("complaint", "this is the second time this has happened!", "same thing happened last month!"),
      ask("contact_human_agent", "I want to speak to a manager", "get me a real person please"),
      products=ANY_EN),
    s(ask("delivery_period", "how long does delivery to Chengdu take?", "how many days to ship to Toronto?",
          "when would an order to Guangzhou arrive?"),
      then("delivery_options", "is there anything faster?", "can I get it quicker?", "and if I'm in a hurry?"),
      then("delivery_options", "how much extra is that?", "what does that cost?", "and the price for that?")),
    s(ask("delivery_period", "if I order today when will it get here?", "how long does standard shipping take?"),
      then("delivery_period", "I'm in a pretty remote village", "it's a small island, does that change anything?")),
    s(ask("delivery_options", "can I collect my order from a pickup point?",
          "do you have pickup points or only home delivery?"),
      then("delivery_options", "and is it free?", "does that cost anything?")),
    s(ask("delivery_options", "when is shipping free?", "what's the minimum for free delivery?"),
      then("delivery_options", "my cart is {amount}, does that count?", "I'm at {amount} right now",
           "what about an order of {amount}?")),
    s(ask("payment_issue", "the payment failed but {amount} was taken from my account",
          "my card was charged {amount} but I got an error and no order"),
      then("payment_issue", "should I just pay again?", "do I need to pay a second time?"),
      then("payment_issue", "how long till the money's back?", "when do I get that back?",
           "and if it's still gone next week?")),
    s(ask("payment_issue", "my card keeps being declined when I check out",
          "payment won't go through, I've tried three times"),
      ask("check_payment_methods", "can I use PayPal instead?", "what other ways can I pay?",
          "do you take WeChat Pay?")),
    s(ask("payment_issue", "I was charged twice for order {order}", "two payments came out for order {order}"),
      then("payment_issue", "both were {amount}", "{amount} each time", "each one was {amount}"),
      then("payment_issue", "can you refund the extra one?", "how do I get the second one back?")),
    s(ask("check_payment_methods", "do you take Alipay?", "which credit cards can I use?"),
      then("check_payment_methods", "and Mastercard?", "what about PayPal?"),
      ask("place_order", "great, how do I check out?", "ok, how do I actually place the order?")),
    s(ask("product_price", "how much is the {product}?", "what's the price of that {product} on your homepage?",
          "is the {product} on sale right now?"),
      then("product_price", "does that include tax?", "is that the final price?", "is VAT included?"),
      products=ANY_EN),
    s(ask("product_price", "I bought the {product} for {amount} and now it's cheaper",
          "paid {amount} for the {product} last week and today it's on sale"),
      then("product_price", "can I get the difference back?", "do I get anything back?",
           "can you refund the difference?"),
      then("product_price", *ORDER_EN),
      products=SCREENS_EN + HOME_EN),
    s(ask("product_price", "what does the {product} cost?", "price of the {product} please"),
      ask("place_order", "ok, how do I order it without an account?", "can I buy it as a guest?"),
      ask("delivery_options", "and is delivery free?", "what are the shipping options?"),
      products=SCREENS_EN + HOME_EN),
    s(ask("place_order", "I'd like to buy the {product}, how do I order?",
          "I want to order the {product}, how does it work?"),
      ask("check_payment_methods", "can I pay cash when it arrives?", "do you do cash on delivery?"),
      then("check_payment_methods", "the total is {amount}", "it comes to {amount}, is that ok?"),
      ask("delivery_period", "and how long will it take to arrive?", "how soon would it get here?"),
      products=ANY_EN),
    s(ask("recover_password", "I can't log in, I forgot my password", "how do I reset my password?"),
      then("recover_password", "the link never arrived", "I didn't get any email", "nothing in my inbox"),
      then("recover_password", "ok got it now but it says the link expired",
           "found it, but it's from yesterday, does it still work?")),
    s(ask("registration_problems", "I'm trying to sign up but the code never comes",
          "no verification code when I register"),
      then("registration_problems", "I already checked spam", "tried twice already",
           "still nothing after five minutes")),
    s(ask("registration_problems", "sign up says my number is already registered",
          "it won't let me register, says the number is taken"),
      then("registration_problems", "but I never made an account", "that's weird, I've never signed up before"),
      ask("recover_password", "fine, how do I reset the password on it then?",
          "maybe I did. how do I get the password back?")),
    s(ask("create_account", "how do I make an account?", "I'd like to sign up, where do I start?"),
      then("create_account", "does it have to be an email address?", "how long is the code good for?",
           "can I use my mobile number?")),
    s(ask("delete_account", "I want to delete my account", "please close my account for good"),
      then("delete_account", "I still have an order on the way, is that a problem?",
           "what about my order that hasn't arrived?"),
      then("delete_account", "and can I change my mind later?", "is it instant?", "can I undo it?")),
    s(ask("edit_account", "how do I change my email address on my account?",
          "I need to update the email on my profile"),
      then("edit_account", "I didn't get the confirmation link", "done, but nothing came to the new address")),
    s(ask("switch_account", "how do I switch between my personal and work accounts?",
          "I have two logins, how do I swap between them in the app?"),
      then("switch_account", "can it remember both?", "do I have to log out every time?")),
    s(ask("newsletter_subscription", "please stop sending me promo emails",
          "how do I unsubscribe from your newsletter?"),
      then("newsletter_subscription", "still getting them though", "I clicked the link and they keep coming")),
    s(ask("set_up_shipping_address", "can I save a second address for deliveries?",
          "how do I add my office as a delivery address?"),
      then("set_up_shipping_address", "how many can I add?", "is there a limit?")),
    s(ask("check_invoice", "where do I find the invoice for order {order}?", "is there an invoice for order {order}?"),
      then("get_invoice", "I need one with my company's tax number on it", "can you put our tax number on it?"),
      then("get_invoice", "it was delivered about two months ago, is that ok?",
           "it arrived ten weeks ago, still possible?"),
      then("get_invoice", "and the same for {order2} please", "could I get one for {order2} too?")),
    s(ask("get_invoice", "can I get a PDF invoice for my {product}?", "I need the invoice for the {product} I bought"),
      then("get_invoice", *ORDER_EN),
      products=ANY_EN),
    s(ask("contact_customer_service", "what's your support email?", "how can I contact customer service?"),
      then("contact_customer_service", "and when are you online?", "what hours?", "is that every day?")),
    s(ask("contact_human_agent", "can I talk to an actual person?", "agent please", "I'd rather speak to a human"),
      then("contact_human_agent", "it's 11pm, is anyone there?", "what if it's after 10 at night?")),
    s(ask("review", "where can I leave a review for the {product}?", "I want to rate the {product} I got"),
      then("review", "it hasn't been delivered yet, can I still do it?", "do I need to wait until it arrives?"),
      products=ANY_EN),
    s(ask("delivery_options", "do you do next-day or express shipping?", "what delivery options are there?"),
      ask("check_payment_methods", "one more question: do you accept Alipay?", "also, can I pay by PayPal?")),
    s(ask("review", "how do I leave a review for my {product}?", "where do reviews go? the {product} is great"),
      ask("newsletter_subscription", "and how do I stop your newsletter emails?",
          "also please unsubscribe me from promos"),
      products=ANY_EN),
    s(ask("edit_account", "how do I change the name on my account?", "I want to update my phone number in my profile"),
      ask("set_up_shipping_address", "also, where do I add a new delivery address?",
          "and how do I save another address for later orders?")),
    s(ask("get_invoice", "I need an invoice for order {order}", "can you send me the invoice for order {order}?"),
      ask("track_order", "and where is that order now?", "also, has it shipped yet?")),
)

# ---------------------------------------------------------------------------------------------------------------------
# Chinese

SCREENS_ZH = ("手机", "平板", "笔记本电脑", "智能手表")
AUDIO_ZH = ("耳机", "蓝牙音箱", "降噪耳机")
HOME_ZH = ("电水壶", "破壁机", "吹风机", "电饭煲", "空气炸锅")
EXTRAS_ZH = ("充电器", "数据线", "鼠标", "充电宝")
ANY_ZH = SCREENS_ZH + AUDIO_ZH + HOME_ZH + ("显示器", "键盘")
ORDER_ZH = ("订单号是{order}", "{order}", "订单号：{order}", "单号{order}", "是这个：{order}", "订单号 {order}",
            "{order} 这个")
CLOSE_ZH = ("好的，谢谢", "谢谢，再见～", "好的，明白了", "行，辛苦了", "嗯嗯 谢谢", "知道了，谢谢啦")

ZH = (
    s(ask("warranty_repair", "我买的{product}突然开不了机了，还在保修期吗？", "{product}用了不到半年就坏了，怎么保修",
          "你好，{product}出问题了，能免费修吗"),
      then("warranty_repair", *ORDER_ZH),
      then("warranty_repair", "那发票丢了呢？", "纸质发票找不到了，还能保吗", "发票没留着，有影响吗"),
      products=SCREENS_ZH + AUDIO_ZH),
    s(ask("warranty_repair", "{product}摔了一下屏幕裂了，你们能修吗", "不小心把{product}屏幕摔碎了，保修管吗？"),
      then("warranty_repair", "要收费吗？", "大概多少钱？", "不是还在一年内吗"),
      products=SCREENS_ZH),
    s(ask("warranty_repair", "{product}充不进电了，买了才三个月", "{product}有杂音，是不是质量问题，能修吗？"),
      then("warranty_repair", "要我自己寄过去吗？", "怎么送修"),
      then("warranty_repair", "运费谁出", "寄回去的运费要我付吗？"),
      products=AUDIO_ZH),
    s(ask("warranty_repair", "{product}才用了两个月就坏了", "买的{product}不加热了，能保修吗"),
      then("warranty_repair", *ORDER_ZH),
      then("warranty_repair", "修好要多久？", "维修大概几天", "要多久？"),
      then("warranty_repair", "能直接换个新的吗", "不能换新的吗？"),
      products=HOME_ZH),
    s(ask("check_refund_policy", "{product}拆封了还能退吗？", "买的{product}不太喜欢，能退货吗"),
      then("check_refund_policy", "那没拆的呢", "没用过的也不行吗？"),
      products=ANY_ZH),
    s(ask("check_refund_policy", "不想要了能退吗，买了一个多星期了", "你们退货政策是怎样的？"),
      then("get_refund", "退的话钱多久能回来？", "退款几天到账？", "钱什么时候退给我"),
      then("get_refund", "原路退吗", "退到哪里？微信还是银行卡")),
    s(ask("track_refund", "退货都寄回去一周了，钱还没退", "{product}已经退回去了，退款怎么还没到？"),
      then("track_refund", *ORDER_ZH),
      then("track_refund", "是用信用卡付的，{amount}", "{amount}，刷的卡", "一共{amount}"),
      products=ANY_ZH),
    s(ask("track_refund", "退款怎么还没到账", "说好的退款呢，一直没收到"),
      then("track_refund", *ORDER_ZH),
      then("complaint", "上周就问过了，还是没解决", "还是没解决！", "都问了好几次了"),
      ask("contact_human_agent", "给我转人工", "别跟我说这些了，我要人工客服"),
      then("contact_human_agent", "怎么还没人接？", "等了十分钟了还没人")),
    s(ask("track_refund", "退款显示已经退了，可是银行卡里没有", "系统说退款成功了，钱没看到啊"),
      then("track_refund", "{amount}", "退的是{amount}"),
      then("track_refund", "还要等几天？", "还要多久")),
    s(ask("get_refund", "{product}有质量问题，我要退款", "收到的{product}是坏的，申请退款"),
      then("get_refund", *ORDER_ZH),
      ask("complaint", "你们客服刚才说不能退，我要投诉", "之前的客服态度很差，我要投诉他"),
      then("complaint", "多久处理？", "什么时候给我回复"),
      products=HOME_ZH),
    s(ask("cancel_order", "刚下的单不想要了，怎么取消", "帮我取消一下订单", "下错单了，能取消吗？"),
      then("cancel_order", *ORDER_ZH),
      then("check_cancellation_fee", "要扣钱吗？", "有手续费吗", "会扣钱吧？")),
    s(ask("cancel_order", "订单{order}显示已发货了，还能取消吗", "{order}已经发出来了，我不想要了"),
      then("check_cancellation_fee", "那会扣多少？", "运费要我出吗", "扣多少钱")),
    s(ask("check_cancellation_fee", "取消订单要手续费吗", "现在取消收钱吗？"),
      ask("cancel_order", "那就取消吧，单号{order}", "不收的话帮我把{order}取消了")),
    s(ask("track_order", "怎么还没发货啊，都三天了", "下单好几天了还不发货"),
      then("track_order", *ORDER_ZH),
      ask("check_cancellation_fee", "再不发我就取消了，现在取消要钱吗", "要是现在取消，收不收费？")),
    s(ask("change_order", "下单的时候颜色选错了，能改吗", "尺码拍错了，订单还能改吗？"),
      then("change_order", *ORDER_ZH),
      then("change_order", "付款快一个小时了，来得及吗", "刚付的款", "已经打包了怎么办")),
    s(ask("change_order", "订单{order}里还能加个{product}吗", "{order}这单能再加个{product}吗？"),
      then("change_order", "打包了还能加吗", "早上付的款，还来得及吗"),
      products=EXTRAS_ZH),
    s(ask("change_order", "订单{order}能把数量改成两个吗", "{order}我想多买一件，能直接改吗"),
      then("change_order", "昨天晚上付的款", "付了一天了"),
      ask("cancel_order", "改不了的话就取消吧", "那我取消重新下一单")),
    s(ask("track_order", "我的快递到哪了", "买的东西怎么还没到？", "帮我看看包裹到哪了"),
      then("track_order", *ORDER_ZH),
      ask("change_shipping_address", "能改送到我公司吗？", "我这两天不在家，可以改个地址吗"),
      then("track_order", "那还能按时到吗", "改了以后几号能到？")),
    s(ask("track_order", "订单{order}发货了吗", "帮我查下{order}到哪了"),
      ask("change_shipping_address", "好的谢谢。另外收货地址怎么改？", "知道了。还有，我想改一下收货地址")),
    s(ask("change_shipping_address", "收货地址填错了，能改吗", "地址写错小区了，怎么办"),
      then("change_shipping_address", *ORDER_ZH),
      then("change_shipping_address", "要是已经发出去了呢？", "发货了还能改吗")),
    s(ask("chitchat", "在吗，有人吗？", "你好，想咨询个事", "亲，在不在"),
      ask("track_order", "我的包裹一直没更新", "物流三天没动了"),
      then("track_order", *ORDER_ZH)),
    s(ask("track_order", "我下了两单，{order}那个到哪了", "{order}这单到哪了？我还有一单"),
      then("track_order", "另一个呢？", "那另外一单呢"),
      then("track_order", "{order2}", "单号{order2}")),
    s(ask("complaint", "快递员没送上门就点了签收，{product}也找不到", "送货的把箱子扔在门口，{product}被压坏了"),
      then("complaint", *ORDER_ZH),
      then("complaint", "这已经是第二次了！", "上个月也是这样！"),
      then("complaint", "多久给我答复？", "你们打算怎么处理"),
      products=ANY_ZH),
    s(ask("complaint", "我要投诉你们的快递，态度太差了", "你们的配送太慢了，我要投诉"),
      then("complaint", "还是没人联系我", "两天了还是没解决"),
      ask("contact_human_agent", "帮我转人工", "我要找真人客服")),
    s(ask("delivery_period", "寄到成都要几天？", "发杭州多久能到", "寄到哈尔滨一般几天"),
      then("delivery_options", "有没有更快的", "能快点吗？急用"),
      then("delivery_options", "那要加钱吗", "加多少钱？")),
    s(ask("delivery_period", "现在下单明天能到吗", "一般下单后几天能收到？"),
      then("delivery_period", "我这边是山区，比较偏", "我在海岛上，会慢吗？")),
    s(ask("delivery_options", "可以到自提点自己取吗", "有没有自提点？"),
      then("delivery_options", "那个收费吗", "自己取要钱吗")),
    s(ask("delivery_options", "多少钱包邮？", "满多少免运费"),
      then("delivery_options", "我这单{amount}，够了吗", "{amount}包邮吗？", "才{amount}的话呢")),
    s(ask("payment_issue", "付款失败了，但是钱扣了{amount}", "显示支付失败，卡里却少了{amount}"),
      then("payment_issue", "我要不要再付一次？", "需要重新付吗"),
      then("payment_issue", "那钱什么时候退回来", "要多久？", "钱能回来吧？")),
    s(ask("payment_issue", "一笔订单扣了我两次钱", "同一个订单付了两遍，怎么回事"),
      then("payment_issue", "订单号{order}，每次{amount}", "单号{order}，扣了两次{amount}"),
      then("payment_issue", "多扣的那笔怎么办", "多的那笔能退吗？")),
    s(ask("payment_issue", "结算的时候银行卡一直付不了", "付款老是提示失败"),
      ask("check_payment_methods", "能用支付宝吗？", "还能用什么付款")),
    s(ask("check_payment_methods", "微信支付能用吗", "付款方式都有哪些？"),
      then("check_payment_methods", "信用卡呢？", "PayPal可以吗")),
    s(ask("check_payment_methods", "支持货到付款吗？", "可以到货再付钱吗"),
      then("check_payment_methods", "{amount}的订单也可以吗", "我这单{amount}，行吗"),
      ask("place_order", "行，不注册能下单吗？", "好的，那怎么下单")),
    s(ask("product_price", "这款{product}现在多少钱？", "{product}什么价", "{product}最近有活动吗，多少钱"),
      then("product_price", "含税吗", "结算的时候还会变吗？", "这就是最终价格？"),
      products=ANY_ZH),
    s(ask("product_price", "我{amount}买的{product}，第二天就降价了", "{product}刚买完就便宜了，我付了{amount}"),
      then("product_price", "能退差价吗", "差价能补给我吗？"),
      then("product_price", *ORDER_ZH),
      products=SCREENS_ZH + HOME_ZH),
    s(ask("product_price", "{product}有优惠吗，现在什么价", "问下{product}多少钱"),
      ask("place_order", "怎么买", "我想买一个，怎么下单？"),
      ask("delivery_period", "几天能到", "下单后多久发货到家？"),
      ask("chitchat", "好的，谢谢", "好的，我先看看"),
      products=SCREENS_ZH + AUDIO_ZH),
    s(ask("recover_password", "密码忘了登不上去", "密码找不回来了怎么办"),
      then("recover_password", "邮件一直没收到", "没收到重置邮件"),
      then("recover_password", "收到了但是链接打不开了", "链接是昨天的，还能用吗")),
    s(ask("registration_problems", "注册收不到验证码", "注册的时候验证码一直不来"),
      then("registration_problems", "垃圾箱也看了，没有", "重发了好几次了")),
    s(ask("registration_problems", "注册的时候说手机号已经被注册了", "手机号提示已注册，注册不了"),
      then("registration_problems", "可我从来没注册过啊", "我没注册过呀"),
      ask("recover_password", "那怎么找回那个账号的密码", "那我重置一下密码吧，怎么弄")),
    s(ask("create_account", "怎么注册会员", "我想注册个账号"),
      then("create_account", "用邮箱可以吗", "验证码多久有效？")),
    s(ask("delete_account", "我想把账号注销掉", "怎么注销账户？"),
      then("delete_account", "还有一个订单没收到，有影响吗", "有个订单还在路上呢"),
      ask("delete_account", "注销了还能恢复吗", "注销以后后悔了怎么办")),
    s(ask("edit_account", "账号绑定的手机号换了，怎么改", "怎么换绑邮箱"),
      then("edit_account", "新号收不到验证码", "新邮箱没收到确认链接")),
    s(ask("switch_account", "我有两个号，怎么切换", "怎么换到另一个账号登录？"),
      then("switch_account", "每次都要重新登录吗？", "能同时记住两个吗")),
    s(ask("newsletter_subscription", "别再给我发广告邮件了", "怎么退订你们的促销邮件"),
      then("newsletter_subscription", "已经点过退订了，还是收到", "退订了还在发")),
    s(ask("set_up_shipping_address", "怎么添加一个新的收货地址", "想多存一个公司地址"),
      then("set_up_shipping_address", "最多能存几个", "有数量限制吗？")),
    s(ask("check_invoice", "订单{order}的发票在哪看", "{order}这单有发票吗？"),
      ask("get_invoice", "能开成公司的吗？要带税号", "我要开公司抬头的发票"),
      then("get_invoice", "签收快两个月了，还能开吗", "东西收到挺久了，还来得及吗？")),
    s(ask("get_invoice", "{product}的电子发票在哪下载", "买{product}的发票怎么弄"),
      then("get_invoice", *ORDER_ZH),
      products=ANY_ZH),
    s(ask("contact_customer_service", "你们客服几点下班", "怎么联系客服？"),
      then("contact_customer_service", "有邮箱吗", "周末也在吗？")),
    s(ask("contact_human_agent", "我要人工客服", "人工", "机器人听不懂，转人工吧"),
      then("contact_human_agent", "半夜也有人吗？", "现在十一点了还有人吗")),
    s(ask("review", "{product}用着不错，在哪写评价", "想给{product}打个好评"),
      then("review", "还没确认收货能评吗", "东西还没到，能先评吗？"),
      products=ANY_ZH),
    s(ask("delivery_options", "能发加急吗？", "你们有哪些配送方式"),
      ask("check_payment_methods", "顺便问下，能用信用卡吗", "另外，可以用PayPal付吗？")),
    s(ask("review", "{product}收到了，挺好用的，怎么评价", "怎么给{product}写评价？"),
      ask("newsletter_subscription", "另外你们的促销邮件怎么退订", "还有，我不想再收推广邮件了"),
      products=ANY_ZH),
    s(ask("edit_account", "怎么改账户昵称", "账户里的名字填错了，在哪改"),
      ask("set_up_shipping_address", "还有，新地址在哪添加？", "顺便问一下，怎么再加一个收货地址")),
    s(ask("get_invoice", "订单{order}要开发票", "{order}这单帮我开个电子发票"),
      ask("track_order", "对了，这单现在到哪了？", "还有，这单发货了没")),
)


def _order_id(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.4:
        return str(rng.randint(10000, 99999))
    if kind < 0.6:
        return str(rng.randint(10_000_000, 99_999_999))
    if kind < 0.9:  # date and a serial: 2024113005
        return f"2024{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}{rng.randint(1, 99):02d}"
    return str(rng.randint(10**11, 10**12 - 1))


def _amount(rng: random.Random, lang: str, product: str) -> str:
    big = product in SCREENS_EN + SCREENS_ZH  # a phone costs more than a kettle
    prices = (899, 1299, 1999, 2499, 3299, 4999) if big else (19, 35, 45, 59, 88, 99, 120, 149, 199, 259, 299, 399)
    n = rng.choice(prices)
    forms = ("${n}", "{n} dollars", "¥{n}", "{n} yuan") if lang == "en" else ("¥{n}", "{n}元", "{n}块", "{n}块钱")
    return rng.choice(forms).format(n=n)


def _conversation(rng: random.Random, lang: str, scenario: Scenario, wordings: list[list[str]], copy: int
                  ) -> list[TurnRecord]:
    order, product = _order_id(rng), rng.choice(scenario.products or ("",))
    values = {"order": order, "order2": _order_id(rng), "product": product, "amount": _amount(rng, lang, product)}
    while values["order2"] == order:
        values["order2"] = _order_id(rng)
    # Each copy of a scenario takes the next of its wordings (shuffled once per scenario), so two copies differ.
    turns = [(turn, texts[copy % len(texts)]) for turn, texts in zip(scenario.turns, wordings, strict=True)]
    if len(turns) < 5 and turns[-1][0].intent != "chitchat" and rng.random() < CLOSE_P:
        turns.append((ask("chitchat"), rng.choice(CLOSE_EN if lang == "en" else CLOSE_ZH)))
    out: list[TurnRecord] = []
    for turn, template in turns:
        slots = {slot: values[key] for key, slot in SLOTS if "{" + key + "}" in template}
        if not all(slots.values()):
            raise ValueError(f"a scenario says {{product}} but lists no products: {template}")
        out.append(TurnRecord(text=template.format(**values), intent=turn.intent, slots=slots,
                              follow_up=turn.follow_up))
    return out


def build(seed: int = SEED) -> list[Conversation]:
    """PER_LANG conversations per language, the scenarios taken in turn, shuffled and numbered."""
    rng = random.Random(seed)
    conversations: list[Conversation] = []
    for lang, scenarios in (("en", EN), ("zh", ZH)):
        drawn: list[list[TurnRecord]] = []
        seen: set[tuple[str, ...]] = set()
        wordings = [[rng.sample(turn.texts, len(turn.texts)) for turn in scenario.turns] for scenario in scenarios]
        for i in range(PER_LANG):
            j, copy = i % len(scenarios), i // len(scenarios)
            turns = _conversation(rng, lang, scenarios[j], wordings[j], copy)
            while (key := tuple(t["text"] for t in turns)) in seen:
                turns = _conversation(rng, lang, scenarios[j], wordings[j], copy)
            seen.add(key)
            drawn.append(turns)
        rng.shuffle(drawn)
        conversations += [Conversation(id=f"{lang}-{n:03d}", lang=lang, turns=turns)
                          for n, turns in enumerate(drawn, 1)]
    return conversations


def render(conversations: list[Conversation]) -> str:
    return "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in conversations)


def main() -> None:
    conversations = build()
    OUT.write_text(render(conversations), encoding="utf-8")
    print(f"wrote {len(conversations)} conversations to {OUT}")


if __name__ == "__main__":
    main()
