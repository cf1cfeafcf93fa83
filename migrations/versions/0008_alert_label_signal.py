"""Alert labels: the compared thing is `signal` in every detector; cache_curve, context_length, saturation and
traffic_pattern called it `score`.

Their stored alerts get the label renamed and the fingerprint recomputed from the new labels, so the first
pass after the upgrade finds an alert that was firing under its new fingerprint and keeps it firing (same
alert_id, same started_at) instead of resolving it and firing a new one. The hold-down counts in
alert_conditions move to the new fingerprint where an alert of the detector (firing or resolved) says which
labels the old one hashed; a fingerprint is a hash, so a count no alert explains cannot be moved and is
dropped: that breach counts from one again. Downgrade is the same in reverse.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-21
"""

import hashlib
import json
from collections.abc import Mapping

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_DETECTORS = ("cache_curve", "context_length", "saturation", "traffic_pattern")
_IN_DETECTORS = "detector IN (" + ", ".join(f"'{d}'" for d in _DETECTORS) + ")"
_OLD, _NEW = "score", "signal"


def _fingerprint(detector: str, labels: Mapping[str, str]) -> str:
    # Frozen copy of detectors.alerts.fingerprint as of this revision: revisions never import the application,
    # so this one keeps computing the fingerprints it was written for whatever the live rule becomes.
    canonical = json.dumps({"detector": detector, "labels": dict(sorted(labels.items()))}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _rename(old: str, new: str) -> None:
    conn = op.get_bind()
    alerts = conn.execute(
        sa.text(f"SELECT alert_id, detector, fingerprint, labels::VARCHAR FROM alerts WHERE {_IN_DETECTORS}")
    ).all()
    ids, texts, fingerprints = [], [], []
    moved: dict[tuple[str, str], str] = {}  # (detector, fingerprint before) -> fingerprint after
    for alert_id, detector, before, text in alerts:
        labels = json.loads(text)
        if old in labels and new not in labels:
            labels = {new if name == old else name: value for name, value in labels.items()}
        after = _fingerprint(detector, labels)
        moved[(detector, before)] = after
        if after != before:
            ids.append(alert_id)
            texts.append(json.dumps(labels, sort_keys=True))  # as the application stores labels: sorted keys
            fingerprints.append(after)
    # One statement each, over lists bound as parameters: a row-at-a-time UPDATE rescans the table per alert.
    conn.execute(
        sa.text(
            """UPDATE alerts SET labels = r.labels::JSON, fingerprint = r.fingerprint
               FROM (SELECT unnest(:ids) AS alert_id, unnest(:labels) AS labels, unnest(:fingerprints) AS fingerprint)
                    AS r
               WHERE alerts.alert_id = r.alert_id"""
        ),
        {"ids": ids, "labels": texts, "fingerprints": fingerprints},
    )
    pairs = {
        "detectors": [detector for detector, _ in moved],
        "before": [before for _, before in moved],
        "after": list(moved.values()),
    }
    moves = "SELECT unnest(:detectors) AS detector, unnest(:before) AS before, unnest(:after) AS after"
    conn.execute(
        sa.text(
            f"""DELETE FROM alert_conditions AS c WHERE c.{_IN_DETECTORS} AND NOT EXISTS (
                    SELECT 1 FROM ({moves}) AS m WHERE m.detector = c.detector AND m.before = c.fingerprint)"""
        ),
        pairs,
    )
    conn.execute(
        sa.text(
            f"""UPDATE alert_conditions SET fingerprint = m.after FROM ({moves}) AS m
                WHERE alert_conditions.detector = m.detector AND alert_conditions.fingerprint = m.before"""
        ),
        pairs,
    )


def upgrade() -> None:
    _rename(_OLD, _NEW)


def downgrade() -> None:
    _rename(_NEW, _OLD)
