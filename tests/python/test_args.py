"""Arguments that do not fit (issue 29, item 9): ctypes keeps only the low
bits of a Python int (2**64 + 3 became 3, -1 became 2**64 - 1), so every
integer the package hands the library is checked first (_lib.to_c); a
property test draws integers around every boundary of every integer type
and requires each to come back exactly or be refused, never wrapped. Sizes
the library refuses: more new tokens than the model has positions, a
temperature that is not a finite number >= 0, a --steps past 2**53."""
import ctypes
import math
import random

import pytest

import megatrain
from megatrain import _lib
from megatrain_testlib import SMALL_RUN, TOKENIZER, run_cli

INT_TYPES = [ctypes.c_int, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64, ctypes.c_size_t]


def draws(rng, n=400):
    """Integers near 0, near every power of two up to 2**130 (the bounds of
    each type are among them), and anywhere in between, with both signs."""
    out = [0, 1, -1]
    for k in range(0, 131):
        for d in (-2, -1, 0, 1, 2):
            out += [2**k + d, -(2**k) + d]
    out += [rng.randrange(-2**130, 2**130) for _ in range(n)]
    out += [rng.randrange(-2**70, 2**70) for _ in range(n)]
    return out


@pytest.mark.parametrize("ctype", INT_TYPES, ids=lambda t: t.__name__)
def test_an_integer_is_kept_exactly_or_refused_never_wrapped(ctype):
    rng = random.Random(ctype.__name__)
    bits = 8 * ctypes.sizeof(ctype)
    signed = ctype(-1).value == -1
    lo, hi = (-2**(bits - 1), 2**(bits - 1) - 1) if signed else (0, 2**bits - 1)

    class S(ctypes.Structure):
        _fields_ = [("x", ctype)]

    for v in draws(rng):
        s = S()
        if lo <= v <= hi:
            s.x = _lib.to_c("x", ctype, v)
            assert s.x == v
            assert list(_lib.int_array("ids", ctype, [v])) == [v]
        else:
            with pytest.raises(ValueError, match=f"x: {v} does not fit"):
                _lib.to_c("x", ctype, v)


def test_other_kinds_are_refused():
    with pytest.raises(TypeError):
        _lib.to_c("seed", ctypes.c_uint64, 1.5)
    with pytest.raises(TypeError):
        _lib.to_c("seed", ctypes.c_uint64, True)
    with pytest.raises(ValueError, match="too large for a double"):
        _lib.to_c("temperature", ctypes.c_double, 2**2000)
    assert _lib.to_c("temperature", ctypes.c_double, 2**1000) == float(2**1000)
    with pytest.raises(TypeError):
        _lib.to_c("add_special", ctypes.c_bool, 2)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("args") / "model"
    megatrain.init(d, TOKENIZER, hidden=32, layers=1, heads=2, kv_heads=1, ffn=64,
                   max_positions=64)
    return d


def test_the_calls_refuse_what_does_not_fit(tmp_path, model):
    with pytest.raises(ValueError, match="max_new_tokens: 18446744073709551619 does not fit"):
        megatrain.generate(model, "x", max_new_tokens=2**64 + 3, device="cpu")
    with pytest.raises(ValueError, match="seed: -1 does not fit"):
        megatrain.generate(model, "x", seed=-1, device="cpu")
    with pytest.raises(ValueError, match="hidden: 18446744073709551616 does not fit"):
        megatrain.init(tmp_path / "m", TOKENIZER, hidden=2**64)
    with megatrain.Tokenizer(TOKENIZER) as tok:
        with pytest.raises(ValueError, match=r"ids\[1\]: 4294967361 does not fit"):
            tok.decode([65, 2**32 + 65])
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello there"}\n' * 20)
    with pytest.raises(ValueError, match="seed: 18446744073709551619 does not fit"):
        megatrain.Dataset(data, TOKENIZER, seed=2**64 + 3)
    with megatrain.Dataset(data, TOKENIZER) as d:
        with pytest.raises(ValueError, match="rows: 18446744073709551619 does not fit"):
            d.next_batch(2**64 + 3, 4)
        with pytest.raises(ValueError, match="at least 1"):
            d.next_batch(0, 4)
    # options are text the library reads: an integer past 2**53 is refused there
    with pytest.raises(megatrain.MegatrainError, match="steps: must be at most 9007199254740992"):
        megatrain.Run(dict(SMALL_RUN, out=tmp_path / "run", steps=2**64 + 3))


def test_sizes_past_the_model_and_non_numbers_are_refused(tmp_path, model):
    with pytest.raises(megatrain.MegatrainError, match="more than the model's 64 positions"):
        megatrain.generate(model, "x", max_new_tokens=10**9, device="cpu")
    for t in (math.nan, math.inf, -1.0):
        with pytest.raises(megatrain.MegatrainError, match="finite temperature"):
            megatrain.generate(model, "x", temperature=t, device="cpu")
    with pytest.raises(megatrain.MegatrainError, match="sample_tokens 1000000000 is more than"):
        megatrain.Run(dict(SMALL_RUN, out=tmp_path / "run", sample_tokens=10**9))
    with pytest.raises(megatrain.MegatrainError, match=r"lr: expected a number \(decimal"):
        megatrain.Run(dict(SMALL_RUN, out=tmp_path / "run", lr="0x10"))
    assert megatrain.generate(model, "x", max_new_tokens=64, temperature=0, device="cpu")


def test_the_command_refuses_them_too(tmp_path, model):
    for t in ("nan", "inf", "-1", "0x1"):
        p = run_cli("generate", "--model", model, "--temperature", t, "x", check=False)
        assert p.returncode == 2, (t, p.stderr)
    p = run_cli("generate", "--model", model, "--max-new-tokens", 10**9, "--device", "cpu", "x",
                check=False)
    assert p.returncode == 1 and "more than the model's 64 positions" in p.stderr, p.stderr
    p = run_cli("train", "--out", tmp_path / "run", "--sample-tokens", "1e9", "--steps", 1,
                check=False)
    assert p.returncode == 1 and "sample_tokens 1000000000 is more than" in p.stderr, p.stderr
