"""A scripted "engine" behind the fake OpenAI server, for tests of the diagnosis: batch slots
(requests queue), a prefill that holds the engine (every stream stalls while a long prompt is
prefilled), KV-cache capacity (requests wait for KV, its usage gauge), scripted preemptions and
pauses at chosen instants; and its state as vLLM's ``/metrics`` page (the ``vllm:`` names of
``orchestrator/engines/vllm.py``), so the product reads it as it reads vLLM.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)


@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    total: float = 0.0
    n: int = 0

    def observe(self, v: float) -> None:
        self.total += v
        self.n += 1
        for i, b in enumerate(BUCKETS):
            if v <= b:
                self.counts[i] += 1

    def render(self, name: str) -> list[str]:
        lines = [f"# HELP {name} fake", f"# TYPE {name} histogram"]
        lines += [f'{name}_bucket{{le="{b}"}} {c}' for b, c in zip(BUCKETS, self.counts)]
        lines += [f'{name}_bucket{{le="+Inf"}} {self.n}', f"{name}_sum {self.total}", f"{name}_count {self.n}"]
        return lines


@dataclass
class EngineScript:
    """What the fake engine does (all off by default)."""

    prefill_s_per_token: float = 0.0  # a prefill holds the engine this long per prompt token: streams stall
    prefill_min_tokens: int = 0  # ... only prompts of at least this many tokens hold it
    kv_tokens: int = 0  # > 0: KV capacity in tokens (prompt + max_tokens reserved per request); others wait
    preempt_every: int = 0  # every Nth request is preempted once, halfway: its stream pauses preempt_s
    preempt_s: float = 0.3
    pauses: tuple[tuple[float, float], ...] = ()  # (at, seconds) after the first request: every stream stalls


class EngineModel:
    """The shared state of the fake engine: who runs, who waits, the KV in use, the counters."""

    def __init__(self, script: EngineScript, slots: int) -> None:
        self.script, self.slots = script, slots
        self.running = 0
        self.waiting = 0
        self.kv_used = 0
        self.preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.requests = 0
        self.busy_until = 0.0  # a prefill or a pause holds the engine until then
        self.started: float | None = None
        self.hist = {k: Histogram() for k in ("ttft", "itl", "e2e", "queue", "prefill")}
        self._admit: asyncio.Condition | None = None

    def _cond(self) -> asyncio.Condition:
        if self._admit is None:
            self._admit = asyncio.Condition()
        return self._admit

    async def admit(self, need_kv: int) -> float:
        """Wait for a slot (and KV) to free; returns the queue time."""
        t0 = time.perf_counter()
        self.started = self.started if self.started is not None else t0
        self.requests += 1
        cond = self._cond()
        async with cond:
            self.waiting += 1
            try:
                await cond.wait_for(lambda: self._fits(need_kv))
            finally:
                self.waiting -= 1
            self.running += 1
            self.kv_used += need_kv if self.script.kv_tokens else 0
        return time.perf_counter() - t0

    def _fits(self, need_kv: int) -> bool:
        if self.slots and self.running >= self.slots:
            return False
        return not self.script.kv_tokens or self.kv_used + need_kv <= self.script.kv_tokens or self.running == 0

    async def release(self, need_kv: int) -> None:
        cond = self._cond()
        async with cond:
            self.running -= 1
            self.kv_used -= need_kv if self.script.kv_tokens else 0
            cond.notify_all()

    async def prefill(self, prompt_tokens: int) -> None:
        """A prompt's prefill: with ``prefill_s_per_token``, it holds the engine (after any
        prefill or pause already holding it): every stream's next chunk waits."""
        self.prompt_tokens += prompt_tokens
        s = self.script
        if not s.prefill_s_per_token or prompt_tokens < s.prefill_min_tokens:
            return
        now = time.perf_counter()
        start = max(now, self.busy_until)
        self.busy_until = start + prompt_tokens * s.prefill_s_per_token
        await asyncio.sleep(max(self.busy_until - now, 0.0))

    async def step(self) -> float:
        """Before a stream's next chunk: wait while a prefill or a scripted pause holds the
        engine; returns how long it waited."""
        now = time.perf_counter()
        if self.started is not None:
            for at, seconds in self.script.pauses:
                t = self.started + at
                if t <= now < t + seconds:
                    self.busy_until = max(self.busy_until, t + seconds)
        wait = self.busy_until - now
        if wait > 0:
            await asyncio.sleep(wait)
            return wait
        return 0.0

    def preempted(self, request_no: int) -> bool:
        return bool(self.script.preempt_every) and request_no % self.script.preempt_every == 0

    def metrics_page(self) -> str:
        usage = self.kv_used / self.script.kv_tokens if self.script.kv_tokens else 0.0
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running {self.running}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting {self.waiting}",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc {usage}",
            "# TYPE vllm:num_preemptions counter",
            f"vllm:num_preemptions_total {self.preemptions}",
            "# TYPE vllm:prompt_tokens counter",
            f"vllm:prompt_tokens_total {self.prompt_tokens}",
            "# TYPE vllm:generation_tokens counter",
            f"vllm:generation_tokens_total {self.generation_tokens}",
        ]
        names = {
            "ttft": "vllm:time_to_first_token_seconds",
            "itl": "vllm:inter_token_latency_seconds",
            "e2e": "vllm:e2e_request_latency_seconds",
            "queue": "vllm:request_queue_time_seconds",
            "prefill": "vllm:request_prefill_time_seconds",
        }
        for key, name in names.items():
            lines += self.hist[key].render(name)
        return "\n".join(lines) + "\n"
