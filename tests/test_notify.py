"""Delivery: retried on failure, never blocking the caller, bounded."""

from __future__ import annotations

import json
import logging
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from receivers import WebhookReceiver
from waiting import HANG_GUARD, join, wait_until

from detectors.alerts import evaluate
from detectors.base import Condition, Severity, Window
from detectors.notify import Notifier, webhook_payload

AT = datetime(2026, 11, 20, 12, 0)


def fired():
    return evaluate(
        "cache_curve",
        [Condition({"bucket": "low", "signal": "json_adherence"}, 0.2, 0.1, "low bucket lost 0.20")],
        {},
        {},
        for_evaluations=1,
        default_severity=Severity.WARNING,
        window=Window(datetime(2026, 11, 20, 11, 55), AT),
        at=AT,
    )


class FlakyReceiver:
    """Answers `status` (503 unless told) to the first `failures` posts, then 200."""

    def __init__(self, failures: int, status: int = 503) -> None:
        self.attempts = 0
        self.bodies: list[Any] = []
        self.requests: list[tuple[str, str | None]] = []  # (path, Content-Type) of every post
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.attempts += 1
                outer.requests.append((self.path, self.headers.get("Content-Type")))
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if outer.attempts <= failures:
                    self.send_response(status)
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
        webhook_payloads="alerts",
        webhook_urls=(receiver.url,),
        max_attempts=5,
        backoff_seconds=0.5,
        registry=registry,
        sleep=sleeps.append,
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
        webhook_payloads="alerts",
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


def resolving():
    """A second evaluation: the low bucket still breaches (refreshed), the medium one has cleared."""
    window = Window(datetime(2026, 11, 20, 11, 55), AT)
    first = evaluate(
        "cache_curve",
        [
            Condition({"bucket": "low", "signal": "json_adherence"}, 0.2, 0.1, "low bucket lost 0.20"),
            Condition({"bucket": "medium", "signal": "json_adherence"}, 0.15, 0.1, "medium bucket lost 0.15"),
        ],
        {},
        {},
        for_evaluations=1,
        default_severity=Severity.WARNING,
        window=window,
        at=AT,
    )
    later = AT + timedelta(minutes=5)
    return evaluate(
        "cache_curve",
        [Condition({"bucket": "low", "signal": "json_adherence"}, 0.25, 0.1, "low bucket lost 0.25")],
        {a.fingerprint: a for a in first.fired},
        first.breaches,
        for_evaluations=1,
        default_severity=Severity.WARNING,
        window=Window(window.start + timedelta(minutes=5), later),
        at=later,
    )


def test_the_webhook_body_is_alertmanager_shaped() -> None:
    receiver = WebhookReceiver()
    notifier = Notifier(webhook_payloads="alerts", webhook_urls=(receiver.url,))
    evaluation = fired()
    notifier.publish("cache_curve", evaluation, 300)
    assert notifier.flush(10)
    [alert] = evaluation.fired
    assert receiver.bodies == [
        {
            "receiver": "tailwatch",
            "status": "firing",
            "detector": "cache_curve",
            "alerts": [
                {
                    "status": "firing",
                    "labels": {
                        "alertname": "tailwatch_cache_curve",
                        "detector": "cache_curve",
                        "severity": "warning",
                        "bucket": "low",
                        "signal": "json_adherence",
                    },
                    "annotations": {"summary": "low bucket lost 0.20"},
                    "startsAt": "2026-11-20T12:00:00.000000Z",
                    "endsAt": None,
                    "fingerprint": alert.fingerprint,
                    "alert_id": alert.alert_id,
                    "value": 0.2,
                    "threshold": 0.1,
                    "window_start": "2026-11-20T11:55:00.000000Z",
                    "window_end": "2026-11-20T12:00:00.000000Z",
                }
            ],
        }
    ]
    receiver.close()


def test_a_resolved_alert_is_posted_to_the_webhook_with_its_end_time() -> None:
    [resolved] = resolving().resolved
    body = webhook_payload("cache_curve", "resolved", [resolved])
    assert (body["receiver"], body["status"], body["detector"]) == ("tailwatch", "resolved", "cache_curve")
    [alert] = body["alerts"]
    assert (alert["status"], alert["labels"]["bucket"], alert["value"]) == ("resolved", "medium", 0.15)
    assert (alert["startsAt"], alert["endsAt"]) == ("2026-11-20T12:00:00.000000Z", "2026-11-20T12:05:00.000000Z")


def test_alertmanager_gets_json_with_firing_alerts_expiring_four_intervals_ahead_and_resolved_ones_ended() -> None:
    receiver = FlakyReceiver(failures=0)
    now = datetime(2026, 11, 20, 12, 5, 7, tzinfo=UTC)
    notifier = Notifier(alertmanager_url=receiver.url.removesuffix("/hook") + "/", clock=now.timestamp)
    notifier.publish("cache_curve", resolving(), 300)
    assert notifier.flush(HANG_GUARD)
    assert receiver.requests == [("/api/v2/alerts", "application/json")]
    common = {"alertname": "tailwatch_cache_curve", "detector": "cache_curve", "severity": "warning"}
    assert receiver.bodies == [
        [
            {
                "labels": {**common, "bucket": "low", "signal": "json_adherence"},
                "annotations": {"summary": "low bucket lost 0.25"},
                "startsAt": "2026-11-20T12:00:00.000000Z",
                "endsAt": "2026-11-20T12:25:07.000000Z",  # now + 4 x 300 s: resolves itself if Tailwatch stops
            },
            {
                "labels": {**common, "bucket": "medium", "signal": "json_adherence"},
                "annotations": {"summary": "medium bucket lost 0.15"},
                "startsAt": "2026-11-20T12:00:00.000000Z",
                "endsAt": "2026-11-20T12:05:00.000000Z",
            },
        ]
    ]
    notifier.close()
    receiver.server.shutdown()


def test_a_server_error_500_and_a_429_are_retried() -> None:
    for status in (500, 429):
        receiver = FlakyReceiver(failures=1, status=status)
        sleeps: list[float] = []
        notifier = Notifier(
            webhook_payloads="alerts", webhook_urls=(receiver.url,), backoff_seconds=0.5, sleep=sleeps.append
        )
        notifier.publish("cache_curve", fired(), 300)
        assert notifier.flush(HANG_GUARD)
        assert (receiver.attempts, len(receiver.bodies), sleeps) == (2, 1, [0.5]), status
        notifier.close()
        receiver.server.shutdown()


def test_a_client_error_is_not_retried_and_the_log_names_the_url_and_the_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    receiver = FlakyReceiver(failures=5, status=400)
    registry = CollectorRegistry()
    notifier = Notifier(
        webhook_payloads="alerts", webhook_urls=(receiver.url,), registry=registry, sleep=lambda s: None
    )
    with caplog.at_level(logging.WARNING, logger="detectors.notify"):
        notifier.publish("cache_curve", fired(), 300)
        assert notifier.flush(HANG_GUARD)
    assert receiver.attempts == 1
    assert registry.get_sample_value("tailwatch_alert_notifications_total", {"sink": "webhook", "outcome": "failed"})
    assert [r.getMessage() for r in caplog.records if r.name == "detectors.notify"] == [
        f"alert delivery to {receiver.url} failed after 1 attempt(s): HTTP 400"
    ]
    notifier.close()
    receiver.server.shutdown()


def test_close_delivers_what_is_queued_and_ends_the_delivery_threads() -> None:
    receiver = WebhookReceiver()
    before = set(threading.enumerate())
    notifier = Notifier(webhook_payloads="alerts", webhook_urls=(receiver.url,))
    threads = [t for t in threading.enumerate() if t not in before and t.name.startswith("tailwatch-notify-")]
    assert [t.name for t in threads] == ["tailwatch-notify-webhook"]
    notifier.publish("cache_curve", fired(), 300)
    notifier.close()
    for thread in threads:
        join(thread, "the webhook delivery thread to end after close")
    assert [b["status"] for b in receiver.bodies] == ["firing"]
    receiver.close()
