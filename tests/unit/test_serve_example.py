"""examples/serve.py's loop on the CPU with float32 torch attention: paging, the free-page
allocator, chunked prefill, bucket padding and decode give the tokens of a dense forward."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from serve import Engine, make_requests  # noqa: E402
from serve_backends import Heads, make_backend, torch_attention  # noqa: E402
from serve_model import ModelShape, PagedKVCache, TinyLlama  # noqa: E402

SHAPE = ModelShape(
    layers=2, hidden=128, heads=4, kv_heads=2, head_dim=32, intermediate=256, vocab=97,
    max_positions=512,
)  # fmt: skip
PAGE = 4


def _dense_greedy(model: TinyLlama, prompt: torch.Tensor, out: list[int]) -> list[int]:
    """Greedy tokens of one request from a single forward over prompt + generated tokens."""
    seq = torch.cat([prompt, torch.tensor(out[:-1], dtype=torch.long)])
    n = seq.numel()
    pages = -(-n // PAGE)
    cache = PagedKVCache(SHAPE, pages + 1, PAGE, torch.device("cpu"), torch.float32)
    ids = torch.tensor(cache.allocate(pages))
    pos = torch.arange(n)

    def attend(layer, q, kv):
        return torch_attention(q, kv[ids, 0].flatten(0, 1)[:n], kv[ids, 1].flatten(0, 1)[:n])

    logits = model.forward(seq, pos, ids[pos // PAGE], pos % PAGE, cache, attend)
    return logits[prompt.numel() - 1 :].argmax(-1).tolist()


@pytest.fixture
def one_thread():
    """Tiny matmuls: one intra-op thread (a busy 2-core runner loses seconds waking threads)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_serving_loop_matches_a_dense_forward(one_thread):
    torch.manual_seed(0)
    model = TinyLlama(SHAPE, torch.device("cpu"), dtype=torch.float32)
    requests = make_requests(7, 5, 60, 6, SHAPE.vocab, 2, seed=0)
    pages = 1 + sum(-(-(r.prompt.numel() + r.new_tokens) // PAGE) for r in requests)
    cache = PagedKVCache(SHAPE, pages, PAGE, torch.device("cpu"), torch.float32)
    backend = make_backend("torch", Heads(4, 2, 32, PAGE, pages), torch.device("cpu"))
    engine = Engine(model, cache, backend, max_batch=3, chunk_tokens=17)
    latencies, had_prefill = engine.run(requests)
    assert len(latencies) == len(had_prefill) and had_prefill.any() and not had_prefill.all()
    assert cache.free_pages == pages - 1  # every page came back
    for r in requests:
        assert len(r.out) == 6
        assert r.out == _dense_greedy(model, r.prompt, r.out), r.rid


def test_free_page_allocator():
    cache = PagedKVCache(SHAPE, 6, PAGE, torch.device("cpu"), torch.float32)
    a = cache.allocate(3)
    assert a == [1, 2, 3] and cache.free_pages == 2  # page 0 is the scratch page
    cache.release(a[:2])
    assert sorted(cache.allocate(4)) == [1, 2, 4, 5]
    assert np.array_equal(cache.pages_for(np.array([1, 4, 5])), [1, 1, 2])


def test_a_deadline_stops_the_loop_and_the_report_says_so(one_thread):
    import time

    from serve import report

    torch.manual_seed(0)
    model = TinyLlama(SHAPE, torch.device("cpu"), dtype=torch.float32)
    requests = make_requests(4, 5, 30, 3, SHAPE.vocab, 2, seed=0)
    pages = 1 + sum(-(-(r.prompt.numel() + r.new_tokens) // PAGE) for r in requests)
    cache = PagedKVCache(SHAPE, pages, PAGE, torch.device("cpu"), torch.float32)
    backend = make_backend("torch", Heads(4, 2, 32, PAGE, pages), torch.device("cpu"))
    engine = Engine(model, cache, backend, max_batch=3, chunk_tokens=17)
    latencies, had_prefill = engine.run(requests, deadline=time.perf_counter())
    assert engine.truncated and len(latencies) == 0
    summary = report("torch", requests, latencies, had_prefill, 1.0)
    assert summary["finished"] == 0 and summary["generated_tokens"] == 0
    latencies, had_prefill = engine.run(requests[:2], deadline=time.perf_counter() + 600)
    assert not engine.truncated
    summary = report("torch", requests[:2], latencies, had_prefill, 2.0)
    assert summary["finished"] == 2 and summary["generated_tokens"] == 6
    assert summary["steps"] == len(latencies) and summary["step_p99_ms"] >= summary["step_p50_ms"]


@pytest.mark.parametrize(("setting", "value"), [("max_batch", 0), ("chunk_tokens", 0),
                                                ("chunk_tokens", -8), ("max_batch", 2.5)])  # fmt: skip
def test_an_engine_that_could_never_make_progress_is_refused(setting, value):
    """``chunk_tokens=0`` (``--chunk-tokens 0``) looped forever without prefilling a token;
    ``max_batch=0`` admitted nothing and then blamed the cache's size."""
    model = TinyLlama(SHAPE, torch.device("cpu"), dtype=torch.float32)
    cache = PagedKVCache(SHAPE, 8, PAGE, torch.device("cpu"), torch.float32)
    backend = make_backend("torch", Heads(4, 2, 32, PAGE, 8), torch.device("cpu"))
    kwargs = {"max_batch": 3, "chunk_tokens": 17, setting: value}
    with pytest.raises(ValueError, match=f"{setting} must be an integer >= 1, got {value}"):
        Engine(model, cache, backend, **kwargs)


@pytest.mark.parametrize(("new_tokens", "prompt"), [(0, 5), (-1, 5), (True, 5), (4, 0)])
def test_a_request_that_cannot_generate_is_refused(new_tokens, prompt):
    """``new_tokens=0`` (``--new-tokens 0``) counted a request finished as soon as it was
    admitted, dropping it part-way through its prefill; an empty prompt has no token."""
    from serve import Request

    with pytest.raises(ValueError, match=r"request 3: (new_tokens|prompt) must be"):
        Request(3, torch.zeros(prompt, dtype=torch.int64), new_tokens, 0)


@pytest.mark.parametrize(
    ("prompt", "new_tokens", "message"),
    [
        ([3, -1, 7], 2, r"request 0: prompt\[1\] = -1 is not a token id in \[0, 97\)"),
        ([3, 97, 7], 2, r"prompt\[1\] = 97 is not a token id"),
        ([1] * 500, 13, r"500 prompt \+ 13 new tokens exceed the model's 512 positions"),
    ],
)
def test_requests_the_model_cannot_serve_are_refused(prompt, new_tokens, message):
    """A token id of -1 silently read the embedding's last row (the tokens came out as for
    id 96); an id of vocab and a request past the rotary table failed inside the model's
    gather (on the GPU, a device-side assert that ends the process)."""
    from serve import Request

    model = TinyLlama(SHAPE, torch.device("cpu"), dtype=torch.float32)
    cache = PagedKVCache(SHAPE, 256, PAGE, torch.device("cpu"), torch.float32)
    backend = make_backend("torch", Heads(4, 2, 32, PAGE, 256), torch.device("cpu"))
    engine = Engine(model, cache, backend, max_batch=2, chunk_tokens=64)
    request = Request(0, torch.tensor(prompt, dtype=torch.int64), new_tokens, 0)
    with pytest.raises(ValueError, match=message):
        engine.run([request])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--page-size", "0"], "--page-size must be >= 1, got 0"),
        (["--arrivals-per-step", "0"], "--arrivals-per-step must be >= 1"),
        (["--min-prompt", "900", "--max-prompt", "800"], "--min-prompt 900 is above"),
        (["--max-prompt", "8192"], "exceed the model's 8192 positions"),
    ],
)
def test_command_line_sizes_the_engine_cannot_run_are_refused(argv, message):
    """--page-size 0 and --arrivals-per-step 0 divided by zero; --min-prompt above
    --max-prompt ended in torch's random_ error."""
    import subprocess

    script = Path(__file__).resolve().parents[2] / "examples" / "serve.py"
    done = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
