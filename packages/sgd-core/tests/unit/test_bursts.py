"""A burst: workers that reported faster than the driver took rounds. The collector hands every
complete round of plain reports over in one poll answer (``Poll.more``), and the controller
delivers them one by one, in order, without polling the group again, flushing
``results.jsonl`` with the burst's last round. No Ray cluster here."""

import json

from sgd._common.protocol import CHECKPOINT_KEY, LINE_KEY, REPORT, encode_line, plain_report
from sgd.group.rounds import RoundCollector
from sgd.group.status import Poll, PollKind, report_round
from sgd.run.controller import RunState
from sgd_testing import FakeGroup, fake_trainer_run, rounds_of


def _plain(step, rank):
    metrics = {"step": step, "rank": rank, "_training_iteration": step}
    return plain_report(metrics, encode_line(metrics))


def _with_checkpoint(step, rank):
    metrics = {"step": step, "rank": rank, "_training_iteration": step}
    metrics[LINE_KEY] = encode_line(metrics)
    metrics[CHECKPOINT_KEY] = "a folder" if rank == 0 else None
    return (REPORT, metrics)


def test_the_collector_hands_over_every_complete_round_of_plain_reports_in_one_answer():
    collector = RoundCollector([None, None])
    for rank in range(2):
        items = [_plain(step, rank) for step in (1, 2, 3)] + [_with_checkpoint(4, rank), _plain(5, rank)]
        collector._pending[rank].extend(items)
        collector._done[rank] = True

    first = collector.poll(0)
    assert first.kind is PollKind.ROUND
    assert [r.iteration for r in (first.round, *first.more)] == [1, 2, 3]
    assert [row["rank"] for row in first.more[1].results] == [0, 1]
    # A round whose item keeps the two-part form (a reported checkpoint) is never in a burst:
    # it comes first in an answer, and the rounds after it follow as that answer's burst.
    second = collector.poll(0)
    assert second.round.iteration == 4 and second.round.checkpoints == ["a folder", None]
    assert [r.iteration for r in second.more] == [5]
    assert collector.poll(0).kind is PollKind.FINISHED


def test_a_round_only_some_workers_sent_ends_the_burst():
    collector = RoundCollector([None, None])
    collector._pending[0].extend([_plain(1, 0), _plain(2, 0), _plain(3, 0)])
    collector._pending[1].extend([_plain(1, 1), _plain(2, 1)])
    answer = collector.poll(0)
    assert answer.round.iteration == 1 and [r.iteration for r in answer.more] == [2]
    assert list(collector._pending[0]) == [_plain(3, 0)] and not collector._pending[1]


class _BurstyGroup(FakeGroup):
    """Answers its first poll with three rounds at once, then goes on with its script."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.bursts = [[{"loss": 3.0}, {"loss": 2.0}, {"loss": 1.0}]]

    def poll(self, timeout_s):
        if not self.bursts:
            return super().poll(timeout_s)
        self.calls.append(("poll", {}))
        rounds = []
        for metrics in self.bursts.pop(0):
            self._iteration += 1
            rounds.append(report_round([dict(metrics, _training_iteration=self._iteration)] * self.num_workers))
        return Poll.of_round(rounds[0], tuple(rounds[1:]))


class _Seen:
    def __init__(self):
        self.rounds = []

    def start_training(self, **kwargs):
        pass

    def handle_result(self, results):
        self.rounds.append([r["loss"] for r in results])

    def finish_training(self, error=False):
        pass


def _lines(run_dir):
    return [json.loads(line)[0]["loss"] for line in (run_dir / "results.jsonl").read_text().splitlines()]


def test_the_controller_delivers_a_burst_round_by_round_without_polling_again(tmp_path):
    group = _BurstyGroup(2).report({"loss": 0.5}).finish()
    seen = _Seen()
    run = fake_trainer_run(group, tmp_path, callbacks=[seen])
    assert [r[0]["loss"] for r in rounds_of(run)] == [3.0, 2.0, 1.0, 0.5]
    assert seen.rounds == [[3.0, 3.0], [2.0, 2.0], [1.0, 1.0], [0.5, 0.5]]
    assert _lines(tmp_path / "run_001") == [3.0, 2.0, 1.0, 0.5]
    # One poll for the burst, one for the next round, one for the end.
    assert [name for name, _ in group.calls].count("poll") == 3


def test_the_last_round_of_a_burst_leaves_every_line_on_disk_for_a_reader(tmp_path):
    group = _BurstyGroup(2).idle().finish()
    run = fake_trainer_run(group, tmp_path)
    assert run.next()[0]["loss"] == 3.0
    assert run.next()[0]["loss"] == 2.0
    assert run.next()[0]["loss"] == 1.0
    assert _lines(tmp_path / "run_001") == [3.0, 2.0, 1.0]  # read while the run goes on


def test_stopping_in_the_middle_of_a_burst_drops_the_rounds_not_yet_delivered(tmp_path):
    group = _BurstyGroup(2).finish()
    seen = _Seen()
    run = fake_trainer_run(group, tmp_path, callbacks=[seen])
    assert run.next()[0]["loss"] == 3.0
    run.stop(patience_s=0)
    assert run.next() is None and run.state is RunState.STOPPED
    assert seen.rounds == [[3.0, 3.0]]
    assert _lines(tmp_path / "run_001") == [3.0]


def test_each_round_reaches_the_callbacks_and_a_plugins_wrapper_with_core_alone_called_directly(tmp_path):
    """With sgd-core's implementation of ``sgd_handle_result`` the only one, the controller calls
    it without pluggy's machinery (once per round: a cost per report); a plugin's implementation,
    a wrapper too, is called as pluggy calls it, and core's still hands the round on."""
    import sgd
    from sgd.plugins.manager import core_only
    from sgd.plugins.registry import get_plugin_manager

    class Seen(sgd.TrainingCallback):
        def __init__(self):
            self.rounds = []

        def handle_result(self, results, **info):
            self.rounds.append([r["step"] for r in results])

    pm = get_plugin_manager()
    assert core_only(pm.hook.sgd_handle_result) is not None
    wrapped = []

    class Wrapper:
        @sgd.hookimpl(wrapper=True)
        def sgd_handle_result(self, results):
            wrapped.append(results[0]["step"])
            return (yield)

    for plugin in (None, Wrapper()):
        if plugin is not None:
            pm.register(plugin)
        try:
            assert (core_only(pm.hook.sgd_handle_result) is None) is (plugin is not None)
            seen = Seen()
            group = FakeGroup(num_workers=2, hook=pm.hook)
            group.report({"step": 1}, {"step": 1}).report({"step": 2}, {"step": 2}).finish()
            run = fake_trainer_run(group, tmp_path / str(plugin is None), callbacks=[seen])
            assert len(rounds_of(run)) == 2
            assert seen.rounds == [[1, 1], [2, 2]]
        finally:
            if plugin is not None:
                pm.unregister(plugin)
    assert wrapped == [1, 2]
