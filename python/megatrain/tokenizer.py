"""Tokenizers (mt_tokenizer): a Hugging Face tokenizer.json, or "bytes"."""
import ctypes
import os

from . import _lib


class Tokenizer(_lib.Handle):
    """A tokenizer.json (with the BOS/EOS of a tokenizer_config.json beside
    it), or "bytes": the built-in byte tokenizer (ids 0-255 the bytes, 256
    BOS, 257 EOS). Close it (or use `with`) to release it at once."""
    _kind = "tokenizer"
    _owned, _owner = False, None

    def __init__(self, path="bytes", *, _borrowed=None, _owner=None):
        L = _lib.lib()
        if _borrowed is not None:
            # a model's tokenizer: valid as long as the model, whose lock it takes
            self._h, self._owned, self._owner = _borrowed, False, _owner
            self._guard = _owner._guard
            self.path = None
            return
        self.path = os.fspath(path)
        self._h = _lib.check(L.mt_tokenizer_open(_lib.enc(self.path)))
        self._owned = True

    def _check_open(self):
        super()._check_open()
        if self._owner is not None:
            self._owner._check_open()

    def _call(self, fn, *args):
        with self.use() as h:
            return fn(h, *args)

    def encode(self, text, add_special=False):
        """The ids of text, as HF `tokenizers` gives them; add_special: with
        the template's special tokens (BOS)."""
        L = _lib.lib()
        b = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        ids, n = ctypes.POINTER(ctypes.c_int32)(), ctypes.c_size_t()
        _lib.check(self._call(L.mt_tokenizer_tokenize, b, len(b), add_special, ctypes.byref(ids),
                              ctypes.byref(n)))
        try:
            return ids[:n.value]
        finally:
            L.mt_free(ids)

    def decode(self, ids, skip_special=False):
        """The text of ids through the tokenizer's decoder."""
        L = _lib.lib()
        arr = _lib.int_array("ids", ctypes.c_int32, ids)
        p = self._call(L.mt_tokenizer_decode, arr, len(arr), skip_special)
        _lib.check(p)
        return _lib.take_string(p)

    @property
    def vocab_size(self):
        return self._call(_lib.lib().mt_tokenizer_vocab_size)

    @property
    def bos_id(self):
        """None when the tokenizer has none."""
        v = self._call(_lib.lib().mt_tokenizer_bos_id)
        return None if v < 0 else v

    @property
    def eos_id(self):
        v = self._call(_lib.lib().mt_tokenizer_eos_id)
        return None if v < 0 else v

    def token_id(self, token):
        """The id of a token spelled as in tokenizer.json, or None."""
        v = self._call(_lib.lib().mt_tokenizer_token_id, _lib.enc(token))
        return None if v < 0 else v

    def close(self):
        if self._owned:
            super().close()
        else:
            self._h = None  # the model's: released with it

    def _release(self, h):
        _lib.lib().mt_tokenizer_free(h)


def as_tokenizer(tok):
    """(Tokenizer, owned): a Tokenizer as it is, or one opened from a path."""
    if isinstance(tok, Tokenizer):
        return tok, False
    return Tokenizer(tok), True
