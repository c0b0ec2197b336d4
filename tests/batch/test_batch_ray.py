"""`ortllm batch --ray` on a local Ray instance (2 CPUs, 2 engine workers) gives the local run's lines, in input
order."""
from __future__ import annotations

import threading

import pytest

from ortllm.batch import BatchOptions, run_batch
from tests.batch.conftest import assert_same, comparable, mixed_lines, read_output, write_lines

TIMEOUT_S = 150


@pytest.fixture
def local_ray():
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'ortllm[ray]'")
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    except Exception as e:  # noqa: BLE001 - say why Ray cannot start here, and skip
        pytest.skip(f"a local Ray instance did not start: {type(e).__name__}: {e}")
    yield ray
    ray.shutdown()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")      # Ray Data's own, about its own settings
def test_ray_run_equals_local_run(batch_artifact, tmp_path, local_ray):
    src = write_lines(tmp_path / "in.jsonl", mixed_lines(80, seed=3))
    local, on_ray = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    run_batch(batch_artifact, src, local, BatchOptions(progress=False))

    result: dict = {}

    def job():
        try:
            result["summary"] = run_batch(batch_artifact, src, on_ray, BatchOptions(
                progress=False, ray=True, num_workers=2, threads=1, max_num_seqs=8))
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            result["error"] = e

    t = threading.Thread(target=job, daemon=True)
    t.start()
    t.join(TIMEOUT_S)
    assert not t.is_alive(), f"the Ray run did not finish within {TIMEOUT_S} s"
    if "error" in result:
        raise result["error"]

    got = read_output(on_ray)
    assert [x["id"] for x in got] == [f"batch_req_{i}" for i in range(1, 81)]       # input order
    assert_same([comparable(x) for x in got],
                sorted((comparable(x) for x in read_output(local)), key=lambda x: int(x["id"].split("_")[-1])))
    assert result["summary"].ok + result["summary"].errors == 80
