"""Tokenizers (mt_tokenizer): a Hugging Face tokenizer.json, or "bytes"."""
import ctypes
import os

from . import _lib


class Tokenizer(_lib.Handle):
    """A tokenizer.json (with the BOS/EOS of a tokenizer_config.json beside
    it), or "bytes": the built-in byte tokenizer (ids 0-255 the bytes, 256
    BOS, 257 EOS). Close it (or use `with`) to release it at once."""
    _kind = "tokenizer"

    def __init__(self, path="bytes", *, _borrowed=None, _owner=None):
        L = _lib.lib()
        if _borrowed is not None:
            # a model's tokenizer: valid as long as the model; keep it alive
            self._h, self._owned, self._owner = _borrowed, False, _owner
            self.path = None
            return
        self.path = os.fspath(path)
        self._h = _lib.check(L.mt_tokenizer_open(_lib.enc(self.path)))
        self._owned, self._owner = True, None


    def encode(self, text, add_special=False):
        """The ids of text, as HF `tokenizers` gives them; add_special: with
        the template's special tokens (BOS)."""
        L = _lib.lib()
        b = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        ids, n = ctypes.POINTER(ctypes.c_int32)(), ctypes.c_size_t()
        _lib.check(L.mt_tokenizer_tokenize(self.handle, b, len(b), add_special, ctypes.byref(ids),
                                           ctypes.byref(n)))
        try:
            return ids[:n.value]
        finally:
            L.mt_free(ids)

    def decode(self, ids, skip_special=False):
        """The text of ids through the tokenizer's decoder."""
        L = _lib.lib()
        ids = list(ids)
        arr = (ctypes.c_int32 * len(ids))(*ids)
        p = L.mt_tokenizer_decode(self.handle, arr, len(ids), skip_special)
        _lib.check(p)
        return _lib.take_string(p)

    @property
    def vocab_size(self):
        return _lib.lib().mt_tokenizer_vocab_size(self.handle)

    @property
    def bos_id(self):
        """None when the tokenizer has none."""
        v = _lib.lib().mt_tokenizer_bos_id(self.handle)
        return None if v < 0 else v

    @property
    def eos_id(self):
        v = _lib.lib().mt_tokenizer_eos_id(self.handle)
        return None if v < 0 else v

    def token_id(self, token):
        """The id of a token spelled as in tokenizer.json, or None."""
        v = _lib.lib().mt_tokenizer_token_id(self.handle, _lib.enc(token))
        return None if v < 0 else v

    def _release(self, h):
        if self._owned:
            _lib.lib().mt_tokenizer_free(h)


def as_tokenizer(tok):
    """(Tokenizer, owned): a Tokenizer as it is, or one opened from a path."""
    if isinstance(tok, Tokenizer):
        return tok, False
    return Tokenizer(tok), True
