"""runtime/comm/heartbeat.py's rule, on a dict store and a clock the test moves (no threads, no processes): a watched
rank whose counter stops is named after the timeout and not before; a rank that was itself stopped gives the
watched one a fresh timeout and never names it; ``done`` ends the watch; a rank named by another ends quietly."""
from hypothesis import given, settings
from hypothesis import strategies as st

from hpc_jabas.runtime.comm.heartbeat import Heartbeat, interval_for


class Store:
    def __init__(self):
        self.d: dict[str, bytes] = {}

    def set(self, k, v):
        self.d[k] = v.encode() if isinstance(v, str) else v

    def get(self, k):
        return self.d[k]

    def check(self, keys):
        return all(k in self.d for k in keys)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def _pair(timeout=20.0):
    store, clock, ended = Store(), Clock(), []
    hbs = [Heartbeat(store, r, 2, timeout, 0, lambda: "rerun the same command", ended.append, clock=clock)
           for r in (0, 1)]
    for hb in hbs:
        hb._beat()
    return store, clock, ended, hbs


@settings(max_examples=40, deadline=None)
@given(st.floats(1.0, 60.0), st.integers(0, 30))
def test_a_stopped_rank_is_named_after_the_timeout_and_not_before(timeout, beats_before):
    store, clock, ended, (h0, h1) = _pair(timeout)
    step = interval_for(timeout)
    for _ in range(beats_before):                 # both beat: nobody is named
        clock.t += step
        assert h0.tick() and h1.tick()
    assert ended == []
    t_stop = clock.t                               # rank 1 stops: only rank 0 ticks from here
    named_at = None
    while named_at is None and clock.t < t_stop + 3 * timeout:
        clock.t += step
        if not h0.tick():
            named_at = clock.t
    assert named_at is not None and ended and not ended[0].quiet
    # named once the timeout has passed since rank 1's last beat that rank 0 saw, within one interval after it
    assert timeout < named_at - t_stop <= timeout + 2 * step + 1e-9
    assert str(ended[0]).startswith("rank 1 of 2 hung: no heartbeat for ") and "rank 0 stops too" in str(ended[0])
    assert store.d["hung"] == b"1"


def test_the_stopped_rank_blames_nobody_and_ends_quietly_when_named():
    store, clock, ended, (h0, h1) = _pair(20.0)
    clock.t += 2.0
    h0.tick(), h1.tick()
    clock.t += 60.0                               # the whole process of rank 1 was stopped for 60 s ...
    assert h1.stalled_s() == 0.0                  # ... which it knows before its thread runs again
    store.d.pop("hung", None)
    assert h1.tick() is True and ended == []      # not named yet: it gives rank 0 a fresh timeout
    for _ in range(5):
        clock.t += 2.0
        h1.tick()
    assert ended == []                            # 10 s of the fresh 20 s: rank 0 is not named
    store.set("hung", "1")                        # rank 0 named it meanwhile: it ends without a line
    clock.t += 2.0
    assert h1.tick() is False and len(ended) == 1 and ended[0].quiet


def test_done_ends_the_watch():
    store, clock, ended, (h0, h1) = _pair(5.0)
    h1.stop(done=True)
    for _ in range(20):
        clock.t += 1.0
        h0.tick()
    assert ended == [] and h0.watch is None
