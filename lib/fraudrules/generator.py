"""Demo data: reproducible transaction and login workloads with injected suspicious patterns, and
rate-controlled writers into landing folders or Kafka topics (what `fraudrules run` and `generate` feed).

The engine never imports this module: it reads whatever lands in its sources.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import resources

import numpy as np

from fraudrules.config import JobConfig
from fraudrules.event_schema import DEFAULT, EventSchema
from fraudrules.kafka_client import producer, send

_CHUNK = 100_000
SAMPLE_RULES = "sample_rules.json"  # rules that catch the injected bursts, plus the login detector (in the package)
RICH_SAMPLE_RULES = "sample_rules_rich.json"  # the same, plus rules on the rich schema's fields
TRANSACTIONS_PER_LOGIN = 10  # the demo's mix: a login for every ten transactions


def sample_rules_path(schema: EventSchema = DEFAULT) -> str:
    """The sample rules for a job of this schema (with rules on the rich fields when it declares them)."""
    name = RICH_SAMPLE_RULES if is_rich(schema) else SAMPLE_RULES
    return str(resources.files("fraudrules").joinpath(name))


RICH_FIELDS = (
    "channel",
    "deviceId",
    "merchant.id",
    "merchant.category",
    "merchant.country",
    "basket.items",
    "card.bin",
)


def is_rich(schema: EventSchema) -> bool:
    """Whether events of this schema carry the fields `RichWorkload` writes."""
    return all(schema.field(p) is not None for p in RICH_FIELDS)


@dataclass(frozen=True)
class Workload:
    count: int = 200_000
    payees: int = 2_000
    beneficiaries: int = 500
    events_per_second: float = 500.0  # density in event time
    zipf: float = 1.1  # key popularity skew
    start_ms: int = 1_700_000_000_000
    seed: int = 7
    burst_every: int = 2_000  # one injected burst per this many transactions (0 = none)
    first_id: int = 1

    def transactions(self) -> Iterator[dict]:
        """Transactions in eventTime order; every `burst_every`, a payee hammers one beneficiary."""
        rng = np.random.default_rng(self.seed)
        payee_w = _zipf_weights(self.payees, self.zipf)
        ben_w = _zipf_weights(self.beneficiaries, self.zipf)
        clock, burst_left, burst = float(self.start_ms), 0, (0, 0)
        for offset in range(0, self.count, _CHUNK):  # drawn in chunks: endless workloads stay small
            n = min(_CHUNK, self.count - offset)
            times = clock + np.cumsum(rng.exponential(1000.0 / self.events_per_second, n))
            clock = float(times[-1])
            payees = rng.choice(self.payees, n, p=payee_w) + 1
            bens = rng.choice(self.beneficiaries, n, p=ben_w) + 1
            cents = np.round(rng.lognormal(8.0, 1.2, n)).astype(np.int64) + 1
            types = np.where(rng.random(n) < 0.3, "CSH", "CRD")
            for j in range(n):
                i = offset + j
                payee, ben, amount = int(payees[j]), int(bens[j]), int(cents[j])
                if self.burst_every and i % self.burst_every == self.burst_every - 1:
                    burst_left, burst = 8, (payee, ben)
                if burst_left:  # suspicious: repeated large payments between one pair within seconds
                    payee, ben, amount = burst[0], burst[1], 900_000 + amount
                    burst_left -= 1
                yield {
                    "transactionId": self.first_id + i,
                    "eventTime": int(times[j]),
                    "payeeId": payee,
                    "beneficiaryId": ben,
                    "paymentAmount": f"{amount // 100}.{amount % 100:02d}",
                    "paymentType": str(types[j]),
                }


CHANNELS = ("web", "app", "pos", "atm")
CATEGORIES = ("grocery", "fuel", "travel", "electronics", "fashion", "gambling")
COUNTRIES = ("FR", "DE", "GB", "NL", "ES", "IT", "US", "PL", "SE", "MT")


@dataclass(frozen=True)
class RichWorkload(Workload):
    """Transactions of the rich schema (`schemas/rich.ddl`): the reference demo's fields (and its bursts) plus a
    channel, a device, a merchant (id, category, country), a basket and a card, some of them absent (null):
    cash payments have no card, payments at a till no device, one in five no basket, a few merchants no category.
    Injected fraud on the new fields: every `device_burst_every` transactions, `device_burst` payments in a row
    from one device on the web or the app; every `gambling_burst_every`, `gambling_burst` large gambling payments
    into one merchant country over the web."""

    devices: int = 20_000
    merchants: int = 3_000
    device_burst_every: int = 5_000
    device_burst: int = 45
    gambling_burst_every: int = 4_000
    gambling_burst: int = 12

    def transactions(self) -> Iterator[dict]:
        rng = np.random.default_rng(self.seed + 1)
        merchant_w = _zipf_weights(self.merchants, self.zipf)
        merchant_country = rng.choice(len(COUNTRIES), self.merchants, p=_zipf_weights(len(COUNTRIES), 1.0))
        merchant_category = rng.choice(len(CATEGORIES), self.merchants, p=[0.3, 0.15, 0.15, 0.15, 0.2, 0.05])
        device_left = gambling_left = 0
        device = country = 0
        for i, tx in enumerate(super().transactions()):
            if i % _CHUNK == 0:
                n = min(_CHUNK, self.count - i)
                channels = rng.choice(len(CHANNELS), n, p=[0.45, 0.3, 0.2, 0.05])
                devices = rng.integers(self.devices, size=n)  # no hot device: a device's burst stands out
                merchants = rng.choice(self.merchants, n, p=merchant_w)
                items, roll = rng.integers(1, 12, n), rng.random((n, 3))
            j = i % _CHUNK
            if self.device_burst_every and i % self.device_burst_every == self.device_burst_every - 1:
                device_left, device = self.device_burst, int(devices[j])
            if self.gambling_burst_every and i % self.gambling_burst_every == self.gambling_burst_every // 2:
                gambling_left, country = self.gambling_burst, int(rng.integers(len(COUNTRIES)))
            channel, merchant = CHANNELS[channels[j]], int(merchants[j])
            extra = {
                "channel": channel,
                "deviceId": f"d-{devices[j]:06d}",
                "merchant": {
                    "id": f"m-{merchant:05d}",
                    "category": CATEGORIES[merchant_category[merchant]],
                    "country": COUNTRIES[merchant_country[merchant]],
                },
                "basket": {"items": int(items[j])},
                "card": {"bin": f"{400000 + merchant * 7 % 99991:06d}"},
            }
            if device_left:  # one device hammering the web or the app
                extra["deviceId"], extra["channel"] = f"d-{device:06d}", ("web", "app")[device_left % 2]
                device_left -= 1
            elif gambling_left:  # large gambling payments into one country within seconds
                extra["channel"], extra["merchant"]["country"] = "web", COUNTRIES[country]
                extra["merchant"]["category"] = "gambling"
                tx["paymentAmount"] = f"{2_000 + int(roll[j, 0] * 3_000)}.{int(roll[j, 1] * 100):02d}"
                gambling_left -= 1
            if extra["channel"] in ("pos", "atm"):
                del extra["deviceId"]
            if tx["paymentType"] == "CSH":
                del extra["card"]
            if roll[j, 2] < 0.2:
                del extra["basket"]
            elif roll[j, 2] > 0.98:
                del extra["merchant"]["category"]
            yield {**tx, **extra}


def _zipf_weights(n: int, s: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


def write_jsonl(folder: str, transactions: Iterator[dict], per_file: int = 5_000, prefix: str = "part") -> int:
    """Write transactions as numbered JSON-lines files (atomic renames), each modified at least a millisecond after
    the one before: the file source takes files in modification-time order, so a bounded micro-batch
    (`--max-records-per-trigger`) reads them as written, never the later events first and the earlier ones late.
    Returns how many transactions were written."""
    os.makedirs(folder, exist_ok=True)
    n, chunk, index, last_ms = 0, [], 0, 0
    for tx in transactions:
        chunk.append(tx)
        if len(chunk) == per_file:
            last_ms = _write_file(folder, f"{prefix}-{index:06d}.json", chunk, after_ms=last_ms)
            n, chunk, index = n + len(chunk), [], index + 1
    if chunk:
        _write_file(folder, f"{prefix}-{index:06d}.json", chunk, after_ms=last_ms)
        n += len(chunk)
    return n


def _write_file(folder: str, name: str, rows: list[dict], after_ms: int = 0) -> int:
    """Write `rows` as `folder/name`, modified in a later millisecond than `after_ms`; its modification time (ms)."""
    # Written beside the folder, then renamed in: the file source never sees a half-written file.
    # A unique temporary name: writers of sibling folders share the parent and may pick the same `name`.
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=os.path.dirname(os.path.abspath(folder)))
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in rows))
    modified_ms = os.stat(tmp).st_mtime_ns // 1_000_000
    if modified_ms <= after_ms:
        modified_ms = after_ms + 1
        os.utime(tmp, ns=(modified_ms * 1_000_000, modified_ms * 1_000_000))
    os.replace(tmp, os.path.join(folder, name))
    return modified_ms


class PacedWriter(threading.Thread):
    """Emits `rate` events per second in ticks of `tick_s`, stamping ingestionTimestamp; subclasses
    say where a tick's events go (`emit`) and what to do at the end (`close`).

    With `realtime`, the event's time field is the wall clock as well (the `make run` demo): the moment the paced
    stream was due to produce the event, its tick's events spread over the tick's interval. Times then increase
    strictly, each event at its own millisecond, for up to 1,000 events a second, even when the writer falls
    behind and catches up in quick ticks (stamping a tick's events with one moment made two logins of one user
    from one IP identical events); otherwise the workload's own event times are kept (benchmarks).
    """

    def __init__(
        self,
        events: Iterator[dict],
        rate: float,
        tick_s: float = 0.1,
        realtime: bool = False,
        limit: int | None = None,
        time_field: str = "eventTime",
        name: str = "rate-writer",
        clock: Callable[[], float] = time.time,
        pause: Callable[[float], object] | None = None,
    ):
        super().__init__(daemon=True, name=name)
        self.events, self.rate, self.tick_s = events, rate, tick_s
        self.realtime, self.limit, self.time_field = realtime, limit, time_field
        self.written = 0
        self._halt = threading.Event()
        # the wall clock and the wait until the next tick (interrupted by `stop`); tests give their own
        self._clock, self._pause = clock, pause or self._halt.wait

    def stop(self) -> None:
        self._halt.set()

    def emit(self, rows: list[dict], now_ms: int, tick: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Called once when the writer ends."""

    def run(self) -> None:
        started, tick = self._clock(), 0
        tick_ms = int(self.tick_s * 1000)
        try:
            while not self._halt.is_set() and (self.limit is None or self.written < self.limit):
                tick += 1
                due = int(self.rate * tick * self.tick_s) - self.written
                if self.limit is not None:
                    due = min(due, self.limit - self.written)
                now = int(self._clock() * 1000)
                rows = list(itertools.islice(self.events, max(0, due)))
                if due > 0 and not rows:
                    break  # the workload is exhausted
                due_from = int(started * 1000) + (tick - 2) * tick_ms  # the tick's events were due by now
                for k, event in enumerate(rows):
                    event["ingestionTimestamp"] = now
                    if self.realtime:
                        event[self.time_field] = due_from + (k + 1) * tick_ms // len(rows)
                if rows:
                    self.emit(rows, now, tick)
                    self.written += len(rows)
                self._pause(max(0.0, started + tick * self.tick_s - self._clock()))
        finally:
            self.close()


class RateWriter(PacedWriter):
    """A paced writer into a landing folder: one JSON-lines file per tick."""

    def __init__(self, folder: str, events: Iterator[dict], rate: float, **kwargs):
        super().__init__(events, rate, **kwargs)
        self.folder = folder
        os.makedirs(folder, exist_ok=True)

    def emit(self, rows: list[dict], now_ms: int, tick: int) -> None:
        _write_file(self.folder, f"rt-{now_ms}-{tick:08d}.json", rows)


class KafkaRateWriter(PacedWriter):
    """A paced writer into a topic: one message per event, polled per tick, flushed at the end."""

    def __init__(self, bootstrap: str, topic: str, events: Iterator[dict], rate: float, **kwargs):
        super().__init__(events, rate, name=f"kafka-writer-{topic}", **kwargs)
        # librdkafka's log critical only: while a broker is down it logs each reconnection, several a second
        self.topic, self._producer = topic, producer(bootstrap, log_level=2)

    def emit(self, rows: list[dict], now_ms: int, tick: int) -> None:
        for event in rows:
            send(self._producer, self.topic, json.dumps(event).encode())
        self._producer.poll(0)

    def close(self) -> None:
        self._producer.flush(10)


@dataclass(frozen=True)
class LoginWorkload:
    """Login events: users mostly log in from their home IP; every `attack_every` events an attacker
    fails from several IPs and then succeeds from yet another one, within a minute. No user has two events in one
    millisecond: at 100 logins a second among 500 users, two draws of one user less than 1 ms apart made identical
    events (user, type, IP, time), which the logins suite rightly fails as duplicates."""

    count: int = 10_000
    users: int = 500
    events_per_second: float = 50.0
    start_ms: int = 1_700_000_000_000
    seed: int = 11
    attack_every: int = 400
    fail_rate: float = 0.05

    def events(self) -> Iterator[dict]:
        rng = np.random.default_rng(self.seed)
        clock, i = float(self.start_ms), 0
        last: dict[int, int] = {}  # user -> the time of their latest event

        def stamped(user: int, t: int) -> int:
            last[user] = max(t, last.get(user, t - 1) + 1)
            return last[user]

        while i < self.count:
            clock += float(rng.exponential(1000.0 / self.events_per_second))
            user = int(rng.integers(1, self.users + 1))
            if self.attack_every and i % self.attack_every == self.attack_every - 1:
                for k in range(4):  # 3 failures from 3 IPs, then a success from a 4th
                    kind = "FAIL" if k < 3 else "SUCCESS"
                    ip = f"203.0.113.{(i + k) % 250 + 1}"
                    yield _login(user, kind, ip, stamped(user, int(clock) + k * 5_000))
                clock += 20_000
                i += 4
                continue
            kind = "FAIL" if rng.random() < self.fail_rate else "SUCCESS"
            yield _login(user, kind, f"10.{user // 250}.{user % 250}.1", stamped(user, int(clock)))
            i += 1


def _login(user: int, kind: str, ip: str, t: int) -> dict:
    return {"userId": user, "eventType": kind, "ipAddress": ip, "eventTimestamp": t}


def demo_writers(cfg: JobConfig, rate: float, schema: EventSchema = DEFAULT) -> list[PacedWriter]:
    """`fraudrules run`'s embedded generator: `rate` transactions (of the rich schema's kind when the schema
    declares its fields) and a tenth as many logins a second, stamped with the wall clock, into the landing
    folders, or into the topics for a Kafka source (not started)."""
    first_id = int(time.time() * 1000) * 1000  # fresh ids on every start
    kind = RichWorkload if is_rich(schema) else Workload
    transactions = kind(count=10**12, seed=first_id % 2**32, first_id=first_id, burst_every=500)
    logins = LoginWorkload(count=10**12, seed=first_id % 2**31, attack_every=200)
    streams = [
        (cfg.landing, cfg.kafka_transactions_topic, transactions.transactions(), rate, "eventTime"),
        (
            cfg.logins_landing,
            cfg.kafka_logins_topic,
            logins.events(),
            max(1.0, rate / TRANSACTIONS_PER_LOGIN),
            "eventTimestamp",
        ),
    ]
    if cfg.source == "kafka":
        return [
            KafkaRateWriter(str(cfg.kafka_bootstrap), topic, events, r, realtime=True, time_field=field)
            for _folder, topic, events, r, field in streams
        ]
    return [RateWriter(folder, events, r, realtime=True, time_field=field) for folder, _t, events, r, field in streams]
