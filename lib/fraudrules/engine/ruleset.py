"""The rules a state shard holds: Flink's broadcast state, fed by the rule-change stream.

Every change committed to `rule_history` reaches every shard of the stateful stage as a row in the same
micro-batch stream as the events, so a change applies to the events processed after it, identically on
a replay after a crash (the change is in the micro-batch's recorded offsets). Applying is order-free:
per rule the highest version wins, and the state epoch (CLEAR_STATE_ALL) only rises.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from fraudrules.event_schema import DEFAULT, EventSchema
from fraudrules.rules.model import EVALUATED, Rule, RuleError, parse_rule, stored_rule


@dataclass
class InForce:
    version: int
    state: str
    sig: int
    rule_json: str


@dataclass
class RuleSet:
    """`schema`: the event schema the shard keys with (not kept in the state): a rule naming a field it does not
    declare is not evaluated (the job refuses to start with such an ACTIVE rule, and submissions are checked
    against the job's schema, so none should arrive)."""

    rules: dict[int, InForce] = field(default_factory=dict)
    epoch: int = 0
    schema: EventSchema = field(default=DEFAULT, repr=False, compare=False)
    _parsed: dict[tuple[int, int], Rule | None] = field(default_factory=dict, repr=False, compare=False)

    def apply(self, changes: Iterable[dict]) -> bool:
        """Apply rule changes (`codec.decode_change` dicts); True when anything changed."""
        changed = False
        for r in changes:
            self.epoch, before = max(self.epoch, int(r["epoch"] or 0)), self.epoch
            changed |= self.epoch != before
            if r["ruleState"] == "CONTROL":
                continue
            rid, version = int(r["ruleId"]), int(r["version"])
            if rid not in self.rules or self.rules[rid].version < version:
                self.rules[rid] = InForce(version, str(r["ruleState"]), int(r["sig"]), str(r["ruleJson"]))
                changed = True
        return changed

    def rule(self, rule_id: int) -> Rule:
        """The rule in force, resolved against the schema (checked when evaluated, see `usable`)."""
        f = self.rules[rule_id]
        usable = self.usable(rule_id)
        return (
            usable if usable is not None else stored_rule(json.loads(f.rule_json), self.schema).with_version(f.version)
        )

    def usable(self, rule_id: int) -> Rule | None:
        """The rule in force if every field it names is declared in the schema, else None."""
        f = self.rules[rule_id]
        key = (rule_id, f.version)
        if key not in self._parsed:
            try:
                self._parsed[key] = parse_rule(json.loads(f.rule_json), self.schema).with_version(f.version)
            except RuleError:
                self._parsed[key] = None
        return self._parsed[key]

    def active(self, rule_type: str) -> list[Rule]:
        """The rules of one type (WINDOW or LOGIN_ANOMALY) that are evaluated, by ruleId: ACTIVE ones and
        SHADOW ones (keyed, evaluated and retained alike; only where their hits go differs)."""
        out = []
        for rid in sorted(self.rules):
            if self.rules[rid].state in EVALUATED:
                rule = self.usable(rid)
                if rule is not None and rule.rule_type == rule_type:
                    out.append(rule)
        return out

    def windows(self, rule_type: str = "WINDOW") -> dict[int, tuple[int, int]]:
        """ruleId -> (signature, window ms) of the evaluated (ACTIVE and SHADOW) rules of a type."""
        return {r.rule_id: (self.rules[r.rule_id].sig, r.window_ms) for r in self.active(rule_type)}

    def sig(self, rule_id: int) -> int:
        return self.rules[rule_id].sig

    def to_json(self) -> str:
        rules = {str(k): [v.version, v.state, v.sig, v.rule_json] for k, v in self.rules.items()}
        return json.dumps({"epoch": self.epoch, "rules": rules}, separators=(",", ":"))

    @staticmethod
    def from_json(text: str | None, schema: EventSchema = DEFAULT) -> RuleSet:
        if not text:
            return RuleSet(schema=schema)
        raw = json.loads(text)
        return RuleSet({int(k): InForce(*v) for k, v in raw["rules"].items()}, int(raw["epoch"]), schema)
