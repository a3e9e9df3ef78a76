# %% [markdown]
# # Training from a `datasets.Dataset`, with the loss curve
#
# The built-in tiny model (0.12M parameters, byte tokenizer) learns the text
# of this repository's documentation, one paragraph a document, given to
# megatrain as a Hugging Face `datasets.Dataset`. Then the loss curve is
# drawn with matplotlib, and the trained model continues a prompt.
#
#     pip install ./python datasets matplotlib
#     python examples/train_from_datasets.py       # minutes on a CPU
#
# Each `# %%` cell runs on its own in Jupyter or VS Code too. Without
# `datasets`, a list of dicts serves in its place: megatrain takes any
# iterable of {"text": ...} (or prompt/completion, or chat) records.

# %%
import glob
import os

import megatrain

# The loss curve needs matplotlib: said now, not after minutes of training.
try:
    import matplotlib
except ImportError:
    raise SystemExit("train_from_datasets.py draws the loss curve with matplotlib: "
                     "pip install matplotlib") from None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "runs", "from-datasets")
PNG = os.path.join(OUT, "loss.png")
STEPS = 600

# %% The data: every paragraph of README.md and docs/*.md, one record each.
paragraphs = []
for path in [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
    with open(path, encoding="utf-8") as f:
        paragraphs += [p.strip() for p in f.read().split("\n\n") if p.strip()]
try:
    from datasets import Dataset
    data = Dataset.from_dict({"text": paragraphs})
except ImportError:
    print("datasets is not installed (pip install datasets): a list of dicts instead")
    data = [{"text": p} for p in paragraphs]
print(f"{len(paragraphs)} paragraphs, {sum(map(len, paragraphs)) / 1e3:.0f} kB")

# %% Training, one step at a time. The options are those of `megatrain
# train` (docs/config.md); with no `model`, the built-in tiny one, whose
# defaults suit a CPU (rows of 64 bytes, lr 1e-2). 600 steps are about 8
# passes over the 72 kB. overwrite: each time the example runs, it trains
# afresh in OUT (resume="auto" would continue the run there instead).
config = {"out": OUT, "steps": STEPS, "epochs": 10, "save_every": 200, "log_every": 50,
          "sample_tokens": 0, "overwrite": True}
steps, losses = [], []
with megatrain.Run(config, data=data, on_event=megatrain.print_event) as run:
    for m in run.metrics():
        steps.append(m["step"])
        losses.append(m["loss"])
    run.finish()  # the model in OUT/model
print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "nothing left to train")

# %% The loss curve, from OUT/metrics.jsonl (every step of the run, resumed or not).
import json

matplotlib.use("Agg")  # a file, no window; drop it in a notebook
import matplotlib.pyplot as plt

with open(os.path.join(OUT, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
fig, ax = plt.subplots(figsize=(7, 4))
ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], lw=1)
ax.set(xlabel="step", ylabel="training loss (nats per byte)",
       title="megatrain tiny model on the repository's docs, from a datasets.Dataset")
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(PNG, dpi=110)
print(f"loss curve: {PNG}")

# %% What it learned: a continuation of a prompt, sampled (temperature 0.8,
# top_p 0.95), with the byte tokenizer of the tiny model. Spelling comes
# later than this.
print(megatrain.generate(os.path.join(OUT, "model"), "The model ", tokenizer="bytes",
                         max_new_tokens=80))
