"""Delivery: retried on failure, never blocking the caller, bounded."""

from __future__ import annotations

import json
import threading
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from receivers import WebhookReceiver
from waiting import HANG_GUARD, join, wait_until

from detectors.alerts import evaluate
from detectors.base import Condition, Severity, Window
from detectors.notify import Notifier

AT = datetime(2026, 11, 20, 12, 0)


def fired():
    return evaluate(
        "cache_curve",
        [Condition({"bucket": "low", "score": "json_adherence"}, 0.2, 0.1, "low bucket lost 0.20")],
        {},
        {},
        for_evaluations=1,
        default_severity=Severity.WARNING,
        window=Window(datetime(2026, 11, 20, 11, 55), AT),
        at=AT,
    )


class FlakyReceiver:
    """Answers 503 to the first `failures` posts, then 200."""

    def __init__(self, failures: int) -> None:
        self.attempts = 0
        self.bodies: list[object] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.attempts += 1
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if outer.attempts <= failures:
                    self.send_response(503)
                else:
                    outer.bodies.append(json.loads(body))
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_failing_webhook_is_retried_with_backoff_until_it_answers() -> None:
    receiver = FlakyReceiver(failures=2)
    sleeps: list[float] = []
    registry = CollectorRegistry()
    notifier = Notifier(
        webhook_urls=(receiver.url,), max_attempts=5, backoff_seconds=0.5, registry=registry, sleep=sleeps.append
    )
    notifier.publish("cache_curve", fired(), 300)
    assert notifier.flush(10)
    assert receiver.attempts == 3 and len(receiver.bodies) == 1
    assert sleeps == [0.5, 1.0]  # exponential backoff, injected: the test never sleeps
    assert registry.get_sample_value("tailwatch_alert_notifications_total", {"sink": "webhook", "outcome": "ok"}) == 1
    assert (
        registry.get_sample_value("tailwatch_alert_notifications_total", {"sink": "webhook", "outcome": "retried"}) == 2
    )
    receiver.server.shutdown()


def test_publishing_to_a_dead_receiver_does_not_wait_for_delivery_or_retries() -> None:
    """publish only queues: it returns while the delivery thread is stuck backing off before a retry.

    The backoff sleep is held until the test releases it, so nothing here depends on how fast the machine
    is; a publish that waited for delivery would never return and the hang guard fails the test. How long
    a publish takes is measured by bench/notify.py.
    """
    backing_off = threading.Event()
    release = threading.Event()

    def held_sleep(seconds: float) -> None:
        backing_off.set()
        release.wait(HANG_GUARD)

    registry = CollectorRegistry()
    notifier = Notifier(
        webhook_urls=("http://127.0.0.1:9/never",),
        max_attempts=3,
        backoff_seconds=5.0,
        registry=registry,
        sleep=held_sleep,
    )

    def outcome(name: str) -> float:
        value = registry.get_sample_value("tailwatch_alert_notifications_total", {"sink": "webhook", "outcome": name})
        return value or 0.0

    try:
        publisher = threading.Thread(
            target=lambda: [notifier.publish("cache_curve", fired(), 300) for _ in range(50)], daemon=True
        )
        publisher.start()
        join(publisher, "50 publishes to return (a publish that waits for delivery never does)")
        wait_until(backing_off.is_set, "the first delivery to fail and back off before its retry")
        # Every publish returned, yet delivery has not gone past the first notification's first backoff.
        assert (outcome("retried"), outcome("failed")) == (1, 0)
    finally:
        release.set()
    assert notifier.flush(HANG_GUARD)
    assert (outcome("retried"), outcome("failed"), outcome("ok")) == (100, 50, 0)
    notifier.close()


def test_the_webhook_body_is_alertmanager_shaped() -> None:
    receiver = WebhookReceiver()
    notifier = Notifier(webhook_urls=(receiver.url,))
    notifier.publish("cache_curve", fired(), 300)
    assert notifier.flush(10)
    [body] = receiver.bodies
    assert body["status"] == "firing" and body["detector"] == "cache_curve"
    [alert] = body["alerts"]
    assert alert["labels"] == {
        "alertname": "tailwatch_cache_curve", "detector": "cache_curve", "severity": "warning",
        "bucket": "low", "score": "json_adherence",
    }  # fmt: skip
    assert alert["annotations"]["summary"] == "low bucket lost 0.20"
    assert alert["startsAt"] == "2026-11-20T12:00:00.000000Z"
    receiver.close()
