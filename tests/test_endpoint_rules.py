"""The decisions behind `bench --endpoint`, without a server: URLs, the interface check against the folder, the
server's counters in both protocols' forms, uint8 pixels recovered exactly, perf_analyzer's stability rule, and a
wrong or late answer as one sentence."""

import asyncio
import os
import time

import numpy as np
import pytest

from vitexport.backends.endpoint import (
    EndpointError,
    EndpointRunner,
    Expected,
    check_interface,
    parse_endpoint,
    served_precision,
    server_counts,
    to_pixels,
)
from vitexport.benchmark.load import Window, settled, stable, summarise
from vitexport.data.images import normalise
from vitexport.data.preprocess import Preprocess
from vitexport.errors import VitexportError

WANT = Expected("pixel_values", "logits", (3, 32, 32), (10,), (0.5, 0.4, 0.3), (0.2, 0.25, 0.3))


def meta(inputs=(("pixel_values", "FP32", [-1, 3, 32, 32]),), outputs=(("logits", "FP32", [-1, 10]),)):
    return {"name": "m", "platform": "onnxruntime_onnx",
            "inputs": [{"name": n, "datatype": d, "shape": s} for n, d, s in inputs],
            "outputs": [{"name": n, "datatype": d, "shape": s} for n, d, s in outputs]}


@pytest.mark.parametrize("url, expected", [
    ("http://127.0.0.1:8000", ("http", "127.0.0.1:8000")),
    ("grpc://triton.internal:8001/", ("grpc", "triton.internal:8001")),
    ("HTTP://[::1]:8000", ("http", "[::1]:8000")),
])
def test_urls(url, expected):
    assert parse_endpoint(url) == expected


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "https://h:443", "http://h", "http://h:0", "http://h:70000",
                                 "http://h:8000/v2/models", "grpc://a b:1"])
def test_bad_urls_are_one_sentence(url):
    with pytest.raises(VitexportError, match="is not http://HOST:PORT or grpc://HOST:PORT"):
        parse_endpoint(url)


@pytest.mark.parametrize("name, precision", [
    ("vit_base_patch16_224-int8", "int8"), ("vit_digits_patch4_32-fp16-plan", "fp16"),
    ("x-fp32-uint8", "fp32"), ("dinov2-int8-plan-uint8", "int8"), ("my-model", "fp32"), ("int8", "fp32"),
])
def test_the_precision_a_name_says(name, precision):
    assert served_precision(name) == precision


def test_the_interface_the_folder_describes_passes_with_its_batches():
    assert check_interface(meta(), {"max_batch_size": 16}, WANT, "s").batch_range == (1, 16)
    # a plain KServe v2 server has no configuration extension: the symbolic batch axis says "any"
    assert check_interface(meta(), {}, WANT, "s").batch_range is None
    fixed = meta(inputs=(("pixel_values", "UINT8", [4, 3, 32, 32]),), outputs=(("logits", "FP16", [4, 10]),))
    got = check_interface(fixed, {"max_batch_size": 0}, WANT, "s")
    assert got.batch_range == (4, 4) and got.input_dtype == "UINT8" and got.output_dtype == "FP16"


@pytest.mark.parametrize("m, config, needle", [
    (meta(inputs=(("x", "FP32", [-1, 3, 32, 32]),)), {}, "not the one input 'pixel_values'"),
    (meta(inputs=(("pixel_values", "FP32", [-1, 3, 32, 32]), ("mask", "FP32", [-1, 1]))), {}, "not the one input"),
    (meta(outputs=(("embedding", "FP32", [-1, 10]),)), {}, "not 'logits'"),
    (meta(inputs=(("pixel_values", "INT64", [-1, 3, 32, 32]),)), {}, "takes INT64"),
    (meta(outputs=(("logits", "BYTES", [-1, 10]),)), {}, "gives BYTES"),
    (meta(inputs=(("pixel_values", "FP32", [-1, 3, 48, 48]),)), {}, "of shape [-1, 3, 48, 48]"),
    (meta(inputs=(("pixel_values", "FP32", [-1, 32, 32, 3]),)), {}, "takes [batch, 3, 32, 32]"),
    (meta(outputs=(("logits", "FP32", [-1, 1000]),)), {}, "gives [batch, 10]"),
    (meta(inputs=(("pixel_values", "FP32", [3, 32, 32]),)), {"max_batch_size": 0}, "of shape [3, 32, 32]"),
])
def test_an_interface_of_another_model_is_one_sentence(m, config, needle):
    with pytest.raises(EndpointError) as e:
        check_interface(m, config, WANT, "http://h:1/m")
    assert needle in str(e.value) and str(e.value).startswith("http://h:1/m ") and "\n" not in str(e.value)


def test_the_servers_counters_in_both_protocols_forms():
    """HTTP's JSON gives numbers; gRPC's gives int64 as strings and leaves zero counters out; other models and
    versions are not counted."""
    http = {"model_stats": [
        {"name": "m", "version": "1", "inference_count": 12, "execution_count": 3,
         "inference_stats": {"success": {"count": 6, "ns": 900}, "fail": {"count": 1, "ns": 5},
                             "queue": {"count": 6, "ns": 60}, "compute_input": {"count": 6, "ns": 10},
                             "compute_infer": {"count": 6, "ns": 700}, "compute_output": {"count": 6, "ns": 30}}},
        {"name": "other", "version": "1", "inference_count": 99, "inference_stats": {"success": {"count": 99}}}]}
    grpc = {"model_stats": [
        {"name": "m", "version": "1", "inference_count": "12", "execution_count": "3",
         "inference_stats": {"success": {"count": "6", "ns": "900"}, "fail": {"count": "1", "ns": "5"},
                             "queue": {"count": "6", "ns": "60"}, "compute_input": {"count": "6", "ns": "10"},
                             "compute_infer": {"count": "6", "ns": "700"}, "compute_output": {"count": "6", "ns": "30"},
                             "cache_hit": {}}},
        {"name": "m", "version": "2", "inference_count": "4", "inference_stats": {"success": {"count": "2"}}}]}
    want = {"requests": 6, "inferences": 12, "executions": 3, "queue_ns": 60, "compute_ns": 740, "failed": 1}
    assert server_counts(http, "m", "") == want
    assert server_counts(grpc, "m", "1") == want
    assert server_counts(grpc, "m", "")["requests"] == 8  # every version of the model
    assert server_counts({}, "m", "")["requests"] == 0


def test_uint8_pixels_are_recovered_exactly_from_the_inputs():
    """The bench's inputs are (pixels / 255 - mean) / std in float32 (data.images.normalise): a uint8-input model
    is sent exactly the pixels they came from, for any mean and std a preprocessing config holds."""
    rng = np.random.default_rng(0)
    for mean, std in (((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), ((0.5,) * 3, (0.5,) * 3),
                      ((0.0,) * 3, (1.0,) * 3), ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))):
        pixels = rng.integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
        pixels[0, 0, 0] = (0, 255, 128)
        x = normalise(pixels, Preprocess(input_size=(16, 16), mean=mean, std=std))
        assert np.array_equal(to_pixels(x, mean, std), pixels.transpose(0, 3, 1, 2))


def window(throughput, p50, batch=1, seconds=1.0):
    n = int(throughput * seconds / batch)
    return Window(0.0, seconds, [p50] * n, batch)


@pytest.mark.parametrize("windows, is_stable", [
    ([window(100, 0.010)] * 3, True),
    ([window(100, 0.010), window(109, 0.0105), window(95, 0.0095)], True),
    ([window(100, 0.010)] * 2, False),  # three windows at least
    ([window(100, 0.010), window(100, 0.010), window(125, 0.010)], False),  # throughput off by more than 10 %
    ([window(100, 0.010), window(100, 0.010), window(100, 0.0125)], False),  # p50 off
    ([window(30, 0.010), window(100, 0.010), window(100, 0.010), window(100, 0.010)], True),  # the last three
])
def test_perf_analyzers_stability_rule(windows, is_stable):
    assert stable(windows) is is_stable


class _LaggingServer:
    """A server whose counters lag its answers: each read shows the count as it was, then one more answered request
    is counted (Triton counts a request just after answering it)."""

    def __init__(self, counted: int, answered: int):
        self.counted, self.answered, self.reads = counted, answered, 0

    def statistics(self):
        self.reads += 1
        shown, self.counted = self.counted, min(self.answered, self.counted + 1)
        return {"requests": shown, "inferences": 2 * shown, "queue_ns": 0, "compute_ns": 0}


def test_the_servers_counters_are_read_once_they_have_caught_up_and_stopped_moving():
    """Read while a request of the previous level is still uncounted, the base would be one short, and the count
    since it would reach the two warm-up requests with one of them still uncounted: the level after would count one
    request more than it sent."""
    server = _LaggingServer(counted=10, answered=11)  # the previous level's last request not yet counted
    base = settled(server, None, 0)
    assert base["requests"] == 11
    server.answered += 2  # two warm-up requests answered
    assert settled(server, base, 2)["requests"] == 13
    server = _LaggingServer(counted=5, answered=5)
    assert settled(server, None, 0)["requests"] == 5 and server.reads == 2  # at rest: two reads that agree


def test_the_figures_are_those_of_the_last_three_windows():
    ws = [Window(0, 1, [0.5] * 4, 2), Window(1, 2, [0.010] * 50, 2), Window(2, 4, [0.020] * 50, 2),
          Window(4, 5, [0.010] * 100, 2)]
    lat = summarise(ws, 4, False)
    assert lat.iterations == 200 and lat.windows == 4 and lat.concurrency == 4 and lat.stable is False
    assert lat.throughput == pytest.approx(200 * 2 / 4) and lat.p99_ms == pytest.approx(20)
    assert lat.mean_ms == pytest.approx((150 * 10 + 50 * 20) / 200)


class _Result:
    def __init__(self, out):
        self.out = out

    def as_numpy(self, name):
        return self.out


class _Client:
    def __init__(self, out=None, delay=0.0):
        self.out, self.delay = out, delay

    async def infer(self, *args, **kwargs):
        await asyncio.sleep(self.delay)
        return _Result(self.out)

    async def close(self):
        pass


def _runner(client, timeout=5.0):
    import tritonclient.http.aio as lib

    from vitexport.backends.endpoint import Interface

    r = EndpointRunner("http://127.0.0.1:9", "m", WANT, timeout=timeout)
    r._lib, r._loop, r._client = lib, asyncio.new_event_loop(), client
    r.interface, r._loaded = Interface((1, 8), "FP32", "FP32", 8, "python"), True
    return r


@pytest.mark.parametrize("out, needle", [
    (np.zeros((2, 9), np.float32), "of shape [2, 9]"),
    (np.zeros((1, 10), np.float32), "of shape [1, 10]"),
    (np.zeros((2, 10), np.int64), "type int64"),
    (None, "of shape None"),
])
def test_an_answer_of_the_wrong_shape_or_type_is_one_sentence(out, needle):
    r = _runner(_Client(out))
    with pytest.raises(EndpointError) as e:
        r.infer(np.zeros((2, 3, 32, 32), np.float32))
    assert needle in str(e.value) and "not [2, 10] float" in str(e.value)
    r.close()


def test_no_answer_within_the_timeout_is_one_sentence_in_time():
    r = _runner(_Client(np.zeros((1, 10), np.float32), delay=30), timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(EndpointError, match=r"did not answer a request within 0.3 s \(--timeout\)"):
        r.infer(np.zeros((1, 3, 32, 32), np.float32))
    assert time.monotonic() - t0 < 2
    r.close()
    assert r._loop is None


def test_a_server_that_cannot_read_our_shared_memory_is_one_sentence_and_leaves_nothing():
    """A server on another host cannot open this host's regions: registering fails; the region is unlinked."""
    from pathlib import Path

    from tritonclient.utils import InferenceServerException

    class Remote(_Client):
        async def register_system_shared_memory(self, name, key, byte_size):
            raise InferenceServerException(f"Unable to open shared memory region: '{key}'")

        async def unregister_system_shared_memory(self, name):
            raise InferenceServerException("no such region")

    r = _runner(Remote())
    with pytest.raises(EndpointError, match="cannot read this host's shared memory .*Unable to open shared memory"):
        r._open_shared_memory()
    r.close()
    assert not list(Path("/dev/shm").glob(f"vitexport_{os.getpid()}_*"))  # this process's (other workers: theirs)


class _Served:
    """A stand-in for an EndpointRunner under load: each request takes `delay(n)` seconds; the server's counters
    count a request `lag` seconds after its answer, as Triton counts just after answering."""

    name, timeout = "endpoint fake", 5.0

    def __init__(self, delay, lag=0.0):
        self.delay, self.lag = delay, lag
        self.answered: list[tuple[float, int]] = []  # (time answered, images)
        self._loop = asyncio.new_event_loop()

    def stage(self, x):
        return x, len(x)

    async def request(self, staged):
        await asyncio.sleep(self.delay(len(self.answered)))
        self.answered.append((time.monotonic(), staged[1]))
        return np.zeros((staged[1], 10), np.float32)

    def run(self, staged):
        return self._loop.run_until_complete(self.request(staged))

    def call(self, coro, what, bounded=True):
        return self._loop.run_until_complete(coro)

    def statistics(self):
        seen = [n for t, n in self.answered if t <= time.monotonic() - self.lag]
        return {"requests": len(seen), "inferences": sum(seen), "executions": len(seen), "failed": 0,
                "queue_ns": 1_000_000 * len(seen), "compute_ns": 3_000_000 * len(seen)}


def test_load_keeps_n_in_flight_until_three_windows_agree_and_counts_as_the_server_does():
    from vitexport.benchmark.load import measure_load

    served = _Served(lambda i: 0.004, lag=0.05)  # the server counts 50 ms late: read once it has caught up
    lat = measure_load(served, np.zeros((3, 3, 8, 8), np.float32), 4, window_s=0.1, min_requests=10, warmup=2)
    assert lat.stable and 3 <= lat.windows < 10 and lat.concurrency == 4 and lat.batch == 3
    assert lat.requests == len(served.answered) - 2  # the warm-up is not measured ...
    assert lat.server_requests == lat.requests and lat.server_inferences == 3 * lat.requests  # ... nor counted
    assert lat.server_queue_ms == pytest.approx(1.0) and lat.server_compute_ms == pytest.approx(3.0)
    # four in flight, 4 ms each: about 1,000 requests a second, 3,000 images
    assert 500 < lat.throughput < 3100 and 4 <= lat.p50_ms < 25 and lat.p50_ms <= lat.p95_ms <= lat.p99_ms


def test_a_load_that_never_settles_is_reported_unstable():
    from vitexport.benchmark.load import measure_load

    served = _Served(lambda i: 0.002 * (1 + i / 3))  # every request a third slower than the first, again
    lat = measure_load(served, np.zeros((1, 3, 8, 8), np.float32), 1, window_s=0.02, min_requests=5, max_windows=6,
                       warmup=0)
    assert lat.stable is False and lat.windows == 6 and lat.requests == len(served.answered)
