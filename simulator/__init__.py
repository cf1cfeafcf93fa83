"""The traffic simulator behind `tailwatch simulate`: realistic LLM-serving request spans, sent through the real
OpenTelemetry SDK.

A scenario is a healthy cluster plus one planted cause, confined to the fault window (the last
`window_minutes` before `end`). The history before it gives detectors their baselines. Everything
but the wall clock comes from `--seed`, span ids included, so a run can be repeated exactly.

Two emitters send the same requests:
- `attributes`: one `llm_request` span per request carrying everything (tenant, queue depth, cache hits,
  quantization, scores) as attributes, as an instrumented fleet can be made to send it;
- `vllm`: what a fleet sends with nothing custom: vLLM 0.33's own span (timings and token counts
  only), the gateway's span for tenant and model, `gen_ai.evaluation.result` log records for scores,
  and the engines' Prometheus metrics as the OpenTelemetry Collector forwards a 5-second scrape.
  Queue depth, replica count and cache hits then reach the request model only through the join.

The OpenTelemetry SDK and its exporters come with the `simulate` extra (`pip install 'tailwatch[simulate]'`,
which scripts/setup installs), not with the service, which never imports this package. `model`,
`scenarios` and `engine_metrics` need only the core dependencies; `simulate` (the run), the two emitters
(`attributes_emitter`, `vllm_emitter`) and `span_export` need the SDK.
"""
