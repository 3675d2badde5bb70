"""Choosing the prefill template: backend names, the Hopper refusals and the FA2 fallback."""

import pytest
import torch

from attnc.runtime.build import backends


class _FakeModule:
    def __init__(self, tile: int) -> None:
        self.tile = tile

    def tile_q_tokens(self, head_dim: int, group: int, max_q_len: int) -> int:
        return self.tile


@pytest.fixture
def fake_modules(monkeypatch):
    built: list[str] = []

    def fa2(ir, dtype, head_dim, arch=None):
        built.append("fa2")
        return _FakeModule(32)

    def sm90(ir, dtype, head_dim, arch=None):
        built.append("sm90")
        return _FakeModule(sm90.tile)

    sm90.tile = 64
    monkeypatch.setattr(backends, "get_prefill_module", fa2)
    monkeypatch.setattr(backends, "get_prefill_sm90_module", sm90)
    monkeypatch.setattr(backends, "sm90_prefill_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    return built, sm90


def _choose(backend, kv_layout="ragged", head_dim=128, device="cuda"):
    return backends.choose_prefill_module(
        object(), backend, dtype=torch.bfloat16, head_dim=head_dim, group=4, max_q_len=100,
        kv_layout=kv_layout, device=torch.device(device),
    )  # fmt: skip


def test_check_backend_names_the_argument(monkeypatch):
    monkeypatch.delenv("ATTNC_PREFILL_BACKEND", raising=False)
    assert backends.check_backend(None) == "auto"
    assert backends.check_backend("sm90") == "sm90"
    with pytest.raises(
        ValueError, match=r"backend: expected one of 'auto', 'fa2', 'sm90', got 'fa3'"
    ):
        backends.check_backend("fa3")
    with pytest.raises(ValueError, match="backend: "):
        backends.check_backend(90)
    monkeypatch.setenv("ATTNC_PREFILL_BACKEND", "fa2")
    assert backends.check_backend(None) == "fa2"


def test_auto_takes_hopper_on_sm90_for_ragged_kv(fake_modules):
    built, _ = fake_modules
    choice = _choose("auto")
    assert (choice.backend, choice.tile_q_tokens, built) == ("sm90", 64, ["sm90"])


def test_auto_falls_back_to_fa2_with_a_reason(fake_modules, monkeypatch, capsys):
    built, sm90 = fake_modules
    monkeypatch.setattr(backends, "SM90_KV_LAYOUTS", ("ragged",))
    monkeypatch.setenv("ATTNC_VERBOSE", "1")
    assert _choose("auto", kv_layout="paged").backend == "fa2"
    assert "paged KV is not served by the Hopper template" in capsys.readouterr().err
    sm90.tile = 0
    assert _choose("auto").backend == "fa2"
    assert "no Hopper tile" in capsys.readouterr().err


def test_named_sm90_refuses_what_it_cannot_serve(fake_modules, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(
        ValueError, match="backend: 'sm90' cannot serve this request: the GPU is not"
    ):
        _choose("sm90")
    assert _choose("auto").backend == "fa2"
    with pytest.raises(ValueError, match="not on a CUDA device"):
        _choose("sm90", device="cpu")


def test_fa2_never_builds_the_hopper_module(fake_modules):
    built, _ = fake_modules
    assert _choose("fa2").backend == "fa2"
    assert built == ["fa2"]


def _prebuild(backend, kv_layout="ragged", device="cuda"):
    backends.prebuild_prefill_module(
        object(), backend, dtype=torch.bfloat16, head_dim=128, kv_layout=kv_layout,
        device=torch.device(device),
    )  # fmt: skip


def test_prebuild_builds_the_module_the_choice_takes(fake_modules, monkeypatch):
    built, _ = fake_modules
    _prebuild("auto")
    _prebuild("sm90")
    _prebuild("fa2")
    assert built == ["sm90", "sm90", "fa2"]
    built.clear()
    monkeypatch.setattr(backends, "SM90_KV_LAYOUTS", ("ragged",))
    _prebuild("auto", kv_layout="paged")  # refused: auto falls back to FA2
    _prebuild("sm90", kv_layout="paged")  # refused: the choice raises, nothing to build
    assert built == ["fa2"]


@pytest.mark.parametrize(
    "backend,mask,want",
    [
        ("sm90", "mask = kv_idx <= q_pos;", 132),
        ("sm90", "", 132),
        ("sm90", "param doc: tensor<i32>[kv_len];\n mask = doc[kv_idx] == doc[q_pos];", 0),
        ("fa2", "mask = kv_idx <= q_pos;", 0),
    ],
)
def test_only_the_hopper_walk_gets_its_items_placed(backend, mask, want):
    """The planner places items for the alternating walk (walk_ctas > 0) only for the Hopper
    kernel without a tile map: a token mask's CTAs take items as they finish, FA2 runs an item
    a CTA, and both want the heaviest-first list."""
    import attnc
    from attnc.runtime.planning.plan_params import variant_mask_reads
    from attnc.runtime.wrappers.prefill_ctas import walk_ctas

    variant = attnc.load(source=f"variant v {{\n {mask}\n}}")
    assert walk_ctas(backend, variant_mask_reads(variant), 132) == want
