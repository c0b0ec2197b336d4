"""`ortllm serve --ray` across several Ray nodes on this machine (ray.cluster_utils.Cluster, every node on 127.0.0.1
with 1 CPU, a small object store and its own ORTLLM_HOME, so a node's store is its own disk): replicas on two
nodes, the worker node's copy of the model fetched from the head by sha256, a Zipf adapter trace equal to one
process, a node killed under load, a replacement node that is sent a tampered file and refuses it, then serves.

The tests run in order on one cluster (each leaves it as the next expects). `make test-ray` runs them; the node
loss's figures go to build/test-ray/node-loss.json (ORTLLM_RAY_NODES_FIGURES)."""
from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'ortllm[ray]'")
pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install 'ortllm[ray]'")

from ortllm.runtime import contract as C                             # noqa: E402
from ortllm.runtime.artifact import read_manifest                   # noqa: E402
from ortllm.runtime.store import ModelRef, Store                    # noqa: E402
from ortllm.service.config import ServiceConfig                     # noqa: E402
from tests.service.conftest import start_live, stop_live            # noqa: E402
from tests.service.ray_fixtures import ADAPTERS, ENGINE_OVERRIDES, free_port, zipf_trace  # noqa: E402

# ~1.5-3 minutes on 2 cores (3 Ray nodes, 4 deployments of a replica): `make test-ray`, not `make test`; the
# fast part (hash verification and refusal, without Ray) is tests/service/test_ray_artifacts.py, in the suite
pytestmark = pytest.mark.skipif(not os.environ.get("ORTLLM_TEST_RAY_NODES"),
                                reason="several Ray nodes: run with `make test-ray` (ORTLLM_TEST_RAY_NODES=1)")

TIMEOUT_S = 60                  # any one HTTP request
NAME = "tiny:ray"               # the model, by its store name on the head
NODE = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "object_store_memory": 80 << 20}
# the head notices a lost node after ~3 s (1 s health checks, 3 misses) instead of Ray's default ~30 s
HEAD = {**NODE, "include_dashboard": False,
        "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3,
                           "health_check_timeout_ms": 1000}}
FIGURES = Path(os.environ.get("ORTLLM_RAY_NODES_FIGURES", "build/test-ray/node-loss.json"))


class Nodes:
    """The cluster, the service on it, and each node's ORTLLM_HOME."""

    def __init__(self, cluster, url: str, homes: dict):
        self.cluster, self.url, self.homes = cluster, url, homes
        self.workers: dict[str, object] = {}            # label -> ray node

    def add_worker(self, label: str, home: Path):
        self.homes[label] = home
        self.workers[label] = self.cluster.add_node(**NODE, env_vars={"ORTLLM_HOME": str(home)})
        return self.workers[label]

    def node_id(self, label: str) -> str:
        return self.workers[label].node_id

    def health(self) -> dict:
        return requests.get(self.url + "/health", timeout=TIMEOUT_S).json()

    def wait_health(self, ok, timeout: float, what: str) -> dict:
        end = time.monotonic() + timeout
        h = {}
        while time.monotonic() < end:
            h = self.health()
            if ok(h):
                return h
            time.sleep(0.5)
        raise AssertionError(f"{what} not seen in {timeout:.0f} s; /health: {json.dumps(h)[:2000]}")


def complete(url: str, adapter: str, prompt: str, **body) -> requests.Response:
    return requests.post(url + "/v1/completions", json={"model": adapter, "prompt": prompt, "max_tokens": 8,
                                                        "temperature": 0, **body}, timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def nodes(tiny_lora_artifact, tmp_path_factory):
    from ray.cluster_utils import Cluster

    from ortllm.service import ray_serve
    root = tmp_path_factory.mktemp("ray-nodes")
    head_home = root / "head-home"
    Store(head_home).put(tiny_lora_artifact, ModelRef.parse(NAME), source=str(tiny_lora_artifact))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ORTLLM_HOME", str(head_home))          # the driver (`ortllm serve` on the head) and the head node
        # Ray's own switch for a local-only cluster: its addresses stay 127.0.0.1 (else ray.init turns the head's
        # 127.0.0.1 into this host's outward address, which the nodes do not listen on)
        mp.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        mp.setattr(ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False)
        cluster = None
        try:
            cluster = Cluster(initialize_head=True,
                              head_node_args={**HEAD, "env_vars": {"ORTLLM_HOME": str(head_home)}})
            n = Nodes(cluster, "", {"head": head_home})
            n.add_worker("w1", root / "w1-home")
            ray.init(address=cluster.address, log_to_driver=False)
            config = ServiceConfig(artifact=Store(head_home).path(NAME), port=free_port(), drain_timeout_s=5,
                                   engine_overrides=ENGINE_OVERRIDES)
            n.url, _ = ray_serve.start(config, ray_serve.RayOptions(replicas=2, threads_per_replica=1,
                                                                    proxy_location="HeadOnly"))
            yield n
        finally:
            try:
                if ray.is_initialized():
                    ray_serve.stop(False)
            finally:
                ray.shutdown()
                if cluster is not None:
                    cluster.shutdown()


def test_replicas_on_two_nodes_the_worker_fetched_the_model_by_hash(nodes, tiny_lora_artifact):
    h = nodes.health()
    assert h["status"] == "ok", h
    by_node = {r["node"]: r for r in h["replicas"]}
    head_id = ray.get_runtime_context().get_node_id()
    assert set(by_node) == {head_id, nodes.node_id("w1")}, h
    assert by_node[head_id]["artifact_from"] == "store"            # the head's own store
    assert by_node[nodes.node_id("w1")]["artifact_from"] == "fetched"
    # the worker's store (empty before the deployment) now holds every file, byte for byte, under the same name
    w1 = Store(nodes.homes["w1"])
    assert w1.names() == [NAME]
    view = w1.path(NAME)
    assert not view.is_relative_to(nodes.homes["head"])
    for name in [*read_manifest(tiny_lora_artifact).files, C.MANIFEST]:
        assert (view / name).read_bytes() == (tiny_lora_artifact / name).read_bytes(), name


def test_zipf_trace_across_nodes_equals_one_process(nodes, tiny_lora_artifact):
    trace = [(i, a) for i, a in enumerate(zipf_trace(24, seed=7))]

    def run(url):
        def one(item):
            i, adapter = item
            r = complete(url, adapter, f"request {i} says")
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"], r.headers.get("X-Ortllm-Replica")
        with ThreadPoolExecutor(4) as ex:
            return list(ex.map(one, trace))

    on_ray = run(nodes.url)
    live = start_live(tiny_lora_artifact, **ENGINE_OVERRIDES)
    try:
        alone = run(live.url)
    finally:
        stop_live(live)
    assert [t for t, _ in on_ray] == [t for t, _ in alone]
    replicas = {r["replica"]: r["node"] for r in nodes.health()["replicas"]}
    assert len({replicas[rid] for _, rid in on_ray}) == 2           # both nodes answered part of the trace


def test_a_lost_node_costs_its_requests_only(nodes):
    """SIGKILL every process of the worker node mid-trace, once a stream on it has sent tokens: each request ends
    (none hangs), the ones that fail were on the lost node and say so with a retryable error, the rest complete;
    the router sends nothing more to the lost replica and /health says degraded. The figures go to FIGURES."""
    import threading

    h = nodes.health()
    victim_node = nodes.node_id("w1")
    victim, victim_pid = next((r["replica"], r["pid"]) for r in h["replicas"] if r["node"] == victim_node)
    survivor = next(r["replica"] for r in h["replicas"] if r["node"] != victim_node)
    trace = zipf_trace(32, seed=11)
    streaming_on_victim = threading.Event()
    killed = threading.Event()

    def one(i):
        stream = i % 2 == 0
        t0 = time.monotonic()
        r = requests.post(nodes.url + "/v1/completions", json={
            "model": trace[i], "prompt": f"load {i}", "max_tokens": 160, "temperature": 0, "ignore_eos": True,
            "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})},
            timeout=TIMEOUT_S, stream=stream)
        replica = r.headers.get("X-Ortllm-Replica")
        started_before_kill = not killed.is_set()
        if stream:
            lines = []
            for ln in r.iter_lines():
                if ln:
                    lines.append(ln.decode())
                    if replica == victim and len(lines) >= 3:
                        streaming_on_victim.set()
            text = "\n".join(lines)
        else:
            text = r.text
        return {"i": i, "stream": stream, "status": r.status_code, "replica": replica, "text": text,
                "retried": r.headers.get("X-Ortllm-Retried"),
                "streaming_at_kill": stream and replica == victim and started_before_kill and killed.is_set(),
                "seconds": time.monotonic() - t0}

    t0 = time.monotonic()
    with ThreadPoolExecutor(6) as ex:
        futs = [ex.submit(one, i) for i in range(len(trace))]
        assert streaming_on_victim.wait(30), "no stream reached the worker node's replica"
        # the node goes at once, as on a power loss: its replica's process first (a worker whose raylet is killed
        # lives on for up to a second, long enough to finish a tiny-model stream), then the node's Ray processes
        os.kill(victim_pid, signal.SIGKILL)
        nodes.cluster.remove_node(nodes.workers.pop("w1"), allow_graceful=False)
        killed.set()
        killed_at = time.monotonic() - t0
        seen = nodes.wait_health(lambda h: h["status"] == "degraded", 30, "degraded")
        degraded_after = time.monotonic() - t0 - killed_at
        results = [f.result(timeout=TIMEOUT_S * 2) for f in futs]   # none hangs
    elapsed = time.monotonic() - t0

    completed, failed = [], []
    for r in results:
        whole = r["status"] == 200 and (not r["stream"] or (r["text"].endswith("data: [DONE]")
                                                            and '"error"' not in r["text"]))
        (completed if whole else failed).append(r)
    for r in failed:
        if r["status"] == 200:          # a stream cut after its first token: an error chunk, then [DONE]
            assert r["replica"] == victim and '"code": "replica_failed"' in r["text"] \
                and r["text"].endswith("data: [DONE]"), r
            r["error"] = "stream cut: error chunk code replica_failed, then [DONE]"
        else:                           # no byte sent yet, and the one retry (on the survivor) did not take it
            assert r["status"] == 503 and json.loads(r["text"])["error"]["code"] == "replica_failed", r
            r["error"] = "503 replica_failed (Retry-After: 1)"
    assert all(r["replica"] in (victim, survivor) for r in completed), results
    cut = [r for r in results if r["streaming_at_kill"]]
    figures = {"requests": len(results), "completed": len(completed), "failed": len(failed),
               "failures": sorted(r["error"] for r in failed),
               "streams_sending_from_the_lost_node_at_the_kill": len(cut),
               "of_those_failed": sum(r in failed for r in cut),
               "completed_on_the_lost_node_before_the_kill": sum(r["replica"] == victim for r in completed),
               "completed_on_the_survivor": sum(r["replica"] == survivor for r in completed),
               "of_those_retried_after_the_lost_node_failed_them": sum(bool(r["retried"]) for r in completed),
               "killed_at_s": round(killed_at, 2), "degraded_seen_after_s": round(degraded_after, 2),
               "trace_s": round(elapsed, 2), "slowest_request_s": round(max(r["seconds"] for r in results), 2),
               "health_after": seen["status"], "replica_states_after": seen["replica_states"]}
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"\nnode loss: {json.dumps(figures)}")
    assert cut, figures
    for r in completed:                 # whole means whole: all 160 tokens, never a silently shorter answer
        usage = json.loads(r["text"].splitlines()[-2].removeprefix("data: ") if r["stream"] else r["text"])["usage"]
        assert usage["completion_tokens"] == 160, r
    assert len(completed) + len(failed) == len(trace) and len(completed) >= len(trace) // 2, figures

    after = [complete(nodes.url, a, f"after {i}") for i, a in enumerate(ADAPTERS * 2)]
    assert all(r.status_code == 200 and r.headers["X-Ortllm-Replica"] == survivor for r in after), \
        [(r.status_code, r.text[:200]) for r in after]
    h = nodes.health()
    assert h["status"] == "degraded" and [r["replica"] for r in h["replicas"]] == [survivor], h


def test_a_replacement_node_refuses_a_tampered_file_then_serves(nodes, tmp_path):
    """The replacement node's store is empty: its replica fetches the model from the head. While the head's copy
    of the weights is tampered with, the node refuses it (nothing written, no route to it, /health says why);
    once the file is back, Serve's next start of the replica fetches, verifies and serves."""
    head_view = Store(nodes.homes["head"]).path(NAME)
    man = read_manifest(head_view)
    weights = max(man.files, key=lambda n: man.files[n]["size"])
    kept = tmp_path / "weights.kept"
    os.link(head_view / weights, kept)             # the head's replica keeps its (memory-mapped) file: a new inode
    data = bytearray(kept.read_bytes())
    data[len(data) // 2] ^= 0x01
    tampered = tmp_path / "weights.tampered"
    tampered.write_bytes(bytes(data))
    os.replace(tampered, head_view / weights)
    try:
        w2_home = nodes.homes["head"].parent / "w2-home"
        nodes.add_worker("w2", w2_home)
        h = nodes.wait_health(lambda h: "refused" in h.get("message", ""), 90, "the replacement's refusal")
        assert h["status"] == "degraded" and len(h["replicas"]) == 1, h
        assert weights in h["message"] and "does not match its sha256" in h["message"], h["message"]
        assert not Store(w2_home).blob(man.files[weights]["sha256"]).exists()
        served = {complete(nodes.url, a, "while refused").headers["X-Ortllm-Replica"] for a in ADAPTERS}
        assert served == {h["replicas"][0]["replica"]}
    finally:
        os.replace(kept, head_view / weights)

    h = nodes.wait_health(lambda h: h["status"] == "ok" and len(h["replicas"]) == 2, 120, "two replicas again")
    new = next(r for r in h["replicas"] if r["node"] == nodes.node_id("w2"))
    assert new["artifact_from"] == "fetched" and Store(w2_home).names() == [NAME]
    # the survivor owns every adapter now: the router gives the new replica what the survivor has no room for
    # (more than 8 requests busier, or full: 4 running + 4 queued)
    with ThreadPoolExecutor(14) as ex:
        rs = list(ex.map(lambda i: complete(nodes.url, ADAPTERS[i % 4], f"rejoined {i}", max_tokens=64,
                                            ignore_eos=True), range(14)))
    assert all(r.status_code == 200 for r in rs), [(r.status_code, r.text[:200]) for r in rs]
    served = {r.headers["X-Ortllm-Replica"] for r in rs}
    assert new["replica"] in served, (served, h)
