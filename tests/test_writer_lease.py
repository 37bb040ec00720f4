"""One writer group per store, always: a running sink holds a lease in the store, renewed while
it runs — idle or not — and checked before every commit. A second group that starts while the
first has been idle longer than the commit window (which once let it in: the next run was
stored twice) is refused, naming the group that holds the lease; a group that took the store
over with ``--take-over`` makes the first one stop at its next commit rather than write
beside it. Real broker, real Delta tables."""

from __future__ import annotations

import threading
import time

import pytest
from test_sink import (
    RUNS,
    _exactly_once,
    _expected_steps,
    _publish,
    _stored_steps_or_none,
    _wait_for,
)

from foreshock.storage.second_writer import LEASE_FILE, SecondWriterError
from foreshock.storage.sink import StorageSink
from foreshock.transport.topics import ensure_topics


@pytest.mark.slow
def test_an_idle_sink_keeps_its_store_and_a_take_over_stops_it(kafka_settings, tmp_path):
    ensure_topics(kafka_settings)
    root = tmp_path / "store"
    first = StorageSink(kafka_settings, root, group_id="sink-a", writer_window=0.5)
    stop_first = threading.Event()
    running = threading.Thread(target=first.run, args=(stop_first,), daemon=True)
    running.start()
    _publish(kafka_settings, RUNS[:1])
    _wait_for(lambda: _stored_steps_or_none(root) == _expected_steps(RUNS[:1]))
    time.sleep(1.5)  # idle for longer than the commit window: the old guard saw no writer
    with pytest.raises(SecondWriterError, match="leased by sink group 'sink-a'"):
        StorageSink(kafka_settings, root, group_id="sink-b", writer_window=0.5)
    assert running.is_alive()

    second = StorageSink(kafka_settings, root, group_id="sink-b", writer_window=0.5, take_over=True)
    stop_second = threading.Event()
    taking = threading.Thread(target=second.run, args=(stop_second,), daemon=True)
    taking.start()
    _publish(kafka_settings, RUNS[1:2])  # both groups read it: only the lease holder stores it
    running.join(60)
    assert not running.is_alive()  # the first stopped at its next commit, saying why
    _wait_for(lambda: _stored_steps_or_none(root) == _expected_steps(RUNS[:2]))
    stop_second.set()
    taking.join(60)
    _exactly_once(root, RUNS[:2])
    assert '"released"' in (root / LEASE_FILE).read_text()  # a clean stop frees the store
    StorageSink(kafka_settings, root, group_id="sink-c", writer_window=0.5).close()
