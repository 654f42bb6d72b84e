"""etcd request metrics, fed by ``EtcdStore.observer``, and ``hafo.retry``'s retry count
(both daemons register them)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from hafo import retry

ETCD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                5.0, 10.0)


class EtcdMetrics:
    """``hafo_etcd_request_duration_seconds`` and ``hafo_etcd_request_errors_total``; also
    ``hafo_retries_total`` (``hafo.retry``: every retry of the process, by what)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.seconds = Histogram(
            "hafo_etcd_request_duration_seconds", "Seconds each etcd request attempt took "
            "(failed attempts included)", buckets=ETCD_BUCKETS, registry=registry)
        self.errors = Counter(
            "hafo_etcd_request_errors", "etcd request attempts that failed, by exception class",
            ["error"], registry=registry)
        retry.register_metrics(registry)

    def observe(self, seconds: float, error: BaseException | None) -> None:
        """The store's observer: one etcd request attempt."""
        self.seconds.observe(seconds)
        if error is not None:
            self.errors.labels(type(error).__name__).inc()
