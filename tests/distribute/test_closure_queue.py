"""The ClusterCoordinator's queue on ps 0 (`distribute._closure_queue`), in
one process: one coordinator at a time, as TF's, whose functions die with
its program. A killed coordinator's queued functions went on training the
variables of the next coordinator (the same names) for minutes (fault
probe: 90 steps in 5 s on the new coordinator's fresh weights, its own
first function waiting 103 s behind 1858 old ones)."""
import pickle
import time

import pytest

from distribute import _closure_queue


def _queue(lease_secs=5.0, owner="chief:0:3", n=4):
    queue = _closure_queue.ClosureQueue()
    for i in range(n):
        queue.put((owner, i), b"fn", lease_secs)
    return queue


def test_a_new_coordinator_drops_the_earlier_ones_functions(caplog):
    queue = _queue()
    taken = queue.take("worker:0:4", wait=0)
    assert taken == (("chief:0:3", 0), b"fn")
    assert queue.claim("chief:0:9") == 1   # one still runs on a worker: waited for
    caplog.clear()
    with caplog.at_level("INFO"):   # (asked again while it runs: nothing dropped again)
        assert queue.claim("chief:0:9") == 1
    assert "dropped" not in caplog.text
    assert queue.take("worker:1:5", wait=0) is None   # the 3 waiting ones are gone
    queue.done("worker:0:4", ("chief:0:3", 0), b"late")
    assert queue.claim("chief:0:9") == 0
    queue.put(("chief:0:9", 0), b"mine", 5.0)
    assert queue.take("worker:1:5", wait=0) == (("chief:0:9", 0), b"mine")
    queue.done("worker:1:5", ("chief:0:9", 0), b"result")
    results, counts = queue.collect("chief:0:9")
    assert results == {("chief:0:9", 0): b"result"}   # not the earlier one's late result
    assert counts["pending"] == 0 and counts["running"] == 0
    assert queue.collect("chief:0:9")[0] == results   # (until received: an answer may be lost)
    assert queue.collect("chief:0:9", list(results))[0] == {}
    with pytest.raises(RuntimeError, match="dropped this coordinator's functions: a new "
                                           r"coordinator \(chief:0:9\) started"):
        queue.put(("chief:0:3", 9), b"fn", 5.0)
    assert queue.collect("chief:0:3") == ({}, {"pending": 0, "running": 0, "rerun": 0,
                                               "gone": "a new coordinator (chief:0:9) started"})


def test_a_silent_coordinators_functions_are_dropped_and_it_is_told_when_back():
    """Killed (kill -9: nothing runs at its exit), it stops collecting: its
    functions stop (as TF's die with its process), a running one whose
    worker dies too is not run again. A stalled one (a suspend, a long call
    holding the GIL) that comes back is told which did not run, and goes on."""
    queue = _queue(lease_secs=0.2)
    assert queue.silent_secs() == pytest.approx(10.6)   # (3 leases + 10 s: not a stall)
    queue.silent_secs = lambda: 0.3
    assert queue.take("worker:0:4", wait=0)[0] == ("chief:0:3", 0)
    assert queue.take("worker:1:5", wait=0)[0] == ("chief:0:3", 1)
    time.sleep(0.4)
    assert queue.take("worker:1:5", wait=0) is None
    queue.done("worker:1:5", ("chief:0:3", 1), b"late")   # (its worker was only slow)
    results, counts = queue.collect("chief:0:3")
    assert counts == {"pending": 0, "running": 0, "rerun": 0}
    assert results.pop(("chief:0:3", 1)) == b"late"
    told = {cid: pickle.loads(r) for cid, r in results.items()}
    assert sorted(told) == [("chief:0:3", i) for i in (0, 2, 3)]
    assert told[("chief:0:3", 2)][0] == "dropped" and told[("chief:0:3", 2)][1].startswith(
        "ps 0 dropped this function without running it: this coordinator was not heard from ")
    assert "did not run this function again: its worker" in told[("chief:0:3", 0)][1]
    queue.put(("chief:0:3", 4), b"fn", 0.2)   # it goes on
    assert queue.take("worker:1:5", wait=0)[0] == ("chief:0:3", 4)


def test_a_collecting_coordinators_functions_run_and_a_dead_workers_run_again():
    queue = _queue(lease_secs=0.2, n=2)
    assert queue.take("worker:0:4", wait=0)[0] == ("chief:0:3", 0)
    for _ in range(4):   # (it collects every 50 ms; the worker died silently)
        time.sleep(0.1)
        queue.collect("chief:0:3")
    assert queue.take("worker:1:5", wait=0)[0] == ("chief:0:3", 0)   # run again
    assert queue.collect("chief:0:3")[1]["rerun"] == 1


def test_a_program_that_ends_drops_its_waiting_functions():
    """An exception after schedule(), or the end of the program without
    join(): its functions went on running on the workers."""
    queue = _queue()
    queue.leave("chief:0:3")
    assert queue.take("worker:0:4", wait=0) is None
    queue.stop()
    assert queue.take("worker:0:4", wait=0) == _closure_queue.STOP
