"""Releasing a worker group's reservation: a restart (which counted what fits before the release)
does not wait for Ray's resource view to show it free, since the bundles of a lost host never show
free again (that wait took its whole 2 s after every host loss). No Ray cluster here."""

from sgd.worker_group import reservation


def test_a_release_waits_for_the_resource_view_only_when_asked_to(monkeypatch):
    calls = []
    monkeypatch.setattr(reservation.ray, "available_resources", lambda: calls.append("view") or {"CPU": 2.0})
    monkeypatch.setattr(reservation, "remove_placement_group", lambda pg: calls.append(("remove", pg)))
    monkeypatch.setattr(reservation, "_await_freed", lambda pgs, before: calls.append(("await", tuple(pgs), before)))
    group = reservation._Reservation.__new__(reservation._Reservation)

    group._own_pgs, group._slots, group._spare = ["pg1"], [], []
    group._release(await_freed=False)
    assert calls == [("remove", "pg1")]
    assert group._own_pgs == []

    calls.clear()
    group._own_pgs = ["pg2"]
    group._release()
    assert calls == ["view", ("remove", "pg2"), ("await", ("pg2",), {"CPU": 2.0})]
