"""The every-window plan check's protocol on a real TCPStore, with each data rank a thread holding
its own client (as each rank holds one in a job): every window agreed before anyone goes on, a
differing rank stops every rank at that window naming the sides, a rank whose planner raised or
whose loader was dropped stops the others instead of leaving them waiting, and the keys of
finished windows are deleted (the store does not grow with the run)."""

from __future__ import annotations

import datetime
import itertools
import threading

import pytest
import torch.distributed as dist

from mimo_accel.runtime.reading.plan_check import FirstPlanCheck, PlanMismatch, WindowCheck, plan_digest

WINDOWS = 10
_serials = itertools.count(1)  # one store for the module: each check's keys of its own


@pytest.fixture(scope="module")
def server():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=30))
    yield store


_clients: dict = {}  # (server port, i) -> client: made once (a torch client made after others closed can take 5 s)


def _client(server, i=0):
    """The ``i``-th client of ``server``, as each rank of a job holds one."""
    key = (server.port, i)
    if key not in _clients:
        _clients[key] = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=30))
    return _clients[key]


def _ranks(server, n, body):
    """Run ``body(rank, check)`` on ``n`` threads (ranks 10, 11, ...), each with its own store client;
    return each rank's result or exception."""
    ranks = [10 + r for r in range(n)]
    serial = next(_serials)
    checks = {r: WindowCheck(ranks, "train loader", me=r, store=_client(server, r), serial=serial) for r in ranks}
    out: dict = {}

    def run(r):
        try:
            out[r] = body(r, checks[r])
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            out[r] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a rank is still waiting"
    return out, checks


def _order(window, rank, differ_rank=None, differ_from=None):
    order = list(window)
    if rank == differ_rank and window[0] >= differ_from:
        order.reverse()
    return order


def _windows(rank, check, differ_rank=None, differ_from=None):
    agreed = []
    for w in range(WINDOWS):
        window = list(range(w * 4, w * 4 + 4))
        check.agree(0, w, plan_digest(window, _order(window, rank, differ_rank, differ_from)), first_index=window[0])
        agreed.append(w)
    return agreed


def test_every_window_is_agreed_and_finished_windows_leave_no_keys(server):
    before = server.num_keys()
    out, checks = _ranks(server, 8, _windows)
    assert all(v == list(range(WINDOWS)) for v in out.values())
    assert all(c.agreed == WINDOWS for c in checks.values())
    # what stays: the last window's four keys (plan, n, differ, verdict); every earlier window's are gone
    assert server.num_keys() - before <= 4


@pytest.mark.parametrize("differ_rank,sides", [(13, r"ranks \[10, 11, 12, 14, 15\] have plan \w+; ranks \[13\] have "
                                                     r"plan \w+"),
                                               (10, r"ranks \[10\] have plan \w+; ranks \[11, 12, 13, 14, 15\] have "
                                                     r"plan \w+")])
def test_a_rank_that_plans_differently_stops_every_rank_at_that_window(server, differ_rank, sides):
    agreed: dict = {}

    def body(rank, check):
        agreed[rank] = []
        for w in range(WINDOWS):
            window = list(range(w * 4, w * 4 + 4))
            check.agree(0, w, plan_digest(window, _order(window, rank, differ_rank, 24)), first_index=window[0])
            agreed[rank].append(w)

    out, _ = _ranks(server, 6, body)
    for rank, exc in out.items():
        assert isinstance(exc, PlanMismatch), rank
        assert agreed[rank] == [0, 1, 2, 3, 4, 5]  # window 6 (from sample 24) trains nowhere
        assert str(exc).startswith("mimo_accel: the train loader's plans differ between ranks at window 6 of this "
                                   "pass (the window from global sample 24): ")
        assert __import__("re").search(sides, str(exc)), str(exc)


def test_a_rank_whose_planner_raised_or_stopped_does_not_leave_the_others_waiting(server):
    def body(rank, check):
        for w in range(WINDOWS):
            window = list(range(w * 4, w * 4 + 4))
            if rank == 11 and w == 3:
                check.failed(0, w, ValueError("the cost index has no sample 13"))
                return "failed"
            if rank == 12 and w == 3:
                check.abandon(0, w, "its loader was dropped")
                return "dropped"
            check.agree(0, w, plan_digest(window, window), first_index=window[0])

    out, _ = _ranks(server, 4, body)
    assert out[11] == "failed" and out[12] == "dropped"
    for rank in (10, 13):
        message = str(out[rank])
        assert isinstance(out[rank], PlanMismatch)
        assert "could not agree on window 3 of this pass" in message
        assert "rank 11 not planned (its planner raised ValueError: the cost index has no sample 13)" in message
        assert "rank 12 not planned (its loader was dropped)" in message


def test_exchange_check_stops_the_rank_whose_plan_differs_from_the_first(server):
    ranks = [0, 1, 2]
    before = server.num_keys()
    serial = next(_serials)
    checks = [FirstPlanCheck(ranks, "train loader", me=r, store=_client(server, r), serial=serial) for r in ranks]
    for m in range(5):
        for r, check in enumerate(checks):
            if r == 2 and m == 3:
                with pytest.raises(PlanMismatch, match=r"exchange plans differ at micro-batch 3: rank 2 has plan "
                                                       r"bad, rank 0 \(the first to plan it\) has good3"):
                    check(m, "bad")
            else:
                check(m, f"good{m}")
    assert [c.checked for c in checks] == [5, 5, 4]  # rank 2: every micro-batch but 3
    assert server.num_keys() - before <= 2 * 2  # the last micro-batches' keys only


def test_store_keys_stay_short_at_any_number_of_ranks(server):
    # a store key holds at most 8 KiB: 4,096 ranks spelt out in it would be refused by the store
    check = WindowCheck(range(4096), "validation loader", me=4095, store=_client(server), serial=1)
    assert len(check.prefix) < 100
    assert check.prefix != WindowCheck(range(4095), "validation loader", me=0, store=_client(server), serial=1).prefix
