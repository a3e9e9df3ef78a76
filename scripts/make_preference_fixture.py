#!/usr/bin/env python3
"""Builds the reference for the preference objectives (DPO sigmoid, IPO, hinge, SimPO,
ORPO): one batch of packed preference pairs through a fixture model, each objective's
loss, metrics and gradients, with TRL's own loss functions where they take tensors.

It loads the committed tests/fixtures/models/llama_gqa/ (written by make_fixtures.py)
and writes preference.safetensors beside it:
  input_ids, position_ids, targets   (M*B, T) int64, micro-batch-major rows
  spans                              (P, 2, 3) int64: (micro-batch, start, end) of each
                                     pair's chosen and rejected answer, flat in (B*T)
  ref_logps                          (P, 2) the reference model's log-probabilities
  logps                              (P, 2) the model's own (sums over answer tokens)
  <loss>.loss (1), <loss>.metrics (7)   per objective, fp32
  <loss>.dlogp (M*B, T)   the loss's gradient with respect to each token's log-probability
  <loss>.grad.<name>      the gradients of every 1-D parameter (the norms: each depends on
                          the whole backward) and of layer 0's k_proj (the fixtures' size
                          budget holds no more)
metrics: loss, rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins,
logps/chosen, logps/rejected (TRL's names, means over the pairs).

The formulas, and what is called:
  sigmoid, hinge, ipo: trl DPOTrainer._compute_loss. Its per-pair losses are those of
    trl CPOTrainer.cpo_loss (loss_type sigmoid, hinge, ipo) applied to the log-ratios
    log pi - log pi_ref (for ipo, per answer token, as DPOTrainer normalizes it), so
    cpo_loss is called on them; sigmoid with label smoothing is cDPO
    -(1-e) logsigmoid(b d) - e logsigmoid(-b d).
  simpo: CPOTrainer.cpo_loss(loss_type="simpo") on per-token mean log-probabilities
    (cpo_alpha = 0: no NLL term), -logsigmoid(b (avg_c - avg_r) - gamma) smoothed.
  orpo: ORPOTrainer.odds_ratio_loss on per-token means, loss = NLL(chosen answers) -
    mean(lambda * logsigmoid(log odds)) (ORPOTrainer.get_batch_loss_metrics), the NLL
    over the chosen answers' tokens (prompts masked, as megatrain's SFT).
The model runs in float64 so that the reference is exact for fp32 comparisons.
Deterministic (one CPU thread). docs/fixtures.md describes it.

Usage: python scripts/make_preference_fixture.py [--models DIR]
"""
import argparse
import json
import os
import sys
import types

import safetensors
import torch
import transformers
import trl
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM
from trl.experimental.cpo import CPOTrainer
from trl.experimental.orpo import ORPOTrainer

import make_fixtures as mf

MODEL = "llama_gqa"
M, B, T = 2, 2, 16
# Each row's documents: (pair, answer, prompt length, answer length); pair -1 is padding.
# Chosen and rejected of a pair share their prompt's tokens.
ROWS = [
    [(0, 0, 4, 5), (0, 1, 4, 3)],
    [(1, 0, 3, 6), (1, 1, 3, 4)],
    [(2, 0, 2, 7), (2, 1, 2, 4), (-1, 0, 0, 1)],
    [(3, 0, 5, 4), (3, 1, 5, 2)],
]
P = 4
GRAD_MATRIX = "model.layers.0.self_attn.k_proj.weight"
# log-ratio difference of each pair (DPO's delta): both sides of the hinge's kink at 1
DELTA = [2.0, -0.5, 0.3, 1.5]
CONFIGS = {
    "sigmoid": dict(loss_type="sigmoid", beta=0.5, label_smoothing=0.1),
    "ipo": dict(loss_type="ipo", beta=0.5, label_smoothing=0.0),
    "hinge": dict(loss_type="hinge", beta=1.0, label_smoothing=0.0),
    "simpo": dict(loss_type="simpo", beta=2.0, label_smoothing=0.05, gamma=0.5),
    "orpo": dict(loss_type="orpo", beta=0.3),  # beta is ORPO's lambda
}


def make_batch(gen, V):
    ids = torch.zeros(M * B, T, dtype=torch.int64)
    pos = torch.zeros(M * B, T, dtype=torch.int64)
    tgt = torch.full((M * B, T), mf.IGNORE, dtype=torch.int64)
    spans = torch.zeros(P, 2, 3, dtype=torch.int64)
    prompts = {}
    for r, docs in enumerate(ROWS):
        start = 0
        for pair, ans, plen, alen in docs:
            n = plen + alen
            assert start + n <= T
            pos[r, start:start + n] = torch.arange(n)
            if pair >= 0:
                if pair not in prompts:
                    prompts[pair] = torch.randint(3, V, (plen,), generator=gen)
                ids[r, start:start + plen] = prompts[pair]
                ids[r, start + plen:start + n] = torch.randint(3, V, (alen,), generator=gen)
                # the answer's tokens are predicted at positions plen-1 .. n-2
                a0, a1 = start + plen - 1, start + n - 1
                tgt[r, a0:a1] = ids[r, a0 + 1:a1 + 1]
                spans[pair, ans] = torch.tensor([r // B, (r % B) * T + a0, (r % B) * T + a1])
            start += n
        assert start == T, f"row {r} holds {start} tokens"
    return ids, pos, tgt, spans


def token_logps(model, ids, pos, tgt):
    logits = model(input_ids=ids, position_ids=pos).logits
    lp = torch.log_softmax(logits, dim=-1)
    tok = torch.where(tgt == mf.IGNORE, torch.zeros_like(tgt), tgt)
    return lp.gather(-1, tok.unsqueeze(-1)).squeeze(-1) * (tgt != mf.IGNORE)


def answer_logps(per_tok, spans):
    flat = per_tok.reshape(M, B * T)
    sums = torch.stack([torch.stack([flat[s[0], s[1]:s[2]].sum() for s in pair]) for pair in
                        spans.tolist()])
    counts = torch.tensor([[s[2] - s[1] for s in pair] for pair in spans.tolist()],
                          dtype=sums.dtype)
    return sums, counts


def loss_of(name, cfg, logps, counts, ref):
    """The objective's loss and TRL's chosen/rejected rewards and logged logps."""
    c, r = logps[:, 0], logps[:, 1]
    nc, nr = counts[:, 0], counts[:, 1]
    if name == "orpo":
        me = types.SimpleNamespace(beta=cfg["beta"], accelerator=types.SimpleNamespace(
            device="cpu"))
        losses, rc, rr, _, _ = ORPOTrainer.odds_ratio_loss(me, c / nc, r / nr)
        nll = -c.sum() / nc.sum()
        return nll - losses.mean(), rc, rr, c / nc, r / nr
    me = types.SimpleNamespace(alpha=0.0, loss_type=cfg["loss_type"], beta=cfg["beta"],
                               label_smoothing=cfg["label_smoothing"],
                               simpo_gamma=cfg.get("gamma", 0.0),
                               accelerator=types.SimpleNamespace(device="cpu"))
    if name == "simpo":
        losses, rc, rr = CPOTrainer.cpo_loss(me, c / nc, r / nr)
        return losses.mean(), rc, rr, c / nc, r / nr
    lc, lr = c - ref[:, 0], r - ref[:, 1]
    if name == "ipo":
        losses, _, _ = CPOTrainer.cpo_loss(me, lc / nc, lr / nr)
    else:
        losses, _, _ = CPOTrainer.cpo_loss(me, lc, lr)
    b = cfg["beta"]
    return losses.mean(), b * lc.detach(), b * lr.detach(), c, r


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=os.path.join(here, "..", "tests", "fixtures", "models"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    out_dir = os.path.join(args.models, MODEL)
    with open(os.path.join(out_dir, "train.json")) as f:
        seed = json.load(f)["seed"]
    model = AutoModelForCausalLM.from_pretrained(out_dir, attn_implementation="eager",
                                                 dtype=torch.float32).double()
    model.train()
    gen = torch.Generator().manual_seed(seed + 11)
    ids, pos, tgt, spans = make_batch(gen, model.config.vocab_size)
    with torch.no_grad():
        logps, counts = answer_logps(token_logps(model, ids, pos, tgt), spans)
    # ref chosen = c - a, ref rejected = r - a + delta: DPO's delta is DELTA
    a = torch.randn(P, generator=gen, dtype=torch.float64)
    ref = torch.stack([logps[:, 0] - a, logps[:, 1] - a + torch.tensor(DELTA)], 1).float()

    tensors = {"input_ids": ids, "position_ids": pos, "targets": tgt, "spans": spans,
               "ref_logps": ref, "logps": logps.float()}
    for name, cfg in CONFIGS.items():
        model.zero_grad(set_to_none=True)
        per_tok = token_logps(model, ids, pos, tgt)
        per_tok.retain_grad()
        lp, _ = answer_logps(per_tok, spans)
        loss, rc, rr, lc, lr = loss_of(name, cfg, lp, counts, ref.double())
        loss.backward()
        tensors[name + ".dlogp"] = per_tok.grad.float().clone()
        metrics = torch.stack([loss.detach(), rc.mean(), rr.mean(), (rc > rr).double().mean(),
                               (rc - rr).mean(), lc.detach().mean(), lr.detach().mean()])
        tensors[name + ".loss"] = loss.detach().float().reshape(1)
        tensors[name + ".metrics"] = metrics.float()
        for n, p in model.named_parameters():
            if p.dim() == 1 or n == GRAD_MATRIX:
                tensors[f"{name}.grad.{n}"] = p.grad.detach().float().clone()
        print(f"== {name}: loss {loss.item():.6f}, accuracies {metrics[3].item():.2f}")
    meta = {"model": MODEL, "seed": seed + 11, "rows": ROWS, "delta": DELTA,
            "configs": CONFIGS, "torch_version": torch.__version__,
            "transformers_version": transformers.__version__, "trl_version": trl.__version__,
            "safetensors_version": safetensors.__version__}
    path = os.path.join(out_dir, "preference.safetensors")
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    save_file(tensors, path, metadata={"preference": json.dumps(meta, sort_keys=True)})
    total = mf.dir_size(args.models)
    print(f"{os.path.basename(path)}: {os.path.getsize(path)} bytes; all fixtures {total} bytes")
    if total >= mf.SIZE_LIMIT:
        sys.exit(f"fixtures are {total} bytes, over the {mf.SIZE_LIMIT} byte budget")


if __name__ == "__main__":
    main()
