"""Which engine replica answers a request: the routing policy of `ortllm serve --ray`, without Ray.

    request body --route_hint()--> RouteHint(adapter, prefix)           (a peek at `model` and the prompt)
    replicas' reported stats + in-flight counts --> ReplicaView list
    AffinityPolicy.rank(views, hint) -> [[preferred...], [least loaded...]]   (Ray Serve tries rank by rank)

Preference, first that applies and is not overloaded (load > least load + imbalance):
  1. the replica that served the same long prompt prefix last (its prefix cache holds those first blocks);
  2. a replica that holds the adapter resident, or the one this router gave the adapter to before (the
     residency report lags by a stats period; the router's own memory covers that gap);
  3. a new adapter goes to the replica holding the fewest adapters (ties: the least loaded), and stays there;
  4. otherwise the least loaded replica.
Replicas that reported a full queue, and those in `avoid` (already answered 429 or died on this request), go
last. The hint is a peek only: the replica parses and validates the request as the single-process server
does, so a body the peek cannot read routes like any other and gets that server's 400.
"""
from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass, field

PREFIX_CHARS = 512          # a prompt at least this long routes by its first PREFIX_CHARS characters (~8 blocks)
IMBALANCE = 8               # in-flight requests a preferred replica may carry over the least loaded one
PREFIX_MEMORY = 4096        # prompt prefixes remembered (LRU)


@dataclass(frozen=True)
class RouteHint:
    key: str                        # this request's id at the ingress (which replica it went to is kept by it)
    adapter: str | None = None      # the `model` the client sent (an adapter, or the base model's name)
    prefix: str | None = None       # hash of the first PREFIX_CHARS characters of the prompt, with `model`
    target: str | None = None       # this replica only (the ingress asking each replica for /metrics, /health)
    avoid: tuple[str, ...] = ()     # replicas tried already for this request


@dataclass
class ReplicaView:
    """One replica as the router sees it: its last report (`record_routing_stats`) and the router's count."""
    id: str
    in_flight: int = 0                              # requests this router has sent it that have not finished
    queued: int = 0                                 # reported: engine running + waiting
    full: bool = False                              # reported: its engine queue is full (it would answer 429)
    adapters: frozenset = frozenset()               # reported: adapters its artifact has
    resident: frozenset = frozenset()               # reported: adapters in its session's slots now
    model: str | None = None                        # reported: the served model name

    @property
    def load(self) -> int:
        return max(self.in_flight, self.queued)


def route_hint(key: str, path: str, body: bytes, avoid: tuple[str, ...] = ()) -> RouteHint:
    """The routing hint of one HTTP request (OpenAI and Ollama bodies); fields it cannot read stay None."""
    try:
        obj = json.loads(body) if body else None
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        return RouteHint(key, avoid=avoid)
    model = obj.get("model") if isinstance(obj.get("model"), str) else None
    text = _prompt_text(obj)
    prefix = None
    if text is not None and len(text) >= PREFIX_CHARS:
        prefix = hashlib.sha1(f"{model}\0{path}\0{text[:PREFIX_CHARS]}".encode()).hexdigest()
    return RouteHint(key, adapter=model, prefix=prefix, avoid=avoid)


def _prompt_text(obj: dict) -> str | None:
    prompt = obj.get("prompt")
    if isinstance(prompt, list) and prompt:
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):        # token ids
        return " ".join(map(str, prompt))
    messages = obj.get("messages")
    if isinstance(messages, list):
        return "\n".join(str(m.get("role", "")) + ":" + (m["content"] if isinstance(m.get("content"), str)
                         else json.dumps(m.get("content"))) for m in messages if isinstance(m, dict))
    return None


@dataclass
class AffinityPolicy:
    imbalance: int = IMBALANCE
    owner: dict = field(default_factory=dict)                 # adapter -> replica it was given to
    prefixes: OrderedDict = field(default_factory=OrderedDict)  # prefix hash -> replica that served it

    def rank(self, views: list[ReplicaView], hint: RouteHint | None) -> list[list[str]]:
        """Replica ids in tiers, most preferred first; every replica appears once (nothing is refused here:
        a full replica answers 429 itself, and the ingress then tries the next)."""
        if not views:
            return []
        if hint is not None and hint.target is not None:
            return [[v.id for v in views if v.id == hint.target]]
        avoid = set(hint.avoid) if hint else set()
        usable = [v for v in views if v.id not in avoid and not v.full] or \
                 [v for v in views if v.id not in avoid] or list(views)
        by_load = sorted(usable, key=lambda v: (v.load, v.id))
        floor = by_load[0].load
        ok = [v for v in by_load if v.load <= floor + self.imbalance]
        first = self._preferred(ok, hint) if hint is not None else None
        order = ([first] if first else []) + [v for v in by_load if v is not first]
        rest = [v for v in views if v not in order]
        return [[v.id] for v in order] + ([[v.id for v in rest]] if rest else [])

    def _preferred(self, ok: list[ReplicaView], hint: RouteHint) -> ReplicaView | None:
        by_id = {v.id: v for v in ok}
        if hint.prefix is not None and self.prefixes.get(hint.prefix) in by_id:
            return by_id[self.prefixes[hint.prefix]]
        adapter = hint.adapter
        if adapter is None or not any(adapter in v.adapters for v in ok) or any(adapter == v.model for v in ok):
            return None                              # the base model (or unknown: the replica says 404)
        holders = [v for v in ok if adapter in v.resident]
        if self.owner.get(adapter) in by_id and by_id[self.owner[adapter]] not in holders:
            holders.insert(0, by_id[self.owner[adapter]])
        if holders:
            return min(holders, key=lambda v: (v.id != self.owner.get(adapter), v.load))
        known = set().union(*(v.adapters for v in ok))
        owned = {v.id: sum(1 for a, r in self.owner.items() if r == v.id and a != adapter and a in known)
                 for v in ok}
        return min(ok, key=lambda v: (owned[v.id], v.load, v.id))

    def routed(self, hint: RouteHint | None, replica_id: str) -> None:
        """Remember where a request went (its adapter's owner, its prompt prefix)."""
        if hint is None or hint.target is not None:
            return
        if hint.adapter is not None:
            self.owner[hint.adapter] = replica_id
        if hint.prefix is not None:
            self.prefixes[hint.prefix] = replica_id
            self.prefixes.move_to_end(hint.prefix)
            while len(self.prefixes) > PREFIX_MEMORY:
                self.prefixes.popitem(last=False)

    def forget(self, alive: set[str]) -> None:
        """Drop what points at replicas that are gone (a restarted replica starts cold)."""
        for d in (self.owner, self.prefixes):
            for k in [k for k, r in d.items() if r not in alive]:
                del d[k]
