"""The benchmark harness (``python -m bench``; see docs/benchmarks.md) and the scripts beside it.

The harness's sections (``bench/accuracy.py``, ``bench/speed.py``) replace the former
``compare_friendly_vs_gauss.py`` (friendly_aggregate against analyze_gauss by distance and d: the
synthetic grid and the downstream task) and ``bench_service.py`` (the chunked clipped Gram over
the in-memory ``X^T X``, request cost and ingestion: the speed and HTTP sections).

Beside the harness: standing benchmarks re-run when what they measure changes
(``bench_api_requests.py``, ``bench_audit_verify.py``, ``bench_padding.py``, the HTTP latency
ones, ``auto``'s grid). One-off experiments leave the tree once the docs record their figures
(the docs cite each with the commit that still has it). bench/README.md says what each file is
for.
"""
