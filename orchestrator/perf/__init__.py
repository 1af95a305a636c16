"""Performance arithmetic and the hardware it reads: the GPU table and the GPUs this node has
(:mod:`~orchestrator.perf.gpus`), roofs calibrated here (:mod:`~orchestrator.perf.roofs`), KV
capacity and weight bytes (:mod:`~orchestrator.perf.kv`), the decode roofline
(:mod:`~orchestrator.perf.roofline`) and a trial's per-point floor
(:mod:`~orchestrator.perf.floors`). Reads config and the model's shape; decides nothing."""
