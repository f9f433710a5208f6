"""The benchmark harness (``python -m bench``; see docs/benchmarks.md) and the scripts beside it.

The harness's sections (``bench/accuracy.py``, ``bench/speed.py``) replace the former
``compare_friendly_vs_gauss.py`` (friendly_aggregate against analyze_gauss by distance and d: the
synthetic grid and the downstream task) and ``bench_service.py`` (the chunked clipped Gram over
the in-memory ``X^T X``, request cost and ingestion: the speed and HTTP sections).

Kept as scripts, because each fixes a constant or records the measurement behind a design
decision that docs/mechanisms.md or the code cites:

- ``simulate_gamma_width.py``: fixes ``C2_WIDTH`` of histogram_aggregate's width rule;
- ``bench_padding.py``: calibrates the run-time model's default rates (service/padding.py);
- ``bench_exact_gapmax.py``: exact membership against the tolerance version it replaced;
- ``compare_spectrum_routes.py``: spectrum's eigenvalue route against the singular-value route;
- ``bench_friendly_aggregate.py``: friendly_aggregate's distance stage (direct tiles vs Gram);
- ``bench_continual_estimators.py``: continual_gauss's estimators (tree vs Honaker);
- ``bench_audit_verify.py`` and ``bench_api_requests.py``: the audit verifier's and the API's
  cost as the ledger grows (docs/reliability.md).
"""
