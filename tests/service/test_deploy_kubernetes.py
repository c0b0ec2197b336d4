"""docs/deploy/kubernetes.yaml agrees with the image it deploys (the Containerfile): the container port is the
image's EXPOSE, the readiness probe asks the HEALTHCHECK's path on it, the store's claim is mounted at the image's
VOLUME (ORTLLM_HOME), the pod runs as the image's user, and every ORTLLM_* variable it sets is a serve option."""
from __future__ import annotations

from pathlib import Path

import yaml

from ortllm.cli.options import env_name
from ortllm.cli.serve import OPTIONS
from tests.service.containerfile import health_path, image, user_ids

MANIFEST = Path(__file__).resolve().parents[2] / "docs" / "deploy" / "kubernetes.yaml"


def documents() -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    kinds = [d["kind"] for d in docs]
    assert len(set(kinds)) == len(kinds), f"one of each kind: {kinds}"
    return {d["kind"]: d for d in docs}


def server_container(deployment: dict) -> dict:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, containers
    return containers[0]


def port_number(container: dict, port) -> int:
    """A probe's or Service's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    named = {p["name"]: p["containerPort"] for p in container["ports"] if "name" in p}
    assert port in named, f"port {port!r} names none of the container's ports {named}"
    return named[port]


def test_ports_and_probes_match_the_image():
    docs = documents()
    container = server_container(docs["Deployment"])
    exposed = int(image().last("EXPOSE").args.split("/")[0])
    assert [p["containerPort"] for p in container["ports"]] == [exposed]
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == health_path(image()), probe
        assert port_number(container, get["port"]) == exposed, probe
    service_port = docs["Service"]["spec"]["ports"][0]
    assert port_number(container, service_port["targetPort"]) == exposed
    assert docs["Service"]["spec"]["selector"] == docs["Deployment"]["spec"]["template"]["metadata"]["labels"]


def test_the_store_claim_is_mounted_at_ortllm_home():
    docs = documents()
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    container = server_container(docs["Deployment"])
    volume = image().last("VOLUME").exec_form()[0]
    assert volume == image().env()["ORTLLM_HOME"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert volume in mounts, mounts
    by_name = {v["name"]: v for v in pod["volumes"]}
    claim = by_name[mounts[volume]]["persistentVolumeClaim"]["claimName"]
    assert claim == docs["PersistentVolumeClaim"]["metadata"]["name"]
    assert container.get("env") is None or "ORTLLM_HOME" not in {e["name"] for e in container["env"]}


def test_pod_runs_as_the_image_user_and_can_write_the_claim():
    security = documents()["Deployment"]["spec"]["template"]["spec"]["securityContext"]
    uid, gid = user_ids(image())
    assert security["runAsNonRoot"] is True
    assert (security["runAsUser"], security["runAsGroup"]) == (uid, gid)
    assert security["fsGroup"] == gid        # the claim's files get the image user's group


def test_env_names_are_serve_options():
    known = {env_name(o) for o in OPTIONS if o.key != "artifact"} | {"ORTLLM_ARTIFACT"}
    names = [e["name"] for e in server_container(documents()["Deployment"]).get("env", [])]
    assert names, "the example sets the API key"
    assert "ORTLLM_API_KEY" in names            # it binds 0.0.0.0: the API needs a key
    unknown = [n for n in names if n.startswith("ORTLLM_") and n not in known]
    assert not unknown, f"not serve options: {unknown}"
