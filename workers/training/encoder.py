"""The heavy model: MiniLM's top layer(s) and a linear head fine-tuned, fused with charngram's log-probs."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from workers.models.common import FloatArray
from workers.training.config import TrainConfig
from workers.training.data import IntArray, Split
from workers.training.fitting import accuracy, fit_temperature, warmup_cosine

log = logging.getLogger("tierflow.train")  # one logger for the whole run, as before the split


def train_encoder(split: Split, cfg: TrainConfig, ctx: dict[str, Any]) -> Any:
    """Fine-tune MiniLM's top layer(s) and a linear head; temperature from the validation split."""
    import copy

    import torch
    from transformers import AutoModel, AutoTokenizer
    from transformers.masking_utils import create_bidirectional_mask

    from workers.models.encoder import MAX_TOKENS, EncoderClassifier, base_model_path, fuse, mean_pool

    torch.manual_seed(cfg.seed)
    path = str(base_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    base = AutoModel.from_pretrained(path).eval()
    n_layers = len(base.encoder.layer)
    k = cfg.encoder_tuned_layers
    Batch = tuple[IntArray, torch.Tensor, torch.Tensor]

    def frozen_states(texts: Sequence[str]) -> list[Batch]:
        """Hidden states entering the tuned layers, in length-sorted batches (less padding)."""
        order = np.argsort([len(t) for t in texts], kind="stable")
        out = []
        with torch.no_grad():
            for s in range(0, len(order), cfg.encoder_batch):
                idx = order[s : s + cfg.encoder_batch]
                enc = tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=MAX_TOKENS,
                                return_tensors="pt")
                hs = base(**enc, output_hidden_states=True).hidden_states[n_layers - k]
                out.append((idx, hs, enc["attention_mask"]))
        return out

    def forward(top: torch.nn.ModuleList, head: torch.nn.Linear, h: torch.Tensor, am: torch.Tensor) -> torch.Tensor:
        mask = create_bidirectional_mask(config=base.config, inputs_embeds=h, attention_mask=am)
        for layer in top:
            out = layer(h, mask)
            h = out[0] if isinstance(out, tuple) else out
        return head(mean_pool(h, am))

    def logits_of(top: torch.nn.ModuleList, head: torch.nn.Linear, states: list[Batch], n: int) -> FloatArray:
        z = np.zeros((n, len(split.labels)), dtype=np.float32)
        top.eval()
        with torch.no_grad():
            for idx, h, am in states:
                z[idx] = forward(top, head, h, am).numpy()
        return z

    def fit(states: list[Batch], y: IntArray) -> tuple[torch.nn.ModuleList, torch.nn.Linear]:
        torch.manual_seed(cfg.seed)
        top = copy.deepcopy(base.encoder.layer[n_layers - k :])
        head = torch.nn.Linear(base.config.hidden_size, len(split.labels))
        opt = torch.optim.AdamW(
            [{"params": top.parameters(), "lr": cfg.encoder_lr},
             {"params": head.parameters(), "lr": cfg.encoder_head_lr}],
            weight_decay=0.01,
        )
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(cfg.encoder_epochs * len(states)))
        for epoch in range(cfg.encoder_epochs):
            top.train()
            total = 0.0
            for b in np.random.RandomState(cfg.seed + epoch).permutation(len(states)):
                idx, h, am = states[b]
                loss = torch.nn.functional.cross_entropy(
                    forward(top, head, h, am), torch.from_numpy(y[idx]), label_smoothing=cfg.label_smoothing
                )
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                total += loss.item()
            log.info("minilm: epoch %d loss %.4f", epoch + 1, total / max(len(states), 1))
        return top, head

    t0 = time.perf_counter()
    fit_states = frozen_states(split.fit.texts)
    val_states = frozen_states(split.val.texts)
    log.info("minilm: cached frozen layers in %.0f s", time.perf_counter() - t0)
    top, head = fit(fit_states, split.y_fit)
    val_logits = logits_of(top, head, val_states, len(split.val.texts))
    log.info("minilm: validation accuracy %.4f", accuracy(val_logits.argmax(1), split.y_val))
    char_val = ctx.get("charngram_val_logits")
    char_weight = 0.0
    if char_val is not None and len(split.y_val):
        scored = [(accuracy(fuse(val_logits, char_val, wt).argmax(1), split.y_val), -wt, wt)
                  for wt in cfg.fusion_weight_grid]
        acc, _, char_weight = max(scored)
        log.info("minilm: fused with charngram (weight %g): validation accuracy %.4f", char_weight, acc)
    temperature = fit_temperature(fuse(val_logits, char_val, char_weight), split.y_val)
    if cfg.refit:
        # split.train is fit + val in that order, so the cached val batches only need their indices shifted
        shifted = [(idx + len(split.fit.texts), h, am) for idx, h, am in val_states]
        top, head = fit(fit_states + shifted, split.y_train)
    # lift the tuned layers into a full MiniLM so the state keys match what serving loads
    full = copy.deepcopy(base)
    for j in range(k):
        full.encoder.layer[n_layers - k + j] = top[j]
    from workers.models.encoder import tuned_layer_state

    tuned = {name: t.detach().numpy() for name, t in tuned_layer_state(full, k).items()}
    log.info("minilm: temperature %.3f", temperature)
    return EncoderClassifier(
        split.labels, head.weight.detach().numpy(), head.bias.detach().numpy(), tuned=tuned, n_tuned=k,
        temperature=temperature, char=ctx.get("charngram"), char_weight=char_weight,
    )
