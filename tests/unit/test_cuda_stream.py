"""``raw_stream``: the device's index goes to torch's raw-stream query (a device without an
index: the current device's), and without that query the Stream object's handle is used."""

import types

import torch

from attnc.runtime.wrappers import cuda_stream, decode_launch, prefill_launch


def test_raw_stream_asks_torch_for_the_devices_index(monkeypatch):
    asked = []
    monkeypatch.setattr(cuda_stream, "GET_RAW_STREAM", lambda i: asked.append(i) or 1234 + i)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    assert cuda_stream.raw_stream(torch.device("cuda", 3)) == 1237
    assert cuda_stream.raw_stream(torch.device("cuda")) == 1236  # the current device
    assert asked == [3, 2]


def test_raw_stream_falls_back_to_the_stream_object(monkeypatch):
    monkeypatch.setattr(cuda_stream, "GET_RAW_STREAM", None)
    stream = types.SimpleNamespace(cuda_stream=77)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    assert cuda_stream.raw_stream(torch.device("cuda", 0)) == 77


def test_one_raw_stream_for_every_launcher():
    assert decode_launch.raw_stream is cuda_stream.raw_stream
    assert prefill_launch.raw_stream is cuda_stream.raw_stream
