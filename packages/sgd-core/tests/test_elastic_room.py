"""The ``sgd_elastic_room`` seam: a trainer's own plugin caps how many workers its elastic group
may have (sgd_horovod's elastic executors answer with their host discovery's slots)."""

from __future__ import annotations

import sgd
from sgd.group.actors import ActorGroup
from sgd.plugins import plugin_manager_for


class _Room:
    def __init__(self, answer):
        self.answer = answer
        self.asked = []

    @sgd.hookimpl
    def sgd_elastic_room(self, worker_group, resources_per_worker):
        self.asked.append((worker_group, resources_per_worker))
        return self.answer


def _group(*plugins):
    return ActorGroup(sgd.BackendConfig(), 4, {"CPU": 0.25}, min_workers=1,
                      hook=plugin_manager_for(list(plugins)).hook)


def test_a_supplied_room_caps_the_cluster_room(ray_cluster):
    cluster = _group().room()
    assert cluster >= 4  # 0.25 CPU a worker on the session's cluster
    room = _Room(2)
    assert _group(room).room() == 2
    assert room.asked == [(None, {"CPU": 0.25})]  # before the first placement: no workers yet
    assert _group(_Room(10 * cluster)).room() == cluster  # never more than the cluster can place
    assert _group(_Room(None)).room() == cluster  # None: the cluster decides


def test_an_elastic_group_is_placed_at_the_supplied_room(ray_cluster):
    group = _group(_Room(2))
    group.start()
    try:
        assert group.num_workers == 2 and len(group.worker_group) == 2
    finally:
        group.shutdown()
