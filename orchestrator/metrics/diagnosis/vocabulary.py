"""The diagnosis's words: the vocabulary of causes (:data:`VOCABULARY`, in :data:`PRIORITY`
order; :data:`SERVER_CAUSES`, the ones a server's configuration can act on) and a finding's
confidence (:data:`STRONG`, :data:`WEAK`)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config.metric_keys import LIMITERS

STRONG, WEAK = "strong", "weak"


@dataclass(frozen=True)
class Cause:
    """One word of the vocabulary: what it means and the measurement that would confirm it."""

    key: str
    words: str
    confirm: str


VOCABULARY: dict[str, Cause] = {
    c.key: c
    for c in (
        Cause(
            "client",
            "the client: it could not keep up, so the numbers describe the client",
            "rerun with more client processes (workload.client_processes) or cores; the point's validity checks pass",
        ),
        Cause(
            "shared_machine",
            "a shared machine: processes outside the trial took CPU from it",
            "rerun on an idle machine; the foreign CPU (census) falls below workload.validity.max_foreign_cpu_cores",
        ),
        Cause(
            "over_capacity",
            "over capacity: requests arrived faster than the server completed them, the queue grew",
            "a lower rate keeps TTFT flat through the window; the capacity search (workload.capacity) brackets it",
        ),
        Cause(
            "kv_capacity",
            "KV-cache capacity: the cache was full, requests waited or were preempted",
            "more KV space (gpu_memory_utilization, cpu_kvcache_space_gib, fp8 KV) removes preemptions and waits",
        ),
        Cause(
            "batch_slots",
            "batch slots: max_num_seqs requests ran while others waited",
            "a larger engine.max_num_seqs lets the waiting requests in (running rises, queue time falls)",
        ),
        Cause(
            "prefix_reuse_missed",
            "prefix reuse missed: the prompts share prefixes the server computed again instead of reusing",
            "prefix caching on (or cache-aware routing across replicas): server_prefix_cache_hit_rate rises "
            "toward prefix_reuse_ideal_share and the prefill time per request falls",
        ),
        Cause(
            "prefill_interference",
            "prefill interference: other requests' prefills stalled running decodes",
            "chunked prefill with a smaller max_num_batched_tokens (or P/D) shrinks the stalls; the timeline "
            "shows each stall at a prefill",
        ),
        Cause(
            "compute",
            "compute: the accelerator (or the servers' CPU cores) ran at its limit while work waited",
            "the GPU at its power limit or throttling, SM utilisation ~100%; more compute (TP) or less work per "
            "step helps",
        ),
        Cause(
            "decode_bandwidth",
            "decode memory bandwidth: each decode step ran near its roofline floor (weights + KV read per step)",
            "TPOT tracks bytes per step: a smaller dtype (quantized weights, fp8 KV) lowers it in proportion",
        ),
        Cause(
            "none",
            "none: the server had headroom",
            "a heavier point (more concurrency or rate) still scales throughput",
        ),
    )
}
# The causes in the order they are tried, as the registry lists them: shared_machine first (a
# shared machine also starves the client, and then it is the cause), "none" not a cause.
PRIORITY = tuple(cause for cause in LIMITERS if cause != "none")
# Causes outside the server: the measurement's own (the client) or the machine's (others' work).
# They say the numbers are not the server's to tune; every other cause is the server's.
OUTSIDE_SERVER = ("client", "shared_machine")
SERVER_CAUSES = tuple(cause for cause in PRIORITY if cause not in OUTSIDE_SERVER)
