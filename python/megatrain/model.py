"""Models (mt_model): a Hugging Face model directory in host memory, its
evaluation and generation; and new models with random weights (init)."""
import ctypes
import json
import os

from . import _events, _lib, hub
from .data import source
from .records import TempJsonl
from .tokenizer import Tokenizer


def _set(struct, values):
    """Sets the struct's fields from values, leaving those given as None at
    the library's defaults; an unknown name is a TypeError."""
    names = {n for n, _ in struct._fields_}
    for k, v in values.items():
        if k not in names:
            raise TypeError(f"unknown argument '{k}' (allowed: {', '.join(sorted(names))})")
        if v is None:
            continue
        t = dict(struct._fields_)[k]
        setattr(struct, k, _lib.enc(v) if t is ctypes.c_char_p else _lib.to_c(k, t, v))


class Model(_lib.Handle):
    """A Hugging Face model directory (config.json, safetensors), or a Hub
    name (megatrain.hub: downloaded with huggingface_hub, or found in its
    cache), and its
    tokenizer (None: DIR/tokenizer.json; "bytes": the built-in one), the
    weights read into host memory in fp32. Close it (or use `with`)."""
    _kind = "model"

    def __init__(self, path, tokenizer=None):
        self.path = hub.model_dir(os.fspath(path))
        self._h = _lib.check(_lib.lib().mt_model_open(_lib.enc(self.path), _lib.enc(tokenizer)))


    @property
    def info(self):
        """model_type, n_params, layers, hidden, heads, kv_heads, ffn,
        vocab_size, max_positions, tied_embeddings."""
        i = _lib.ModelInfo()
        with self.use() as h:
            _lib.lib().mt_model_describe(h, ctypes.byref(i))
        return _lib.struct_dict(i)

    @property
    def tokenizer(self):
        """The model's tokenizer (valid while the model is open)."""
        with self.use() as h:
            return Tokenizer(_borrowed=_lib.lib().mt_model_tokenizer(h), _owner=self)

    def generate(self, prompt="", *, messages=None, on_text=None, **opts):
        """Continues the prompt (stopping at EOS or after max_new_tokens);
        returns the prompt and its continuation. With messages (a list of
        {"role", "content"} dicts, or {"messages": [...], "tools": [...]}),
        a chat reply instead: the messages rendered with the model's chat
        template (or chat_template, a built-in's name) and
        add_generation_prompt, the reply stopping at EOS or a token that
        ends a turn; only the reply is returned. on_text(piece) gets the
        text as it comes (as `megatrain generate` prints it: a line break
        last). opts: max_new_tokens (64), temperature (0.8; 0 greedy),
        top_p (0.95), seed (1), context (0: min(512, max positions)), device
        ("auto"), add_special (True: BOS before the prompt), chat_template."""
        if messages is not None:
            if prompt:
                raise TypeError("generate: give a prompt or messages, not both")
            try:
                opts["messages"] = json.dumps(messages, ensure_ascii=False)
            except (TypeError, ValueError) as e:
                raise TypeError(f"generate: messages must be a list of {{'role': ..., "
                                f"'content': ...}} dicts of text ({e})") from None
        L = _lib.lib()
        o = _lib.GenerateOpts()
        L.mt_generate_opts_defaults(ctypes.byref(o))
        _set(o, dict(opts, prompt=prompt))
        cb = _events.Callback(lambda ev: on_text(ev.text) if on_text and ev.kind == "text"
                              else None)
        with self.use() as h:
            p = L.mt_model_generate(h, ctypes.byref(o), cb.c_fn, None)
        cb.raise_pending()
        _lib.check(p)
        return _lib.take_string(p)

    def eval(self, data, **opts):
        """Mean loss and perplexity on data (a JSONL or .mtok path, or
        records: see megatrain.data), read once in order in batches of
        batch_size rows of seq_len tokens. opts: format, chat_template, packing,
        micro_batches (1),
        seq_len (0: the model's max positions, at most 1024), batch_size (4),
        max_batches (0: all), device, text_field,
        precision, dump_logits, split; for preference pairs {prompt, chosen,
        rejected}: objective ("dpo", "simpo", "orpo"), loss_type, beta,
        label_smoothing, gamma, lambda_ (or "lambda"), ref_model (dpo's
        reference model directory), skip_bad_pairs. Returns loss, perplexity,
        tokens, batches and, for pairs, TRL's rewards_chosen,
        rewards_rejected, rewards_accuracies, rewards_margins, logps_chosen,
        logps_rejected, pairs, skipped_pairs."""
        L = _lib.lib()
        split = opts.pop("split", None)
        if "lambda_" in opts:  # `lambda` is a Python keyword
            opts["lambda"] = opts.pop("lambda_")
        o = _lib.EvalOpts()
        L.mt_eval_opts_defaults(ctypes.byref(o))
        _set(o, opts)
        res = _lib.EvalResult()
        field = opts.get("text_field")
        kind, src = source(data, split, field)

        def run(path):
            o.data = _lib.enc(path)
            with self.use() as h:
                rc = L.mt_model_eval(h, ctypes.byref(o), ctypes.byref(res))
            _lib.check(rc)

        if kind == "path":
            run(src)
        else:
            with TempJsonl(src, field) as path:
                run(path)
        return _lib.struct_dict(res)

    def _release(self, h):
        _lib.lib().mt_model_close(h)


def _with_model(model, tokenizer, fn):
    if isinstance(model, Model):
        return fn(model)
    with Model(model, tokenizer) as m:
        return fn(m)


def generate(model, prompt="", *, messages=None, tokenizer=None, on_text=None, **opts):
    """Continues prompt with a model (a Model or an HF directory); returns
    the text (prompt and continuation), or with messages the chat reply.
    See Model.generate."""
    return _with_model(model, tokenizer, lambda m: m.generate(prompt, messages=messages,
                                                              on_text=on_text, **opts))


def eval(model, data, *, tokenizer=None, **opts):  # noqa: A001 (megatrain eval)
    """A model's (a Model or an HF directory) loss and perplexity on data.
    See Model.eval."""
    return _with_model(model, tokenizer, lambda m: m.eval(data, **opts))


def init(path, tokenizer, **shape):
    """Writes a new model with random weights to path (which must not
    exist), as an HF directory in fp32 with the tokenizer's files; the
    tokenizer (a tokenizer.json or "bytes") sets the vocabulary. shape:
    hidden (1024), layers (12), heads (16), kv_heads (4), ffn (2816),
    max_positions (2048), rope_theta, init_std (0.02), untied (False), seed
    (1), model_type ("llama"; also "mistral", "qwen2", "qwen3", "phi3", and the
    mixture-of-experts "mixtral", "qwen2_moe", "qwen3_moe" with experts (8),
    experts_per_tok (2), expert_ffn, shared_expert_ffn, norm_topk). Returns
    what was written (as Model.info)."""
    L = _lib.lib()
    s = _lib.ModelShape()
    L.mt_model_shape_defaults(ctypes.byref(s))
    _set(s, shape)
    info = _lib.ModelInfo()
    _lib.check(L.mt_model_init(_lib.enc(os.fspath(path)), _lib.enc(os.fspath(tokenizer)),
                               ctypes.byref(s), ctypes.byref(info)))
    return _lib.struct_dict(info)
