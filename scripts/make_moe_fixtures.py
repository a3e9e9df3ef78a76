#!/usr/bin/env python3
"""Builds the mixture-of-experts reference fixtures (docs/fixtures.md, "MoE models").

For each small random Mixtral / Qwen2-MoE / Qwen3-MoE model below it writes
tests/fixtures/models/<name>/ as scripts/make_fixtures.py does for the dense models:
  config.json, model.safetensors   save_pretrained's output: one tensor per expert
  fused/                           the same model saved with save_original_format=False
                                   (fused expert tensors), for the loader's other layout
  reference.safetensors            logits, loss and gradients without and with the router's
                                   auxiliary loss, and a 5-step AdamW trajectory with it
  train.json                       hyperparameters and provenance
Gradients and optimizer states are stored under the checkpoint's per-expert names (the
slices of transformers' fused 3-D parameters), so a test finds them by the names it loads.

With --roundtrip PATH/megatrain it also checks megatrain against transformers end to end:
`megatrain init` makes a tiny qwen3_moe, `megatrain train` trains it on the CPU (the loss
must go down) and saves it in shards; transformers loads that directory and its logits must
match megatrain's (fp32, relative error <= 1e-5). The trained directory and transformers'
logits are committed as tests/fixtures/models/qwen3_moe_trained/ so that `make test`
repeats the comparison without torch.

Usage: python scripts/make_moe_fixtures.py [--out DIR] [--only NAME ...] [--roundtrip BIN]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import safetensors
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (shared batch, schedule and size helpers)

# Smallest gap between the K-th and (K+1)-th routing probability of any token, MoE layer
# and forward of a fixture. fp32 differences between implementations move the
# probabilities by ~1e-7; a gap this size cannot be closed by them, so both sides select
# the same experts (the selection is discontinuous: a flip would change the output).
ROUTING_MARGIN = 1e-4

# The router's auxiliary-loss coefficient of the fixtures: larger than the published 0.001
# (Qwen) / 0.02 (Mixtral) so that the aux loss's share of the router gradient is large
# enough for a test to see it (checked: at least MIN_AUX_SHARE of each router gradient).
AUX_COEF = 0.1
MIN_AUX_SHARE = 0.05

CONFIGS = {
    "mixtral_moe": dict(
        seed=5678,
        fused=True,
        model_type="mixtral",
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        router_aux_loss_coef=AUX_COEF,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
        max_position_embeddings=64,
        sliding_window=None,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    ),
    # three blocks, the middle one dense (mlp_only_layers), a shared expert with its
    # sigmoid gate, no renormalisation of the top-k weights (Qwen1.5-MoE's setting),
    # q/k/v biases and tied embeddings
    "qwen2_moe_shared": dict(
        seed=6790,
        fused=True,
        model_type="qwen2_moe",
        num_hidden_layers=3,
        num_key_value_heads=2,
        intermediate_size=40,
        moe_intermediate_size=12,
        shared_expert_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        router_aux_loss_coef=AUX_COEF,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
        use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    ),
    # q/k norm, MQA, head_dim != C / NH, 8 experts top-2 renormalised (Qwen3's setting)
    "qwen3_moe_qknorm": dict(
        seed=7892,
        model_type="qwen3_moe",
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=40,
        moe_intermediate_size=12,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        router_aux_loss_coef=AUX_COEF,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
        use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
    ),
}


def make_config(spec):
    """mf.make_config, letting a model override the shared fields (num_hidden_layers)."""
    spec = {k: v for k, v in spec.items() if k not in ("seed", "overrides", "fused")}
    model_type = spec.pop("model_type")
    cfg = transformers.AutoConfig.for_model(model_type, **dict(mf.COMMON, **spec))
    cfg._attn_implementation = "eager"
    return cfg


def init_params(model, gen):
    """As make_fixtures.init_params, with the 3-D fused expert tensors drawn like matrices."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if p.ndim >= 2:
                p.copy_(mf.WEIGHT_STD * noise)
            elif name.endswith(".bias"):
                p.copy_(mf.BIAS_STD * noise)
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + mf.NORM_STD * noise)
            else:
                raise ValueError(f"no init rule for parameter {name} {tuple(p.shape)}")


def checkpoint_tensors(model_type, name, t):
    """(checkpoint name, tensor) pairs of one parameter: transformers 5 holds a block's experts
    as experts.gate_up_proj (E, 2F, C) (gate rows first) and experts.down_proj (E, C, F),
    and mixtral's block under mlp.; the checkpoints name one tensor per expert."""
    m = re.fullmatch(r"(model\.layers\.\d+\.)mlp\.(.+)", name)
    if not m or not (m.group(2).startswith("experts.") or m.group(2) == "gate.weight"):
        return [(name, t)]
    mixtral = model_type == "mixtral"
    prefix = m.group(1) + ("block_sparse_moe." if mixtral else "mlp.")
    rest = m.group(2)
    gate, up, down = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    if rest == "experts.gate_up_proj":
        F = t.shape[1] // 2
        out = []
        for e in range(t.shape[0]):
            out.append((f"{prefix}experts.{e}.{gate}.weight", t[e, :F]))
            out.append((f"{prefix}experts.{e}.{up}.weight", t[e, F:]))
        return out
    if rest == "experts.down_proj":
        return [(f"{prefix}experts.{e}.{down}.weight", t[e]) for e in range(t.shape[0])]
    return [(prefix + rest, t)]


def per_expert(model_type, named):
    out = {}
    for name, t in named.items():
        for n, x in checkpoint_tensors(model_type, name, t):
            out[n] = x.detach().clone().contiguous()
    return out


def routing_margin(router_logits, K):
    """Smallest gap between the K-th and (K+1)-th probability over all rows and layers."""
    worst = float("inf")
    for z in router_logits:
        p = torch.softmax(z.float(), dim=-1).sort(dim=-1, descending=True).values
        if p.shape[-1] > K:
            worst = min(worst, (p[:, K - 1] - p[:, K]).min().item())
    return worst


def forward_backward(model, ids, labels, aux):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels, output_router_logits=True)
    loss = out.loss if aux else mf.ce_from_targets(out.logits, mf.shift_targets(labels))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return out, loss.detach().float().reshape(1), grads


def train(model, gen, V, hp, K):
    """mf.train with the auxiliary loss on (output_router_logits=True), recording the routing
    margin of every step."""
    opt = torch.optim.AdamW(mf.param_groups(model, hp), lr=hp["lr"], betas=tuple(hp["betas"]),
                            eps=hp["eps"], foreach=False, fused=False)
    sched = transformers.get_cosine_schedule_with_warmup(
        opt, num_warmup_steps=hp["warmup_steps"], num_training_steps=hp["total_steps"])
    out = {k: [] for k in ("input_ids", "labels", "targets", "losses", "grad_norms", "lrs")}
    margin = float("inf")
    for s in range(mf.STEPS):
        ids, labels, targets = mf.make_batch(gen, V, sft_row=s % mf.B)
        lr = sched.get_last_lr()[0]
        opt.zero_grad(set_to_none=True)
        res = model(input_ids=ids, labels=labels, output_router_logits=True)
        margin = min(margin, routing_margin(res.router_logits, K))
        res.loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), hp["max_grad_norm"])
        opt.step()
        sched.step()
        for k, v in (("input_ids", ids), ("labels", labels), ("targets", targets)):
            out[k].append(v)
        out["losses"].append(res.loss.item())
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
    params = dict(model.named_parameters())
    for prefix, get in (("final.", lambda p: p),
                        ("final_exp_avg.", lambda p: opt.state[p]["exp_avg"]),
                        ("final_exp_avg_sq.", lambda p: opt.state[p]["exp_avg_sq"])):
        for n, x in per_expert(model.config.model_type, {k: get(p) for k, p in params.items()}).items():
            tensors[prefix + n] = x
    return tensors, out, margin


def build(name, spec, root):
    seed = spec["seed"]
    hp = dict(mf.HPARAMS, seed=seed, **spec.get("overrides", {}))
    torch.manual_seed(seed)
    cfg = make_config(spec)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    model.train()
    init_params(model, torch.Generator().manual_seed(seed))
    V, K, mt = cfg.vocab_size, cfg.num_experts_per_tok, cfg.model_type

    out_dir = os.path.join(root, name)
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    dirs = [out_dir]
    if spec.get("fused"):  # the other layout, for mixtral (also renamed) and one qwen type
        dirs.append(os.path.join(out_dir, "fused"))
        model.save_pretrained(dirs[1], safe_serialization=True, save_original_format=False)
    for d in dirs:
        reloaded = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32)
        ref_sd, new_sd = model.state_dict(), reloaded.state_dict()
        assert ref_sd.keys() == new_sd.keys()
        for k in ref_sd:
            assert torch.equal(ref_sd[k], new_sd[k]), f"{d}: {k} changed through save_pretrained"
    saved = set(load_file(os.path.join(out_dir, "model.safetensors")).keys())
    assert not any(".experts.gate_up_proj" in k for k in saved), f"{name}: per-expert layout expected"
    if spec.get("fused"):
        os.remove(os.path.join(dirs[1], "generation_config.json"))
        fused = set(load_file(os.path.join(dirs[1], "model.safetensors")).keys())
        assert any(".experts.gate_up_proj" in k for k in fused), f"{name}: fused/ is not fused"

    data_gen = torch.Generator().manual_seed(seed + 1)
    ids, labels, targets = mf.make_batch(data_gen, V, sft_row=0)
    res, loss, grads = forward_backward(model, ids, labels, aux=False)
    margin = routing_margin(res.router_logits, K)
    res_aux, aux_loss_total, aux_grads = forward_backward(model, ids, labels, aux=True)
    model.zero_grad(set_to_none=True)
    assert torch.equal(res.logits, res_aux.logits)
    assert torch.equal(mf.ce_from_targets(res.logits, targets).reshape(1), loss), name
    # HF's loss with the aux loss on is CE + coef * aux
    expect = loss.double() + cfg.router_aux_loss_coef * res_aux.aux_loss.double()
    assert abs(expect.item() - aux_loss_total.item()) < 1e-6, (expect, aux_loss_total)

    tensors = {"input_ids": ids, "labels": labels, "targets": targets,
               "logits": res.logits.detach().float(), "loss": loss, "aux.loss": aux_loss_total,
               "aux.aux_loss": res_aux.aux_loss.detach().float().reshape(1)}
    g, ga = per_expert(mt, grads), per_expert(mt, aux_grads)
    assert set(g) == saved, sorted(set(g) ^ saved)
    for n in g:
        tensors["grad." + n] = g[n]
        tensors["aux.grad." + n] = ga[n]
        if n.endswith("gate.weight") and "shared" not in n:  # routers: the aux loss shows
            share = ((ga[n] - g[n]).norm() / ga[n].norm()).item()
            assert share > MIN_AUX_SHARE, f"{name}: aux share of {n}'s gradient is {share:.3g}"

    train_tensors, traj, train_margin = train(model, data_gen, V, hp, K)
    tensors.update(train_tensors)
    mf.check_schedule(traj["lrs"], hp)
    margin = min(margin, train_margin)
    assert margin > ROUTING_MARGIN, f"{name}: routing margin {margin:.3g}: pick another seed"
    clipped = [n + hp["clip_eps"] > hp["max_grad_norm"] for n in traj["grad_norms"]]
    assert any(clipped), f"{name}: clipping never triggered"

    meta = dict(hp, model=name, fixture_format=1, router_aux_loss_in_trajectory=True,
                routing_margin=margin, torch_version=torch.__version__,
                transformers_version=transformers.__version__,
                safetensors_version=safetensors.__version__)
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    save_file(tensors, os.path.join(out_dir, "reference.safetensors"),
              metadata={"train": json.dumps(meta, sort_keys=True)})
    with open(os.path.join(out_dir, "train.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"== {name}: loss {loss.item():.6f}, with aux {aux_loss_total.item():.6f} "
          f"(aux {res_aux.aux_loss.item():.6f}), routing margin {margin:.3g}")
    for s in range(mf.STEPS):
        print(f"   step {s}: lr {traj['lrs'][s]:.6f} loss {traj['losses'][s]:.6f} "
              f"grad_norm {traj['grad_norms'][s]:.4f} {'CLIPPED' if clipped[s] else 'not clipped'}")


def run(*cmd):
    print("   $", " ".join(cmd))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def roundtrip(binary, root):
    """megatrain init + train (CPU) of a tiny qwen3_moe; transformers loads the result."""
    here = os.path.dirname(os.path.abspath(__file__))
    tok = os.path.join(here, "..", "tests", "fixtures", "tokenizer", "tiny_bytelevel.json")
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.jsonl")
        gen = torch.Generator().manual_seed(3)
        words = "the a river boat old man woman walked saw near by city morning night red green".split()
        with open(data, "w") as f:
            for _ in range(200):
                idx = torch.randint(0, len(words), (40,), generator=gen).tolist()
                f.write(json.dumps({"text": " ".join(words[i] for i in idx)}) + "\n")
        init, out = os.path.join(tmp, "init"), os.path.join(tmp, "run")
        run(binary, "init", "--tokenizer", tok, "--out", init, "--model-type", "qwen3_moe",
            "--hidden", "32", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn", "16",
            "--experts", "4", "--experts-per-tok", "2", "--max-pos", "64", "--std", "0.1",
            "--seed", "3")
        # shards of 20 kB: several files and an index, as a large model is saved
        run(binary, "train", "--model", init, "--data", data, "--out", out, "--device", "cpu",
            "--seq-len", "32", "--batch-size", "4", "--micro-batches", "2", "--steps", "30",
            "--lr", "3e-3", "--warmup-steps", "2", "--save-dtype", "fp32", "--router-aux-loss",
            "--max-shard-size", "0.00002", "--log-every", "1", "--save-every", "0",
            "--sample-tokens", "0")
        with open(os.path.join(out, "metrics.jsonl")) as f:
            losses = [json.loads(line)["loss"] for line in f]
        print(f"   megatrain train: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {len(losses)} steps")
        assert losses[-1] < losses[0] - 0.1, f"the loss did not go down: {losses}"
        model_dir = os.path.join(out, "model")
        shards = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
        assert len(shards) > 1 and os.path.exists(os.path.join(model_dir, "model.safetensors.index.json")), shards
        ours_path = os.path.join(tmp, "ours.safetensors")
        run(binary, "eval", "--model", model_dir, "--data", data, "--device", "cpu", "--seq-len", "16",
            "--batch-size", "1", "--max-batches", "1", "--dump-logits", ours_path)
        ours = load_file(ours_path)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                     attn_implementation="eager").eval()
        ids = ours["input_ids"].long()[None]
        with torch.no_grad():
            ref = model(ids).logits[0].float()
        err = ((ours["logits"] - ref).norm() / ref.norm()).item()
        print(f"   transformers from_pretrained vs megatrain logits: rel err {err:.2e}")
        # fp32 on both sides: summation order only, ~1e-7
        assert err <= 1e-5, err
        dest = os.path.join(root, "qwen3_moe_trained")
        if os.path.exists(dest):
            shutil.rmtree(dest)
        os.makedirs(dest)
        for fn in os.listdir(model_dir):
            if fn == "config.json" or fn.startswith("model"):
                shutil.copy(os.path.join(model_dir, fn), dest)
        path = os.path.join(dest, "hf_logits.safetensors")
        save_file({"input_ids": ids[0].to(torch.int64).contiguous(), "logits": ref.contiguous()},
                  path, metadata={"transformers_version": transformers.__version__})
        os.chmod(path, 0o644)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "models"))
    ap.add_argument("--only", nargs="*", choices=sorted(CONFIGS), help="build only these models")
    ap.add_argument("--roundtrip", metavar="MEGATRAIN", help="also run the init/train/load check")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"safetensors {safetensors.__version__}")
    os.makedirs(args.out, exist_ok=True)
    for name in (args.only if args.only is not None else CONFIGS):
        build(name, CONFIGS[name], args.out)
    if args.roundtrip:
        roundtrip(args.roundtrip, args.out)
    total = mf.dir_size(args.out)
    print(f"total size of {os.path.normpath(args.out)}: {total} bytes ({total / 2**20:.2f} MiB)")
    if total >= mf.SIZE_LIMIT:
        sys.exit(f"fixtures are {total} bytes, over the {mf.SIZE_LIMIT} byte budget: shrink the models")


if __name__ == "__main__":
    main()
