"""Brute-force reference of the login anomaly detector: the spec's per-user rules, read literally."""

from __future__ import annotations


def run(
    batches: list[list[dict]], min_failures: int = 3, min_ips: int = 2, window_ms: int = 600_000, lateness_ms: int = 0
):
    """Alerts {(userId, eventTimestamp of the success): (failures, sorted failed IPs)} and late events."""
    open_seq: dict[int, tuple[int, list[str]]] = {}
    alerts: dict[tuple[int, int], tuple[int, list[str]]] = {}
    late: list[dict] = []
    max_seen = None
    for batch in batches:
        wm = max_seen - lateness_ms if max_seen is not None else None
        live = []
        for pos, ev in enumerate(batch):
            if wm is not None and wm > 0 and ev["eventTimestamp"] < wm:
                late.append(ev)
            else:
                live.append((ev["eventTimestamp"], pos, ev))
        for t, _pos, ev in sorted(live, key=lambda x: (x[0], x[1])):
            user = ev["userId"]
            seq = open_seq.get(user)
            is_open = seq is not None and t <= seq[0] + window_ms
            if ev["eventType"] == "FAIL":
                if is_open:
                    seq[1].append(ev["ipAddress"])
                else:
                    open_seq[user] = (t, [ev["ipAddress"]])
            elif is_open:
                ips = seq[1]
                if len(ips) >= min_failures and len(set(ips)) >= min_ips and ev["ipAddress"] not in ips:
                    alerts[(user, t)] = (len(ips), sorted(set(ips)))
                del open_seq[user]
        if batch:
            top = max(ev["eventTimestamp"] for ev in batch)
            max_seen = top if max_seen is None else max(max_seen, top)
    return alerts, late
