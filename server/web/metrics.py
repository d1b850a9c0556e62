"""``Metrics``: the Prometheus view of one app, on its own registry.

Names follow what vLLM and TGI users already chart (``*_time_to_first_token_seconds``,
``*_inter_token_latency_seconds``, ``*_request_queue_seconds``). Histograms are fed by generation
events as they happen; counters and gauges are read from ``ServerStats`` and the hub at scrape
time, so they can never drift from what ``/v1/stats`` reports. A registry per app (not the
process-wide default) lets several apps live in one process, as they do in the tests.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from wschat.protocol import Done

from ..sessions import APIS, GenerationRun, RunDone, RunEvent, RunStarted, TokensSent

if TYPE_CHECKING:
    from ..sessions import Hub

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5, 5)
QUEUE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self, hub: Hub) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.ttft = Histogram(
            "wschat_time_to_first_token_seconds",
            "Time from a prompt's arrival to its first generated token.",
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.inter_token = Histogram(
            "wschat_inter_token_latency_seconds",
            "Time between successive generated tokens of one generation.",
            buckets=ITL_BUCKETS,
            registry=self.registry,
        )
        self.queue = Histogram(
            "wschat_request_queue_seconds",
            "Time a prompt waited for a generation slot.",
            buckets=QUEUE_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_HubCollector(hub))
        # the last token time of each running generation; a finished run drops out by itself
        self._last_token: weakref.WeakKeyDictionary[GenerationRun, float] = (
            weakref.WeakKeyDictionary()
        )
        hub.stats.listeners.append(self.on_run_event)

    def on_run_event(self, event: RunEvent) -> None:
        if isinstance(event, RunStarted):
            self.queue.observe(event.run.queued_ms / 1000)
        elif isinstance(event, TokensSent):
            self._on_tokens(event.run, event.count)
        elif isinstance(event, RunDone):
            self._on_done(event.run, event.done)

    def _on_tokens(self, run: GenerationRun, n: int) -> None:
        now = run.last_token_at or time.perf_counter()
        previous = self._last_token.get(run)
        self._last_token[run] = now
        if n < 1:
            return
        if previous is None:
            # the first frame's later tokens reached the client with its first: no gap between
            # them, so every token after a reply's first is observed once however frames merge
            for _ in range(n - 1):
                self.inter_token.observe(0.0)
            return
        # tokens merged into one frame share the gap since the previous frame
        gap = (now - previous) / n
        for _ in range(n):
            self.inter_token.observe(gap)

    def _on_done(self, run: GenerationRun, done: Done) -> None:
        self._last_token.pop(run, None)
        if done.timing.ttft_ms is not None:
            self.ttft.observe(done.timing.ttft_ms / 1000)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _HubCollector(Collector):
    """Counters and gauges read from the hub at scrape time."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    def collect(self) -> Iterator[Metric]:
        hub, stats = self.hub, self.hub.stats
        yield _counter("wschat_prompt_tokens", "Prompt tokens processed.", stats.prompt_tokens)
        yield _counter(
            "wschat_cached_prompt_tokens",
            "Prompt tokens whose KV state was reused instead of recomputed.",
            stats.cached_tokens,
        )
        yield _counter("wschat_generation_tokens", "Tokens generated.", stats.generation_tokens)
        yield _counter(
            "wschat_cancellations", "Generations that ended cancelled.", stats.cancellations
        )
        rewinds = CounterMetricFamily(
            "wschat_rewinds",
            "Conversations cut back: rewind frames answered, regenerate frames accepted.",
            labels=["kind"],
        )
        rewinds.add_metric(["rewind"], stats.rewinds)
        rewinds.add_metric(["regenerate"], stats.regenerates)
        yield rewinds
        generations = CounterMetricFamily(
            "wschat_generations",
            "Generations that ended, by the API that asked (websocket, openai, responses, "
            "responses_websocket).",
            labels=["api"],
        )
        for api in APIS:
            generations.add_metric([api], stats.generations_by_api[api])
        yield generations
        errors = CounterMetricFamily(
            "wschat_errors", "Error frames sent, by code.", labels=["code"]
        )
        for code, count in sorted(stats.errors.items()):
            errors.add_metric([code], count)
        yield errors
        yield _gauge("wschat_generations_running", "Generations decoding now.", hub.slots.running)
        yield _gauge("wschat_generations_queued", "Prompts waiting for a slot.", hub.slots.queued)
        yield _gauge("wschat_sessions_active", "Connected chat sessions.", len(hub.sessions.live))
        yield _gauge(
            "wschat_replays_in_flight",
            "Replays to resumed connections being written (--max-replays).",
            hub.replays.running,
        )
        yield _gauge(
            "wschat_replays_waiting", "Replays waiting for their turn.", hub.replays.waiting
        )
        yield _gauge(
            "wschat_image_checks_running",
            "Uploaded images being decoded and checked (--max-image-checks).",
            hub.image_checks.running,
        )
        yield _gauge(
            "wschat_image_checks_waiting",
            "Uploaded images waiting for their turn to be checked.",
            hub.image_checks.waiting,
        )
        yield _counter(
            "wschat_session_store_errors",
            "Session store operations that failed (Redis unreachable or erroring).",
            hub.sessions.errors,
        )
        threads = _engine_threads(hub)
        if threads is not None:
            yield _gauge(
                "wschat_engine_threads",
                "CPU threads torch used in the engine's last generation step (read in its worker).",
                threads,
            )
        info = GaugeMetricFamily(
            "wschat_model_info",
            "The model being served (value 1).",
            labels=["model", "device", "dtype"],
        )
        if hub.engine is not None:
            e = hub.engine.info
            info.add_metric([e.model, e.runs_on, e.backend], 1)
        yield info


def _engine_threads(hub: Hub) -> int | None:
    """What the engine's workers last read back from torch, when it keeps a thread policy."""
    return hub.engine.worker_threads() if hub.engine is not None else None


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
