"""Every server-side path a request names is checked before it reaches the file system: a NUL byte is a 400
naming the field (schemathesis found 500s), in POST /v1/adapters `path` and POST /api/pull `model`."""
import pytest


@pytest.mark.parametrize("route,body,param", [
    ("/v1/adapters", {"name": "x", "path": "/tmp/a\x00b"}, "path"),
    ("/api/pull", {"model": "/tmp/a\x00b", "stream": False}, "model"),
])
def test_nul_byte_in_a_path_is_a_400(tiny_live, route, body, param):
    r = tiny_live.post(route, json=body)
    assert r.status_code == 400, r.text
    text = r.text
    assert "NUL byte" in text and param in text, text
