"""Exporters of ``Loader.metrics()`` for the hosts: a plain callback, TensorBoard's ``SummaryWriter``, the Prometheus
text format (and a small HTTP endpoint serving it), and a flat ``{name: number}`` view the others (and Composer's
logger, ``zephon_streaming.ZephonMetrics``) read. See docs/metrics.md.
"""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def flatten(metrics: dict, prefix: str = "zephon") -> dict[str, float]:
    """``metrics`` (``Loader.metrics()``) as ``{"zephon/datasets/web/tokens": 123, ...}``: numbers only, nested keys
    joined with ``/``."""
    out = {}

    def walk(d, path):
        for k, v in d.items():
            key = f"{path}/{k}"
            if isinstance(v, dict):
                walk(v, key)
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                out[key] = v
    walk(metrics, prefix)
    return out


def every(iterable, metrics_fn, callback, n: int = 100):
    """Yield from ``iterable``; after every ``n`` items, and once at its end, call ``callback(step, metrics_fn())``
    (``step``: items so far). A plain callback for any training loop, e.g.
    ``for mb in every(loader, loader.metrics, print_it, 50): ...``. The end is also a loop that stops taking items
    (a ``break`` out of an endless loader: CPython closes the generator when the loop lets go of it) or an error
    raised by ``iterable``.

    Raises ``ValueError`` for ``n`` < 1."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    k = reported = 0  # items handed out; the step last reported
    try:
        for item in iterable:
            k += 1
            yield item
            if k % n == 0:
                reported = k
                callback(k, metrics_fn())
    finally:
        if k != reported:
            callback(k, metrics_fn())


def to_tensorboard(writer, metrics: dict, step: int, prefix: str = "zephon") -> None:
    """Write ``metrics`` to a TensorBoard ``SummaryWriter`` (``torch.utils.tensorboard`` or ``tensorboardX``): one
    scalar per number, tagged as ``flatten`` names them, at global step ``step``."""
    for tag, value in flatten(metrics, prefix).items():
        writer.add_scalar(tag, value, step)


def _label_value(v) -> str:
    """``v`` as a Prometheus text-format label value: backslash, double quote and line feed escaped (the format's
    three escapes; a raw line feed would end the sample's line)."""
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _line(name: str, value, labels: dict | None = None) -> str:
    if labels:
        inner = ",".join(f'{k}="{_label_value(v)}"' for k, v in labels.items())
        return f"{name}{{{inner}}} {float(value)!r}"
    return f"{name} {float(value)!r}"


def prometheus_text(metrics: dict, prefix: str = "zephon") -> str:
    """``metrics`` in the Prometheus text exposition format (version 0.0.4): one gauge per number, datasets and
    stages as labels (``zephon_dataset_tokens{dataset="web"} 123.0``, ``zephon_stage_seconds{stage="read"}``)."""
    lines = []

    def gauge(name, samples):
        lines.append(f"# TYPE {prefix}_{name} gauge")
        lines.extend(_line(f"{prefix}_{name}", v, labels) for labels, v in samples)

    for key in ("samples", "tokens", "sample_share", "token_share", "target_share"):
        gauge(f"dataset_{key}", [({"dataset": name}, d[key]) for name, d in metrics["datasets"].items()])
    gauge("stage_seconds", [({"stage": s}, v) for s, v in metrics["stage_s"].items()])
    gauge("remote", [({"counter": k}, v) for k, v in metrics["remote"].items()])
    for key, v in metrics.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            gauge(key, [(None, v)])
    return "\n".join(lines) + "\n"


def serve_prometheus(metrics_fn, port: int = 0, host: str = "127.0.0.1", prefix: str = "zephon"):
    """Serve ``prometheus_text(metrics_fn())`` at ``http://host:port/metrics`` from a daemon thread (``port`` 0: a
    free one). Returns the ``ThreadingHTTPServer`` (its ``server_address`` says where; ``shutdown()`` stops it)."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics is served")
                return
            body = prometheus_text(metrics_fn(), prefix).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # a scrape every few seconds must not fill the training log
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="zephon-metrics", daemon=True).start()
    return server


def format_metrics(metrics: dict) -> str:
    """A few human-readable lines of ``metrics`` (what ``zephon demo`` and ``zephon verify`` print at the end)."""
    ds = ", ".join(f"{name} {d['samples']:,} samples / {d['tokens']:,} tokens ({d['token_share']:.1%} of tokens, "
                   f"{d['sample_share']:.1%} of samples, target {d['target_share']:.1%})"
                   for name, d in metrics["datasets"].items())
    stages = ", ".join(f"{k} {v:.2f}s" for k, v in sorted(metrics["stage_s"].items(), key=lambda kv: -kv[1]))
    r = metrics["remote"]
    return "\n".join([
        f"metrics: {metrics['rows']:,} rows, {metrics['tokens']:,} tokens, padding {metrics['padding_fraction']:.2%} "
        f"of row slots ({metrics['padding_rows']} padding rows), skipped {metrics['skipped']}, filtered "
        f"{metrics['filtered']}",
        f"  datasets (delivered): {ds}",
        f"  time per stage: {stages}",
        f"  consumer waited {metrics['consumer_wait_s']:.2f}s ({metrics['consumer_wait_fraction']:.1%} of "
        f"{metrics['elapsed_s']:.2f}s), worker utilization {metrics['worker_utilization']:.1%}, remote "
        f"{r['downloads']} downloads / {r['downloaded_bytes']:,} bytes, cache {r['cache_hits']} hits / "
        f"{r['cache_misses']} misses"])
