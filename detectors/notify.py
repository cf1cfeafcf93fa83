"""Alert delivery: a generic JSON webhook and the Prometheus Alertmanager v2 API.

One page per fault: webhooks get an incident's transitions (opened, updated when it grows or changes severity,
resolved) rather than each alert (`alerting.webhook_payloads`), and every alert sent to Alertmanager carries
its incident's id as the `incident_id` label, so a route with `group_by: [incident_id]` makes one notification
of an incident, another when an alert joins it, and one when it resolves (docs/incidents.md).

Detection never waits for delivery: `publish` only queues. Each destination has its own thread, so a
slow or down receiver delays nobody else; failed posts are retried with exponential backoff, and when
a destination's queue is full the oldest notification is dropped and counted.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Counter

from detectors.alerts import Alert, Evaluation
from storage.ports import Incident

# What webhooks are sent: each incident's transitions (one page a fault), each alert's, or both.
WebhookPayloads = Literal["incidents", "alerts", "both"]

log = logging.getLogger(__name__)


def _rfc3339(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _labels(alert: Alert, incident: Incident | None = None) -> dict[str, str]:
    labels = {"alertname": f"tailwatch_{alert.detector}", "detector": alert.detector, "severity": alert.severity,
              **alert.labels}  # fmt: skip
    return labels | {"incident_id": incident.incident_id} if incident is not None else labels


def _annotations(alert: Alert, incident: Incident | None) -> dict[str, str]:
    return {"summary": alert.summary} | ({"incident": incident.title} if incident is not None else {})


def webhook_payload(detector: str, status: str, alerts: list[Alert]) -> dict[str, Any]:
    """Alertmanager-webhook-shaped JSON, so receivers written for Alertmanager can take it unchanged."""
    return {
        "receiver": "tailwatch",
        "status": status,
        "detector": detector,
        "alerts": [
            {
                "status": a.state,
                "labels": _labels(a),
                "annotations": {"summary": a.summary},
                "startsAt": _rfc3339(a.started_at),
                "endsAt": _rfc3339(a.resolved_at) if a.resolved_at else None,
                "fingerprint": a.fingerprint,
                "alert_id": a.alert_id,
                "value": a.value,
                "threshold": a.threshold,
                "window_start": _rfc3339(a.window_start),
                "window_end": _rfc3339(a.window_end),
            }
            for a in alerts
        ],
    }


def incident_payload(transition: str, incident: Incident) -> dict[str, Any]:
    """A webhook body for one incident transition: `opened`, `updated` or `resolved`, with the incident whole."""
    return {
        "receiver": "tailwatch",
        "kind": "incident",
        "status": "resolved" if transition == "resolved" else "firing",
        "transition": transition,
        "incident": {k: (v.isoformat() + "Z" if isinstance(v, datetime) else v) for k, v in vars(incident).items()},
    }


def alertmanager_payload(
    evaluation: Evaluation, expires_at: datetime, incidents: Mapping[str, Incident] | None = None
) -> list[dict[str, Any]]:
    """POST /api/v2/alerts body. Firing alerts carry an endsAt a few intervals ahead and are re-sent every
    evaluation, as Prometheus does, so Alertmanager resolves them by itself if Tailwatch goes away. Each alert
    in an incident is labelled with its id."""
    of = incidents or {}
    body = []
    for alert in evaluation.firing:
        body.append(
            {
                "labels": _labels(alert, of.get(alert.alert_id)),
                "annotations": _annotations(alert, of.get(alert.alert_id)),
                "startsAt": _rfc3339(alert.started_at),
                "endsAt": _rfc3339(expires_at),
            }
        )
    for alert in evaluation.resolved:
        if alert.resolved_at is None:
            raise ValueError(f"alert {alert.alert_id} is resolved but has no resolved_at")
        body.append(
            {
                "labels": _labels(alert, of.get(alert.alert_id)),
                "annotations": _annotations(alert, of.get(alert.alert_id)),
                "startsAt": _rfc3339(alert.started_at),
                "endsAt": _rfc3339(alert.resolved_at),
            }
        )
    return body


class _Destination:
    """One receiver URL with its own queue and delivery thread."""

    def __init__(self, name: str, url: str, notifier: Notifier) -> None:
        self.name = name
        self.url = url
        self._notifier = notifier
        self._queue: deque[bytes] = deque()
        self._cv = threading.Condition()
        self._busy = False
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=f"tailwatch-notify-{name}", daemon=True)
        self._thread.start()

    def put(self, body: bytes) -> None:
        with self._cv:
            if len(self._queue) >= self._notifier.queue_size:
                self._queue.popleft()
                self._notifier.metrics.dropped.labels(self.name).inc()
            self._queue.append(body)
            self._cv.notify_all()

    def idle(self) -> bool:
        with self._cv:
            return not self._queue and not self._busy

    def close(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:
                    return
                body = self._queue.popleft()
                self._busy = True
            try:
                self._deliver(body)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _deliver(self, body: bytes) -> None:
        n = self._notifier
        for attempt in range(1, n.max_attempts + 1):
            try:
                # Only http(s) URLs reach here: the settings reject any other scheme.
                request = urllib.request.Request(  # noqa: S310
                    self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
                )
                with urllib.request.urlopen(request, timeout=n.timeout_seconds) as response:  # noqa: S310
                    response.read()
                n.metrics.sent.labels(self.name, "ok").inc()
                return
            except urllib.error.HTTPError as exc:
                retry = exc.code == 429 or exc.code >= 500
                problem = f"HTTP {exc.code}"
            except (OSError, TimeoutError) as exc:
                retry, problem = True, str(exc)
            if not retry or attempt == n.max_attempts:
                n.metrics.sent.labels(self.name, "failed").inc()
                log.warning("alert delivery to %s failed after %d attempt(s): %s", self.url, attempt, problem)
                return
            n.metrics.sent.labels(self.name, "retried").inc()
            n.sleep(n.backoff_seconds * 2 ** (attempt - 1))


class NotifyMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        kw: dict[str, Any] = {"registry": registry}
        self.sent = Counter(
            "tailwatch_alert_notifications",
            "Alert notifications by destination and outcome.",
            ["sink", "outcome"],
            **kw,
        )
        self.dropped = Counter(
            "tailwatch_alert_notifications_dropped", "Notifications dropped because a queue was full.", ["sink"], **kw
        )


class Notifier:
    """The webhook and Alertmanager sinks; the alerts table and the log are written by the detection pass."""

    def __init__(
        self,
        *,
        webhook_urls: tuple[str, ...] = (),
        alertmanager_url: str | None = None,
        timeout_seconds: float = 5.0,
        max_attempts: int = 5,
        backoff_seconds: float = 1.0,
        queue_size: int = 1000,
        webhook_payloads: WebhookPayloads = "incidents",
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.timeout_seconds = timeout_seconds
        self.max_attempts = max_attempts
        self.backoff_seconds = backoff_seconds
        self.queue_size = queue_size
        self.webhook_payloads = webhook_payloads
        self.metrics = NotifyMetrics(registry)
        self.sleep = sleep
        self._clock = clock
        self._webhooks = [_Destination("webhook", url, self) for url in webhook_urls]
        self._alertmanager = (
            _Destination("alertmanager", alertmanager_url.rstrip("/") + "/api/v2/alerts", self)
            if alertmanager_url
            else None
        )

    def publish(
        self, detector: str, evaluation: Evaluation, interval_seconds: int,
        incidents: Mapping[str, Incident] | None = None,
    ) -> None:  # fmt: skip
        """Queue one evaluation's notifications (`incidents`: the incident each alert is in); returns at once."""
        if self._webhooks and self.webhook_payloads in ("alerts", "both"):
            for status, alerts in (("firing", evaluation.fired), ("resolved", evaluation.resolved)):
                if alerts:
                    body = json.dumps(webhook_payload(detector, status, alerts)).encode()
                    for hook in self._webhooks:
                        hook.put(body)
        if self._alertmanager is not None and (evaluation.firing or evaluation.resolved):
            now = datetime.fromtimestamp(self._clock(), UTC).replace(tzinfo=None)
            expires = now + timedelta(seconds=4 * interval_seconds)
            self._alertmanager.put(json.dumps(alertmanager_payload(evaluation, expires, incidents)).encode())

    def publish_incident(self, transition: str, incident: Incident) -> None:
        """Queue an incident's transition for the webhooks (with `webhook_payloads` incidents or both)."""
        if self._webhooks and self.webhook_payloads in ("incidents", "both"):
            body = json.dumps(incident_payload(transition, incident)).encode()
            for hook in self._webhooks:
                hook.put(body)

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued is delivered or given up on; False on timeout."""
        deadline = time.monotonic() + timeout
        destinations = [*self._webhooks, *([self._alertmanager] if self._alertmanager else [])]
        while time.monotonic() < deadline:
            if all(d.idle() for d in destinations):
                return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        for d in [*self._webhooks, *([self._alertmanager] if self._alertmanager else [])]:
            d.close()
