#!/usr/bin/env python3
"""Builds the reference fixtures that megatrain's numeric tests compare against.

For each small random Hugging Face model below it writes tests/fixtures/models/<name>/:
  config.json, model.safetensors   the model as transformers' save_pretrained writes it
  reference.safetensors            inputs, logits, loss, gradients, a 5-step AdamW
                                   trajectory and a bf16-autocast reference
  train.json                       the training hyperparameters in plain JSON
The format is described in docs/fixtures.md. Everything is computed on the CPU in fp32
with one thread, so a second run writes identical bytes.

Usage: python scripts/make_fixtures.py [--out DIR] [--only NAME ...]
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import sys

import safetensors
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, get_cosine_schedule_with_warmup

IGNORE = -100
B, T = 2, 16
STEPS = 5
PROMPT_LEN = 6  # row 0's labels start with this many -100 (an SFT prompt)

# Training hyperparameters shared by all models (a model may override some, see CONFIGS).
HPARAMS = {
    "lr": 1e-2,
    "betas": [0.9, 0.95],
    "eps": 1e-8,
    "weight_decay": 0.1,          # every parameter with ndim >= 2
    "weight_decay_1d": 0.0,       # every parameter with ndim == 1 (norms, biases)
    "schedule": "cosine",
    "num_cycles": 0.5,
    "warmup_steps": 2,
    "total_steps": STEPS,
    "max_grad_norm": 1.0,
    "clip_eps": 1e-6,             # torch: coef = max_norm / (total_norm + 1e-6)
    "batch_size": B,
    "seq_len": T,
    "ignore_index": IGNORE,
}

# Standard deviation of the random 2-D weights: large enough that the logits are far
# from uniform and the gradient norm exceeds max_grad_norm, small enough to be stable.
WEIGHT_STD = 0.15
NORM_STD = 0.1   # norm weights are 1 + NORM_STD * randn
BIAS_STD = 0.1   # biases are BIAS_STD * randn
# Below this RMS (sqrt of the final Adam v) a gradient element is rounding noise (see replay).
NOISY_GRAD_RMS = 1e-5

COMMON = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=96,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
    attention_dropout=0.0,
    use_cache=False,
    initializer_range=WEIGHT_STD,
)

# Per model: the HF config fields, plus "seed" (weights, data) and "overrides" of HPARAMS.
CONFIGS = {
    "llama_gqa": dict(
        seed=1234,
        model_type="llama",
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
        max_position_embeddings=64,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "qwen2_bias_tied": dict(
        seed=2345,
        model_type="qwen2",
        num_key_value_heads=4,
        intermediate_size=40,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
        use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    ),
    "qwen3_qknorm_mqa": dict(
        seed=3456,
        model_type="qwen3",
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=48,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
        use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    ),
    "mistral": dict(
        seed=4567,
        # A larger clip threshold here so that this trajectory has both clipped and
        # unclipped steps (with 1.0 every step of every model clips: the CE gradient alone
        # has norm > 1 at V = 96), which tests the min(1, .) of the clip coefficient.
        overrides={"max_grad_norm": 5.0},
        model_type="mistral",
        num_key_value_heads=2,
        intermediate_size=48,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
        max_position_embeddings=64,
        sliding_window=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
    # GPT-NeoX (Pythia): LayerNorm with bias, fused per-head qkv, biases on every linear,
    # untied embed_out. Two heads of 16 dims, so that rotary_pct 0.25 rotates 4 of them.
    "neox_parallel": dict(
        seed=5678,
        model_type="gpt_neox",
        num_attention_heads=2,
        intermediate_size=48,
        hidden_act="gelu",
        use_parallel_residual=True,
        tie_word_embeddings=False,
        layer_norm_eps=1e-5,
        max_position_embeddings=64,
        hidden_dropout=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    ),
    "neox_sequential": dict(
        seed=6789,
        model_type="gpt_neox",
        num_attention_heads=2,
        intermediate_size=48,
        hidden_act="gelu_new",
        use_parallel_residual=False,
        tie_word_embeddings=False,
        layer_norm_eps=1e-5,
        max_position_embeddings=64,
        hidden_dropout=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 1.0},
    ),
    # Falcon-7B's architecture: one LayerNorm feeding attention and MLP in parallel,
    # multi-query (one kv head) with the fused qkv laid out [q heads..., k, v], no biases,
    # lm_head tied to the word embeddings.
    "falcon_mq": dict(
        seed=7890,
        model_type="falcon",
        new_decoder_architecture=False,
        multi_query=True,
        parallel_attn=True,
        bias=False,
        alibi=False,
        ffn_hidden_size=48,
        activation="gelu",
        tie_word_embeddings=True,
        layer_norm_epsilon=1e-5,
        max_position_embeddings=64,
        hidden_dropout=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
    # Falcon-40B/180B's new decoder architecture: ln_attn and ln_mlp, two kv heads with
    # the fused qkv grouped per kv head [q, q, k, v], untied lm_head.
    "falcon_new_decoder": dict(
        seed=8901,
        model_type="falcon",
        new_decoder_architecture=True,
        num_kv_heads=2,
        bias=False,
        alibi=False,
        ffn_hidden_size=48,
        activation="gelu",
        tie_word_embeddings=False,
        layer_norm_epsilon=1e-5,
        max_position_embeddings=64,
        hidden_dropout=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    ),
    # Gemma 2: norms by 1 + w before and after attention and MLP, GeGLU (tanh GELU),
    # embeddings times sqrt(hidden), tied; both soft-caps small enough to bend the scores
    # and logits; query_pre_attn_scalar other than head_dim; layer 0 slides over 5 keys
    # (of 16), layer 1 attends to all.
    "gemma2_softcap": dict(
        seed=9012,
        model_type="gemma2",
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=12,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0,
        sliding_window=5,
        layer_types=["sliding_attention", "full_attention"],
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
    # Gemma 3's text model: q/k norms, one kv head, no soft-caps; layer 0 slides over 6
    # keys with its own rope base, layer 1 (global) has rope_theta with linear scaling.
    "gemma3_text_sliding": dict(
        seed=9123,
        model_type="gemma3_text",
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=48,
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=10,
        attn_logit_softcapping=None,
        final_logit_softcapping=None,
        sliding_window=6,
        layer_types=["sliding_attention", "full_attention"],
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {"rope_type": "linear", "rope_theta": 1000.0, "factor": 2.0},
        },
    ),
    # Phi-3-mini-4k's shape of block: q, k, v in one qkv_proj and gate, up in one
    # gate_up_proj; grouped kv heads here, and a sliding window longer than the sequence
    # (Phi-3-mini-4k's is 2047 of 4096 positions), which is full causal attention.
    "phi3_gqa": dict(
        seed=9012,
        model_type="phi3",
        num_key_value_heads=2,
        intermediate_size=48,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
        max_position_embeddings=64,
        original_max_position_embeddings=64,
        sliding_window=32,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
    # Phi-3.5-mini's longrope: the sequence (16) is longer than the pretraining length
    # (original_max_position_embeddings 8), so the long factors divide inv_freq, and
    # max_position_embeddings 64 = 8 x 8 scales cos and sin by sqrt(1 + ln 8 / ln 8).
    # Four kv heads (Phi-3-mini's MHA) and a tied lm_head (Phi-4-mini's).
    "phi3_longrope": dict(
        seed=9123,
        model_type="phi3",
        num_key_value_heads=4,
        intermediate_size=40,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        max_position_embeddings=64,
        original_max_position_embeddings=8,
        sliding_window=None,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0, 1.25, 1.5, 2.0],
            "long_factor": [1.5, 3.0, 6.5, 12.0],
        },
    ),
    # pad_token_id set: transformers builds the embedding with padding_idx 2, whose row gets
    # no gradient from the lookup. Token 2 is also the EOS, as Phi-3's <|endoftext|> is both,
    # and stands at three places of every row, as it does between the documents of packed
    # data. Untied, so that the row's gradient is the lookup's alone; a half-size model.
    "llama_pad": dict(
        seed=9234,
        model_type="llama",
        hidden_size=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        intermediate_size=32,
        tie_word_embeddings=False,
        pad_token_id=2,
        rms_norm_eps=1e-5,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
}


def variant(base, drop=(), **changes):
    """CONFIGS[base] with the fields in changes changed and those in drop left out."""
    spec = {k: v for k, v in CONFIGS[base].items() if k not in drop}
    spec.update(changes)
    return spec


# Mistral-7B-v0.1's sliding window, shorter than the sequence (5 of 16 positions):
# each query attends to itself and the 4 keys before it.
CONFIGS["mistral_window"] = variant("mistral", drop=("overrides",), seed=4678, sliding_window=5)
# Phi-3-mini-4k's sliding window (2047 of 4096 there), shorter than the sequence here.
CONFIGS["phi3_window"] = variant("phi3_gqa", seed=9034, sliding_window=7)

# Pad tokens put into each row of a model with pad_token_id (make_batch).
PADS_PER_ROW = 3

# All of tests/fixtures/models: dense, gpt_neox, falcon, phi3, gemma, packed and MoE references.
SIZE_LIMIT = 19 * 512 * 1024  # 9.5 MiB


# Parameters whose name in the published checkpoint differs from transformers' module
# path: the reference tensors use the checkpoint's names, which megatrain loads.
CKPT_RENAMES = {"gpt_neox": {"lm_head.weight": "embed_out.weight"}}


def ckpt_params(model):
    """named_parameters() under the checkpoint's names."""
    renames = CKPT_RENAMES.get(model.config.model_type, {})
    return [(renames.get(n, n), p) for n, p in model.named_parameters()]


def make_config(spec):
    spec = {k: v for k, v in spec.items() if k not in ("seed", "overrides")}
    model_type = spec.pop("model_type")
    cfg = AutoConfig.for_model(model_type, **{**COMMON, **spec})  # spec wins
    cfg._attn_implementation = "eager"
    return cfg


def init_params(model, gen):
    """Random init in named_parameters order: 2-D weights N(0, WEIGHT_STD^2), norm weights
    around 1 (Gemma's w around 0: its norms scale by 1 + w), biases non-zero, so that
    every gradient path carries signal."""
    one_plus = model.config.model_type in ("gemma2", "gemma3_text")
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if p.ndim == 2:
                p.copy_(WEIGHT_STD * noise)
            elif name.endswith(".bias"):
                p.copy_(BIAS_STD * noise)
            elif one_plus and name.endswith("norm.weight"):
                p.copy_(NORM_STD * noise)
            elif name.endswith("norm.weight") or name.split(".")[-2].startswith("ln_"):  # Falcon's ln_attn, ln_mlp, ln_f
                p.copy_(1.0 + NORM_STD * noise)
            else:
                raise ValueError(f"no init rule for parameter {name} {tuple(p.shape)}")


def make_batch(gen, V, sft_row, pad=None):
    """input_ids (B,T) uniform in [3, V); labels = input_ids with -100 holes. Row `sft_row`
    masks its first PROMPT_LEN labels (an SFT prompt); each row also loses one or two
    random positions. With pad (a pad_token_id), PADS_PER_ROW random positions of each row
    hold it, as input and label. Returns input_ids, labels, targets."""
    ids = torch.randint(3, V, (B, T), generator=gen, dtype=torch.int64)
    if pad is not None:
        where = torch.randint(0, T, (B, PADS_PER_ROW), generator=gen, dtype=torch.int64)
        for b in range(B):
            ids[b, where[b]] = pad
    labels = ids.clone()
    if sft_row is not None:
        labels[sft_row, :PROMPT_LEN] = IGNORE
    holes = torch.randint(1, T, (B, 2), generator=gen, dtype=torch.int64)
    for b in range(B):
        labels[b, holes[b]] = IGNORE
    return ids, labels, shift_targets(labels)


def shift_targets(labels):
    """targets[:, t] = labels[:, t+1]; targets[:, T-1] = -100 (predicting from position t)."""
    targets = torch.full_like(labels, IGNORE)
    targets[:, :-1] = labels[:, 1:]
    return targets


def ce_from_targets(logits, targets):
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1), ignore_index=IGNORE)


def forward_backward(model, ids, labels, autocast):
    model.zero_grad(set_to_none=True)
    if autocast:
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            out = model(input_ids=ids, labels=labels)
    else:
        out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in ckpt_params(model)}
    return out.logits.detach().float().clone(), out.loss.detach().float().reshape(1), grads


def param_groups(model, hp):
    decay = [p for _, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.ndim < 2]
    return [
        {"params": decay, "weight_decay": hp["weight_decay"]},
        {"params": no_decay, "weight_decay": hp["weight_decay_1d"]},
    ]


def train(model, gen, V, hp):
    """STEPS steps of AdamW + cosine warmup + clipping, as HF Trainer runs them."""
    opt = torch.optim.AdamW(
        param_groups(model, hp),
        lr=hp["lr"],
        betas=tuple(hp["betas"]),
        eps=hp["eps"],
        foreach=False,
        fused=False,
    )
    sched = get_cosine_schedule_with_warmup(
        opt, num_warmup_steps=hp["warmup_steps"], num_training_steps=hp["total_steps"]
    )
    out = {k: [] for k in ("input_ids", "labels", "targets", "losses", "grad_norms", "lrs")}
    for s in range(STEPS):
        ids, labels, targets = make_batch(gen, V, sft_row=s % B, pad=model.config.pad_token_id)
        lr = sched.get_last_lr()[0]
        assert all(g["lr"] == lr for g in opt.param_groups)
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), hp["max_grad_norm"])
        opt.step()
        sched.step()
        for k, v in (("input_ids", ids), ("labels", labels), ("targets", targets)):
            out[k].append(v)
        out["losses"].append(loss.item())
        out["grad_norms"].append(norm.item())
        out["lrs"].append(lr)
    tensors = {
        "train.input_ids": torch.stack(out["input_ids"]),
        "train.labels": torch.stack(out["labels"]),
        "train.targets": torch.stack(out["targets"]),
        "train.losses": torch.tensor(out["losses"], dtype=torch.float32),
        "train.grad_norms": torch.tensor(out["grad_norms"], dtype=torch.float32),
        "train.lrs": torch.tensor(out["lrs"], dtype=torch.float32),
    }
    for name, p in ckpt_params(model):
        st = opt.state[p]
        assert int(st["step"].item()) == STEPS
        tensors["final." + name] = p.detach().clone()
        tensors["final_exp_avg." + name] = st["exp_avg"].clone()
        tensors["final_exp_avg_sq." + name] = st["exp_avg_sq"].clone()
    return tensors, out


def check_schedule(lrs, hp):
    """The lrs must follow the documented closed form (docs/fixtures.md)."""
    w, n = hp["warmup_steps"], hp["total_steps"]
    for s, lr in enumerate(lrs):
        if s < w:
            f = s / max(1, w)
        else:
            f = max(0.0, 0.5 * (1.0 + math.cos(math.pi * 2.0 * hp["num_cycles"] * (s - w) / max(1, n - w))))
        assert abs(lr - hp["lr"] * f) < 1e-12, (s, lr, f)


def build(name, spec, root):
    """Writes one fixture directory; returns the per-step clipping flags."""
    seed = spec["seed"]
    hp = dict(HPARAMS, seed=seed, **spec.get("overrides", {}))
    torch.manual_seed(seed)
    cfg = make_config(spec)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    model.train()  # no dropout in these configs; train mode as in a real run
    init_params(model, torch.Generator().manual_seed(seed))
    V = cfg.vocab_size

    out_dir = os.path.join(root, name)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)

    # The saved directory must reload to exactly these weights (tied lm_head included).
    reloaded = AutoModelForCausalLM.from_pretrained(out_dir, attn_implementation="eager", dtype=torch.float32)
    ref_sd, new_sd = model.state_dict(), reloaded.state_dict()
    assert ref_sd.keys() == new_sd.keys()
    for k in ref_sd:
        assert torch.equal(ref_sd[k], new_sd[k]), f"{name}: {k} changed through save_pretrained"
    del reloaded

    data_gen = torch.Generator().manual_seed(seed + 1)
    ids, labels, targets = make_batch(data_gen, V, sft_row=0, pad=cfg.pad_token_id)

    logits, loss, grads = forward_backward(model, ids, labels, autocast=False)
    bf_logits, bf_loss, bf_grads = forward_backward(model, ids, labels, autocast=True)
    model.zero_grad(set_to_none=True)

    # targets reproduce HF's shifted loss.
    assert torch.equal(ce_from_targets(logits, targets).reshape(1), loss), name
    assert torch.equal(ce_from_targets(bf_logits, targets).reshape(1), bf_loss), name
    if cfg.pad_token_id is not None:  # the padding index: no gradient from the lookup
        pad_row = grads["model.embed_tokens.weight"][cfg.pad_token_id]
        assert (ids == cfg.pad_token_id).sum() > 1 and not pad_row.any(), name

    tensors = {
        "input_ids": ids,
        "labels": labels,
        "targets": targets,
        "logits": logits,
        "loss": loss,
        "bf16.logits": bf_logits,
        "bf16.loss": bf_loss,
    }
    for n, g in grads.items():
        tensors["grad." + n] = g
    for n, g in bf_grads.items():
        tensors["bf16.grad." + n] = g

    train_tensors, traj = train(model, data_gen, V, hp)
    tensors.update(train_tensors)
    check_schedule(traj["lrs"], hp)
    clipped = [n + hp["clip_eps"] > hp["max_grad_norm"] for n in traj["grad_norms"]]
    assert any(clipped), f"{name}: clipping never triggered, norms {traj['grad_norms']}"

    meta = dict(hp)
    meta["model"] = name
    meta["fixture_format"] = 1
    meta["torch_version"] = torch.__version__
    meta["transformers_version"] = transformers.__version__
    meta["safetensors_version"] = safetensors.__version__
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    ref_path = os.path.join(out_dir, "reference.safetensors")
    # One metadata key only: safetensors writes __metadata__ from a hash map whose order
    # changes between processes, which would make the bytes differ from run to run.
    save_file(tensors, ref_path, metadata={"train": json.dumps(meta, sort_keys=True)})
    with open(os.path.join(out_dir, "train.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")

    verify(out_dir, model)
    worst, worst_noisy = replay(out_dir, hp)
    report(name, out_dir, loss, bf_loss, grads, traj, clipped)
    print(f"   hand-written optimizer replay: max abs difference {worst:.3g} "
          f"({worst_noisy:.3g} on elements with gradient RMS < {NOISY_GRAD_RMS})")
    return clipped


def verify(out_dir, model):
    """Reload with the safetensors library and recompute the loss from logits and targets."""
    ref = load_file(os.path.join(out_dir, "reference.safetensors"))
    for prefix in ("", "bf16."):
        lg, tg = ref[prefix + "logits"], ref["targets"]
        assert torch.equal(ce_from_targets(lg, tg).reshape(1), ref[prefix + "loss"])
        # Independent float64 recomputation: mean over non-ignored of logsumexp - logit[target].
        lg64 = lg.double().reshape(-1, lg.shape[-1])
        tg1 = tg.reshape(-1)
        keep = tg1 != IGNORE
        nll = torch.logsumexp(lg64[keep], dim=-1) - lg64[keep].gather(1, tg1[keep, None]).squeeze(1)
        assert abs(nll.mean().item() - ref[prefix + "loss"].item()) < 1e-5
    assert torch.equal(ref["targets"], shift_targets(ref["labels"]))
    assert torch.equal(ref["train.targets"].flatten(0, 1), shift_targets(ref["train.labels"].flatten(0, 1)))
    params = dict(ckpt_params(model))
    for n in params:
        for prefix in ("grad.", "bf16.grad.", "final.", "final_exp_avg.", "final_exp_avg_sq."):
            assert ref[prefix + n].dtype == torch.float32 and ref[prefix + n].shape == params[n].shape
    for k, v in ref.items():
        assert v.dtype in (torch.float32, torch.int64), k


def replay(out_dir, hp):
    """Replays the trajectory from the saved HF directory with the optimizer written out by
    hand exactly as docs/fixtures.md states it (no torch.optim, no scheduler object, no
    clip_grad_norm_), and checks it lands on the stored final state. This is what a C
    implementation has to do. Returns the largest absolute difference seen."""
    ref = load_file(os.path.join(out_dir, "reference.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(out_dir, attn_implementation="eager", dtype=torch.float32)
    model.train()
    params = dict(ckpt_params(model))
    m = {n: torch.zeros_like(p) for n, p in params.items()}
    v = {n: torch.zeros_like(p) for n, p in params.items()}
    b1, b2 = hp["betas"]
    w, n_total = hp["warmup_steps"], hp["total_steps"]
    worst = 0.0
    for s in range(STEPS):
        if s < w:
            lr = hp["lr"] * s / max(1, w)
        else:
            progress = (s - w) / max(1, n_total - w)
            lr = hp["lr"] * max(0.0, 0.5 * (1.0 + math.cos(math.pi * 2.0 * hp["num_cycles"] * progress)))
        model.zero_grad(set_to_none=True)
        ids, targets = ref["train.input_ids"][s], ref["train.targets"][s]
        logits = model(input_ids=ids).logits
        loss = ce_from_targets(logits, targets)
        loss.backward()
        with torch.no_grad():
            sq = sum(float(p.grad.double().pow(2).sum()) for p in params.values())
            norm = math.sqrt(sq)
            coef = min(1.0, hp["max_grad_norm"] / (norm + hp["clip_eps"]))
            t = s + 1
            bc1, bc2 = 1.0 - b1**t, 1.0 - b2**t
            for name, p in params.items():
                g = p.grad * coef
                wd = hp["weight_decay"] if p.ndim >= 2 else hp["weight_decay_1d"]
                p.mul_(1.0 - lr * wd)
                m[name] = m[name] + (1.0 - b1) * (g - m[name])
                v[name] = v[name] * b2 + (1.0 - b2) * g * g
                denom = v[name].sqrt() / math.sqrt(bc2) + hp["eps"]
                p.sub_((lr / bc1) * m[name] / denom)
        worst = max(worst, abs(loss.item() - ref["train.losses"][s].item()),
                    abs(norm - ref["train.grad_norms"][s].item()) / norm,
                    abs(lr - ref["train.lrs"][s].item()))
    worst_noisy = 0.0
    for name, p in params.items():
        # Elements whose gradient stays at rounding-noise size (|g| ~ 1e-7: qwen2's
        # k_proj.bias in the slowest-rotating RoPE pairs, where the bias is almost a
        # constant shift of every key and softmax cancels it) get an Adam step of
        # ~lr * sign(noise), so ulp differences anywhere move them by up to ~lr.
        noisy = ref["final_exp_avg_sq." + name].sqrt() < NOISY_GRAD_RMS
        for key, ours in (("final.", p), ("final_exp_avg.", m[name]), ("final_exp_avg_sq.", v[name])):
            diff = (ours.detach() - ref[key + name]).abs()
            worst = max(worst, diff[~noisy].max().item() if (~noisy).any() else 0.0)
            worst_noisy = max(worst_noisy, diff[noisy].max().item() if noisy.any() else 0.0)
    # Same model code, optimizer rewritten (float64 norm, no lerp/addcdiv kernels): a few
    # float32 ulps of O(0.1..1) values, grown mildly through 5 steps.
    assert worst < 1e-5, f"{out_dir}: hand-written replay differs by {worst}"
    # Noise-driven elements: bounded by the sum of the lrs (0.025) times Adam's |m|/sqrt(v) <= ~1.
    assert worst_noisy < 1e-3, f"{out_dir}: hand-written replay differs by {worst_noisy} on noisy elements"
    return worst, worst_noisy


def report(name, out_dir, loss, bf_loss, grads, traj, clipped):
    gnorm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])).item()
    print(f"== {name}: loss {loss.item():.6f} (bf16 {bf_loss.item():.6f}), grad norm {gnorm:.4f}")
    for s in range(STEPS):
        print(f"   step {s}: lr {traj['lrs'][s]:.6f} loss {traj['losses'][s]:.6f} "
              f"grad_norm {traj['grad_norms'][s]:.4f} {'CLIPPED' if clipped[s] else 'not clipped'}")
    for fn in sorted(os.listdir(out_dir)):
        p = os.path.join(out_dir, fn)
        with open(p, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
        print(f"   {fn:24s} {os.path.getsize(p):8d} bytes  sha256 {digest}")


def dir_size(root):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "models"))
    ap.add_argument("--only", nargs="*", choices=sorted(CONFIGS), help="build only these models")
    args = ap.parse_args()

    torch.set_num_threads(1)  # fixed reduction order: identical bytes on every run
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"safetensors {safetensors.__version__}")
    os.makedirs(args.out, exist_ok=True)
    clipped = []
    for name in args.only or CONFIGS:
        clipped += build(name, CONFIGS[name], args.out)
    if not args.only:
        assert not all(clipped), "no unclipped step in any trajectory: the clip coefficient's min(1, .) is untested"
    total = dir_size(args.out)
    print(f"total size of {os.path.normpath(args.out)}: {total} bytes ({total / 2**20:.2f} MiB)")
    if total >= SIZE_LIMIT:
        sys.exit(f"fixtures are {total} bytes, over the {SIZE_LIMIT} byte budget: shrink the models")


if __name__ == "__main__":
    main()
