"""The routing policy of `ortllm serve --ray` without Ray: adapter affinity, prefix affinity, load fallback."""
from __future__ import annotations

import json

from ortllm.service.ray_routing import PREFIX_CHARS, AffinityPolicy, ReplicaView, RouteHint, route_hint

ADAPTERS = frozenset({"a0", "a1", "a2", "a3"})


def views(**load):
    return [ReplicaView(rid, in_flight=n, adapters=ADAPTERS, model="base") for rid, n in sorted(load.items())]


def first(policy, vs, hint):
    ranks = policy.rank(vs, hint)
    assert sorted(i for tier in ranks for i in tier) == sorted(v.id for v in vs)     # every replica, once
    return ranks[0][0]


def test_new_adapters_spread_then_stick():
    p, vs = AffinityPolicy(), views(r1=0, r2=0)
    owners = {}
    for name in ("a0", "a1", "a2", "a3"):
        owners[name] = first(p, vs, RouteHint("k", adapter=name))
        p.routed(RouteHint("k", adapter=name), owners[name])
    assert sorted(owners.values()) == ["r1", "r1", "r2", "r2"]
    vs = views(r1=3, r2=0)                      # busier, but within the imbalance: the holder still wins
    assert all(first(p, vs, RouteHint("k", adapter=a)) == r for a, r in owners.items())


def test_overloaded_holder_and_avoided_replicas_fall_back_to_least_loaded():
    p = AffinityPolicy(imbalance=2)
    p.routed(RouteHint("k", adapter="a0"), "r1")
    assert first(p, views(r1=5, r2=0), RouteHint("k", adapter="a0")) == "r2"
    assert first(p, views(r1=0, r2=1), RouteHint("k", adapter="a0", avoid=("r1",))) == "r2"
    full = [ReplicaView("r1", adapters=ADAPTERS, full=True), ReplicaView("r2", in_flight=9, adapters=ADAPTERS)]
    assert first(p, full, RouteHint("k", adapter="a0")) == "r2"


def test_base_model_and_residency_reports():
    p = AffinityPolicy()
    vs = [ReplicaView("r1", in_flight=1, adapters=ADAPTERS, model="base"),
          ReplicaView("r2", in_flight=0, adapters=ADAPTERS, resident=frozenset({"a3"}), model="base")]
    assert first(p, vs, RouteHint("k", adapter="base")) == "r2"           # least loaded
    vs[1].in_flight = 2
    assert first(p, vs, RouteHint("k", adapter="a3")) == "r2"             # it holds a3 resident
    assert first(p, vs, RouteHint("k", adapter="base")) == "r1"


def test_long_shared_prefix_returns_to_its_replica():
    body = json.dumps({"model": "base", "prompt": "x" * PREFIX_CHARS + " question 1"}).encode()
    other = json.dumps({"model": "base", "prompt": "x" * PREFIX_CHARS + " question 2"}).encode()
    h1, h2 = route_hint("1", "/v1/completions", body), route_hint("2", "/v1/completions", other)
    assert h1.prefix is not None and h1.prefix == h2.prefix
    assert route_hint("3", "/v1/completions", b'{"prompt": "short"}').prefix is None
    p = AffinityPolicy()
    p.routed(h1, "r2")
    assert first(p, views(r1=0, r2=1), h2) == "r2"
    p.forget({"r1"})                                                        # r2 restarted: it starts cold
    assert first(p, views(r1=0, r3=1), h2) == "r1"


def test_unreadable_bodies_route_like_any_other():
    for body in (b"", b"{not json", b"[1, 2]", b'{"model": 3}'):
        h = route_hint("k", "/v1/chat/completions", body)
        assert h.adapter is None and h.prefix is None
    chat = json.dumps({"model": "a1", "messages": [{"role": "user", "content": "y" * PREFIX_CHARS}]}).encode()
    assert route_hint("k", "/v1/chat/completions", chat).prefix is not None


def test_targeted_requests_go_to_that_replica_only():
    assert AffinityPolicy().rank(views(r1=0, r2=0), RouteHint("k", target="r2")) == [["r2"]]
