"""The slot plan, the interface choice, the execute_single guard and Horovod's rendezvous
server, without Ray workers."""

import json
import subprocess
import sys
import urllib.request

import pytest

from sgd_horovod.rendezvous import RendezvousService, Slot, choose_interfaces, slot_plan


def _fields(slot):
    return (slot.hostname, slot.rank, slot.local_rank, slot.cross_rank, slot.size, slot.local_size, slot.cross_size)


def test_slot_plan_groups_local_ranks_by_node():
    plan = slot_plan(["a", "a", "b", "c", "c", "c"])
    assert [_fields(s) for s in plan] == [
        ("a", 0, 0, 0, 6, 2, 3),
        ("a", 1, 1, 0, 6, 2, 2),
        ("b", 2, 0, 1, 6, 1, 3),
        ("c", 3, 0, 2, 6, 3, 3),
        ("c", 4, 1, 1, 6, 3, 2),
        ("c", 5, 2, 0, 6, 3, 1),
    ]
    assert plan[4].env() == {
        "HOROVOD_HOSTNAME": "c", "HOROVOD_RANK": "4", "HOROVOD_SIZE": "6", "HOROVOD_LOCAL_RANK": "1",
        "HOROVOD_LOCAL_SIZE": "3", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2",
    }
    with pytest.raises(ValueError, match="at least one worker"):
        slot_plan([])


@pytest.mark.usefixtures("requires_horovod")
@pytest.mark.parametrize("layout", [[1], [2], [2, 2], [3, 1, 2], [1, 4], [2, 1, 1, 3]])
def test_slot_plan_matches_horovods_own(layout):
    from horovod.runner.common.util import hosts

    node_ids = [f"node{i}" for i, n in enumerate(layout) for _ in range(n)]
    ours = slot_plan(node_ids)
    theirs = hosts.get_host_assignments(hosts.parse_hosts(",".join(f"node{i}:{n}" for i, n in enumerate(layout))),
                                        len(node_ids))
    assert [_fields(s) for s in ours] == [
        (t.hostname, t.rank, t.local_rank, t.cross_rank, t.size, t.local_size, t.cross_size) for t in theirs
    ]


def _info(ip, **interfaces):
    return {"node_ip": ip, "interfaces": interfaces}


def test_interface_choice():
    one_node = [_info("10.0.0.5", lo=["127.0.0.1"], eth0=["10.0.0.5"])] * 2
    assert choose_interfaces(one_node, None, single_node=True) == ["lo", "lo"]
    two_nodes = [_info("10.0.0.5", lo=["127.0.0.1"], eth0=["10.0.0.5"]),
                 _info("10.0.1.7", lo=["127.0.0.1"], ens5=["10.0.1.7"], docker0=["172.17.0.1"])]
    assert choose_interfaces(two_nodes, None, single_node=False) == ["eth0", "ens5"]
    assert choose_interfaces(two_nodes, ("ib0", "eth0", "ens5"), single_node=False) == ["eth0", "ens5"]
    # No interface holds the address: leave it to Gloo (with a warning).
    assert choose_interfaces([_info("10.9.9.9", lo=["127.0.0.1"])], None, single_node=False) == [None]
    with pytest.raises(ValueError, match=r"nics=\['eth0'\]\): worker rank 1 \(node IP 10.0.1.7\).*'ens5'"):
        choose_interfaces(two_nodes, ("eth0",), single_node=False)


@pytest.mark.usefixtures("requires_horovod")
def test_rendezvous_server_stores_resets_and_stops():
    service = RendezvousService()
    port = service.start(slot_plan(["a", "a"]))
    base = f"http://127.0.0.1:{port}"
    try:
        put = urllib.request.Request(f"{base}/global/rank0", data=b"addr-of-rank-0", method="PUT")
        urllib.request.urlopen(put, timeout=5).close()
        with urllib.request.urlopen(f"{base}/global/rank0", timeout=5) as resp:
            assert resp.read() == b"addr-of-rank-0"
        service.reset(slot_plan(["a", "b"]))  # a new plan forgets every key
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{base}/global/rank0", timeout=5)
        assert info.value.code == 404
    finally:
        service.stop()
    service.stop()  # twice is fine
    assert not service.running
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{base}/global/rank0", timeout=2)
    with pytest.raises(RuntimeError, match="not started"):
        service.reset([Slot("a", 0, 0, 0, 1, 1, 1)])


_GUARD_CHECK = """
import horovod.torch as hvd
import torch
from horovod.torch import mpi_ops

from sgd_horovod.single import CollectiveInExecuteSingleError, no_collectives

hvd.init()  # no rendezvous variables: a 1-process job, so every collective would complete
lib, basics_lib = mpi_ops.mpi_lib, mpi_ops._basics.MPI_LIB_CTYPES
refused = []
with no_collectives(world_size=3):  # pretend two more workers exist, as in execute_single
    calls = {
        "allreduce": lambda: hvd.allreduce(torch.ones(2)),
        "allgather": lambda: hvd.allgather(torch.ones(2)),
        "broadcast": lambda: hvd.broadcast(torch.ones(2), 0),
        "alltoall": lambda: hvd.alltoall(torch.ones(3)),
        "reducescatter": lambda: hvd.reducescatter(torch.ones(3)),
        "grouped_allreduce": lambda: hvd.grouped_allreduce([torch.ones(2)]),
        "join": hvd.join,
        "barrier": hvd.barrier,
    }
    for name, call in calls.items():
        try:
            call()
        except CollectiveInExecuteSingleError as exc:
            assert "the other 2 worker(s)" in str(exc), exc
            refused.append(name)
    assert hvd.rank() == 0 and hvd.size() == 1  # the rest of the library works
    hvd.init()  # already initialised: allowed, returns at once
assert mpi_ops.mpi_lib is lib and mpi_ops._basics.MPI_LIB_CTYPES is basics_lib
with no_collectives(world_size=1):  # one worker: every collective completes alone
    assert mpi_ops.mpi_lib is lib
assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == 1.0
hvd.shutdown()
with no_collectives(world_size=2):
    try:
        hvd.init()
    except CollectiveInExecuteSingleError as exc:
        assert "'init'" in str(exc)
        refused.append("init")
print(",".join(refused))
"""


@pytest.mark.usefixtures("requires_horovod")
def test_guard_refuses_every_collective_and_restores():
    # In a separate process: hvd.init() there must not touch this test process.
    out = subprocess.run([sys.executable, "-c", _GUARD_CHECK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().split(",") == [
        "allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "grouped_allreduce", "join", "barrier",
        "init",
    ]


def test_worker_without_horovod_or_gloo_is_named():
    from sgd_horovod.config import check_probes

    ok = {"node_ip": "10.0.0.5", "interfaces": {}, "horovod": {"version": "0.28.1", "gloo": True}}
    check_probes([ok, ok])
    missing = {"node_ip": "10.0.0.6", "interfaces": {},
               "horovod_error": "ModuleNotFoundError: No module named 'horovod'"}
    with pytest.raises(ImportError, match=r"worker rank 1 \(node IP 10.0.0.6\).*No module.*build_horovod\.py"):
        check_probes([ok, missing])
    no_gloo = {**ok, "horovod": {"version": "0.28.1", "gloo": False}}
    with pytest.raises(RuntimeError, match="worker rank 0 was built without Gloo"):
        check_probes([no_gloo, ok])


def test_settings_json_keeps_no_secret(tmp_path):
    import dataclasses

    from sgd_horovod import HorovodConfig

    text = json.dumps(dataclasses.asdict(HorovodConfig(nics={"eth0"}, key="hunter2")))
    assert "hunter2" not in text and json.loads(text)["nics"] == ["eth0"]
