"""The compiled-variant cache stores data, not code: every stdlib variant round-trips through
the JSON encoding, pickles and foreign types are rejected, a key covers the import directory,
and randomly corrupted entries are ignored and rewritten (never a crash, never a changed
variant)."""

from __future__ import annotations

import json
import os
import pickle
import random

import pytest

import attnc
from attnc.compiler import pipeline
from attnc.compiler.pipeline import compile_source, resolve_source, stdlib_names
from attnc.runtime.build import ir_json, variant_cache

SOURCE = """variant data_probe {
    doc "probe";
    param cap: f32 = 30.0;
    param window: i32 = 128;
    score = cap * tanh(score / cap);
    mask = kv_idx <= q_pos && q_pos - kv_idx < window;
}
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ATTNC_COMPILE_CACHE", raising=False)
    calls: list[str] = []
    real = pipeline.compile_with_imports

    def counting(text, file):
        calls.append(file)
        return real(text, file)

    monkeypatch.setattr(pipeline, "compile_with_imports", counting)
    return tmp_path / "cache", calls


@pytest.mark.parametrize("name", stdlib_names())
def test_every_stdlib_variant_round_trips(name):
    compiled, warnings = compile_source(*resolve_source(f"stdlib:{name}"))
    data = json.loads(json.dumps(ir_json.encode((tuple(compiled), warnings)), allow_nan=False))
    back_compiled, back_warnings = ir_json.decode(data)
    assert back_compiled == tuple(compiled) and back_warnings == warnings
    for got, want in zip(back_compiled, compiled, strict=True):
        assert got.variant.loc == want.variant.loc  # locations (not compared by ==) survive
        assert [p.default for p in got.variant.params] == [p.default for p in want.variant.params]
        assert [type(p.default) for p in got.variant.params] == [
            type(p.default) for p in want.variant.params
        ]


def test_shared_nodes_stay_shared_and_non_finite_floats_survive():
    from attnc.compiler import ir

    leaf = ir.Const(float("inf"), ir.F32)
    tree = ir.Binary("+", leaf, leaf, ir.F32)
    data = ir_json.encode(tree)
    assert [row["t"].split(":")[1] for row in data["nodes"]].count("Const") == 1
    back = ir_json.decode(json.loads(json.dumps(data, allow_nan=False)))
    assert back == tree and back.a is back.b


@pytest.mark.parametrize(
    "type_name", ["builtins:eval", "os:system", "attnc.runtime.build.jit:ModuleSpec", "x"]
)
def test_foreign_types_are_rejected(type_name):
    data = {"nodes": [{"t": type_name, "f": {}}], "root": {"N": 0}}
    with pytest.raises(ir_json.DecodeError):
        ir_json.decode(data)


def _entry_file(root):
    (entry,) = (root / "compiled").iterdir()
    return entry


def test_a_pickle_in_the_cache_is_never_unpickled(cache, tmp_path):
    root, calls = cache
    attnc.load(SOURCE)
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    entry = _entry_file(root)
    entry.write_bytes(pickle.dumps(Payload()))
    v = attnc.load(SOURCE)
    assert not marker.exists()
    assert len(calls) == 2 and v.ir.name == "data_probe"
    assert json.loads(entry.read_text())["format"] == variant_cache.FORMAT  # rewritten


def test_a_valid_digest_over_a_foreign_type_is_rejected(cache):
    root, calls = cache
    attnc.load(SOURCE)
    entry = _entry_file(root)
    data = json.loads(entry.read_text())
    data["payload"]["body"]["nodes"][0]["t"] = "os:system"
    data["digest"] = variant_cache._digest(data["payload"])
    entry.write_text(json.dumps(data))
    attnc.load(SOURCE)
    assert len(calls) == 2


def test_a_valid_digest_over_ill_typed_ir_is_rejected(cache):
    root, calls = cache
    attnc.load(SOURCE)
    entry = _entry_file(root)
    data = json.loads(entry.read_text())
    nodes = data["payload"]["body"]["nodes"]
    const = next(n for n in nodes if n["t"].endswith(":Const"))
    const["f"]["type"] = "x32"
    data["digest"] = variant_cache._digest(data["payload"])
    entry.write_text(json.dumps(data))
    assert attnc.load(SOURCE).ir.name == "data_probe"
    assert len(calls) == 2


def test_same_file_importing_another_directory_s_masks(cache, tmp_path, monkeypatch):
    _, calls = cache
    for name, window in (("a", 4), ("b", 9)):
        d = tmp_path / name
        d.mkdir()
        (d / "masks.attn").write_text(f"def near() = q_pos - kv_idx < {window};\n")
        (d / "v.attn").write_text('import "masks.attn";\nvariant v {\n    mask = near();\n}\n')
    monkeypatch.chdir(tmp_path / "a")
    first = attnc.load("v.attn")
    monkeypatch.chdir(tmp_path / "b")
    second = attnc.load("v.attn")
    assert "4" in repr(first.ir.mask) and "9" in repr(second.ir.mask)
    inline = 'import "masks.attn";\nvariant v {\n    mask = near();\n}\n'
    assert "9" in repr(attnc.load(inline).ir.mask)
    monkeypatch.chdir(tmp_path / "a")
    assert "4" in repr(attnc.load(inline).ir.mask)
    assert "4" in repr(attnc.load("v.attn").ir.mask)
    assert len(calls) == 4  # the last load is a hit of the first


def _corrupt(raw: bytes, rng: random.Random) -> bytes:
    data = bytearray(raw)
    how = rng.randrange(5)
    if how == 0:  # flip 1-2 bytes
        for _ in range(rng.randint(1, 2)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif how == 1:  # a 2-byte change to another printable character
        i = rng.randrange(len(data) - 1)
        data[i : i + 2] = bytes(rng.choice(b'0123456789.-e"{}[],:') for _ in range(2))
    elif how == 2:
        del data[rng.randrange(len(data)) :]
    elif how == 3:
        i = rng.randrange(len(data))
        data[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    else:
        i = rng.randrange(len(data))
        del data[i : i + rng.randint(1, 16)]
    return bytes(data)


def test_random_corruptions_are_misses_never_crashes_or_changes(cache, tmp_path):
    root, calls = cache
    want = attnc.load(SOURCE)
    entry = _entry_file(root)
    raw = entry.read_bytes()
    key = variant_cache.entry_key(SOURCE, "<string>")
    rng = random.Random(1234)
    hits = 0
    for _ in range(400):
        bad = tmp_path / "bad.json"
        bad.write_bytes(_corrupt(raw, rng))
        found = variant_cache.read_entry(bad, key)
        if found is not None:  # only an edit that keeps the same data may be accepted
            hits += 1
            assert found[0] == (want.compiled,)
            assert [p.default for p in found[0][0].variant.params] == [30.0, 128]
    assert hits < 40
    entry.write_bytes(_corrupt(raw, random.Random(5))[: len(raw) // 2])
    assert attnc.load(SOURCE).ir == want.ir
    assert len(calls) == 2
    assert entry.read_bytes() == raw  # rewritten


def test_a_deep_dag_loads_again_in_the_same_process_at_once(cache):
    import time

    _, calls = cache
    lines = ["def g0(x) = x;"]
    lines += [f"def g{i}(x) = tanh(g{i - 1}(x)) * g{i - 1}(x);" for i in range(1, 25)]
    src = "\n".join(lines) + "\nvariant deep { score = g24(score); }"
    first = attnc.load(src)
    start = time.perf_counter()
    again = attnc.load(src)  # a hit; equal DAGs are never compared node by unfolded node
    assert time.perf_counter() - start < 1.0
    assert again.ir is first.ir and len(calls) == 1
