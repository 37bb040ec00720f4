"""The store on object storage: an S3-compatible server on 127.0.0.1 (moto in server mode).

What delta-rs (1.x) needs to commit safely on S3: a server that honours conditional writes.
A commit is ``PUT _delta_log/<version>.json`` with ``If-None-Match: *``; the loser of a race
gets ``412 Precondition Failed``, re-reads the log and commits the next version (appends never
conflict). There is no locking provider any more (delta-rs 1.0 dropped the DynamoDB one) and
``aws_s3_allow_unsafe_rename`` changes nothing on this path; with conditional put switched off
(``aws_conditional_put = "disabled"``) delta-rs refuses to commit rather than overwrite.
So the options are the endpoint, region, keys and ``aws_allow_http`` (plain HTTP here), plus
``aws_conditional_put = "etag"`` — already object_store's default, set to say it is relied on.

The server: moto's own WSGI app and request handler (what ``moto_server`` runs), with two
additions. Requests are served one at a time: moto checks ``If-None-Match`` and then stores
the object in two steps with no lock between them (``moto/s3/responses.py``, ``put_object``),
so under its threaded server two racing commits of one version could both pass the check,
where S3 lets exactly one through; serialised, the check and the write are atomic, as on S3.
And a *race maker* (``PUT /__race__/<bucket>/<table>``) that makes the next writer of the table
lose the race for a version on purpose: it holds the answer to that writer's last look at the
log (the listing between its data upload and its commit) until another writer has committed.

Needs ``moto[server]`` (the module is skipped without it). Network: 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from _delta import commit_lands_then_fails_once, records_batch

from foreshock.storage import queries, stream_queries
from foreshock.storage.location import StoreLocation
from foreshock.storage.reader import open_history
from foreshock.storage.rows import BatchBuilder
from foreshock.storage.store import DeltaStore, store_exists

pytest.importorskip("moto.server", reason="needs moto[server]: pip install 'moto[server]'")
boto3 = pytest.importorskip("boto3", reason="needs moto[server]: pip install 'moto[server]'")

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "foreshock-test"
KEYS = {"aws_region": "us-east-1", "aws_access_key_id": "test", "aws_secret_access_key": "test"}

SERVER = textwrap.dedent("""
    import sys, threading
    from urllib.parse import parse_qs
    from werkzeug.serving import run_simple
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication, MotoRequestHandler, create_backend_app)

    app, lock = DomainDispatcherApplication(create_backend_app), threading.Lock()
    race = {"table": "", "state": "idle", "committed": threading.Event()}

    def serve(environ, start_response):  # one request at a time: see the module docstring
        with lock:
            body = app(environ, start_response)
            try:
                return list(body)
            finally:
                getattr(body, "close", lambda: None)()

    def with_race_maker(environ, start_response):
        method, path, table = environ["REQUEST_METHOD"], environ["PATH_INFO"], race["table"]
        if path.startswith("/__race__"):  # PUT arms it for a table; GET says where it is
            if method == "PUT":
                race["committed"].clear()
                race.update(table=path.removeprefix("/__race__"), state="armed")
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [race["state"].encode()]
        status = []

        def recording(code, headers, *exc):
            status.append(code)
            return start_response(code, headers, *exc)

        if method == "PUT" and path.startswith(table + "/") and path.endswith(".parquet"):
            if race["state"] == "armed":
                race["state"] = "uploaded"  # its next listing of the log precedes its commit
        prefix = parse_qs(environ.get("QUERY_STRING", "")).get("prefix", [""])[0]
        held = (method == "GET" and race["state"] == "uploaded"
                and path.rstrip("/") + "/" + prefix == table + "/_delta_log/")
        if held:
            race["state"] = "holding"
        out = serve(environ, recording)
        if (method == "PUT" and path.startswith(table + "/_delta_log/") and status
                and status[0].startswith("200") and race["state"] == "holding"):
            race["committed"].set()  # another writer committed: let the stale answer go
        if held:
            race["state"] = "released" if race["committed"].wait(20) else "timed out"
        return out

    run_simple("127.0.0.1", int(sys.argv[1]), with_race_maker, threaded=True,
               request_handler=MotoRequestHandler)
""")

# one sink: opens the store when told to go, then commits n batches of five records as fast
# as it can, each batch two commits (metric_values, steps)
WRITER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from foreshock.storage.location import StoreLocation
    from foreshock.storage.rows import BatchBuilder
    from foreshock.storage.store import DeltaStore

    uri, options, run, n, folder = sys.argv[1:6]
    folder = Path(folder)
    (folder / ("ready-" + run)).touch()
    deadline = time.monotonic() + 60
    while not (folder / "go").exists():
        if time.monotonic() > deadline:
            sys.exit("never told to go")
        time.sleep(0.002)
    store = DeltaStore(StoreLocation(uri, json.loads(options)))
    for i in range(int(n)):
        b = BatchBuilder()
        for seq in range(i * 5, i * 5 + 5):
            b.add_metrics({"run_id": run, "seq": seq, "step": seq,
                           "values": {"v0": float(seq), "v1": 1.0}}, 0.0)
        store.write(b.take())
    print(json.dumps({"app_id": store.app_id, "versions": store.versions()}))
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory):
    """(endpoint, boto3 client, server log) of a fresh server with the test bucket."""
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as mp, log.open("w") as out:
        for name in ("NO_PROXY", "no_proxy"):  # never through a proxy, in here or in writers
            mp.setenv(name, ",".join(filter(None, [os.environ.get(name), "127.0.0.1"])))
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "MOTO_PORT": str(port)},
        )
        try:
            client = boto3.client(
                "s3",
                endpoint_url=endpoint,
                region_name=KEYS["aws_region"],
                aws_access_key_id=KEYS["aws_access_key_id"],
                aws_secret_access_key=KEYS["aws_secret_access_key"],
            )
            deadline = time.monotonic() + 30
            while True:
                if server.poll() is not None:
                    pytest.fail(f"moto server exited: {log.read_text()[-2000:]}")
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        pytest.fail(f"moto server not up in 30 s: {log.read_text()[-2000:]}")
                    time.sleep(0.05)
            client.create_bucket(Bucket=BUCKET)
            yield endpoint, client, log
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=10)


@pytest.fixture
def location(s3, request) -> StoreLocation:
    """A store of this test's own under the bucket."""
    endpoint = s3[0]
    name = f"{request.node.name[:40]}-{uuid.uuid4().hex[:8]}"
    return StoreLocation(
        f"s3://{BUCKET}/{name}/history",
        {
            "aws_endpoint_url": endpoint,
            **KEYS,
            "aws_allow_http": "true",
            "aws_conditional_put": "etag",
        },
    )


_records = records_batch


def _count(location: StoreLocation, table: str = "steps") -> int:
    with open_history(location) as history:
        return history.sql(f"SELECT count(*) AS n FROM {table}").to_pylist()[0]["n"]


def _objects(client, location: StoreLocation, table: str, suffix: str) -> list[str]:
    prefix = location.table_uri(table).removeprefix(f"s3://{BUCKET}/") + "/"
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [
        o["Key"] for page in pages for o in page.get("Contents", []) if o["Key"].endswith(suffix)
    ]


def test_the_server_refuses_to_overwrite_an_object_under_a_condition(s3):
    """What delta-rs's commits rely on: ``If-None-Match: *`` and ``If-Match`` are honoured."""
    _, client, _ = s3
    errors = pytest.importorskip("botocore.exceptions")
    client.put_object(Bucket=BUCKET, Key="probe", Body=b"1")
    for condition in ({"IfNoneMatch": "*"}, {"IfMatch": '"not-the-etag"'}):
        with pytest.raises(errors.ClientError) as refused:
            client.put_object(Bucket=BUCKET, Key="probe", Body=b"2", **condition)
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert client.get_object(Bucket=BUCKET, Key="probe")["Body"].read() == b"1"


def test_without_conditional_put_delta_rs_refuses_to_commit(location):
    """No silent fallback to an overwrite that could lose a concurrent commit."""
    unsafe = StoreLocation(location.uri, {**location.options, "aws_conditional_put": "disabled"})
    with pytest.raises(OSError, match="conditional put is disabled"):
        DeltaStore(unsafe)
    assert not store_exists(location)


def test_a_store_on_s3_round_trips_compacts_and_vacuums(s3, location):
    client = s3[1]
    store = DeltaStore(location)
    assert store_exists(location)
    b = BatchBuilder()
    b.add_lifecycle(
        {
            "run_id": "r",
            "kind": "start",
            "seq": 0,
            "labels": {"project": "p", "scenario": "healthy"},
        },
        0.0,
    )
    store.write(b.take())
    for i in range(3):
        written = store.write(_records("r", range(i * 10 + 1, i * 10 + 11)))
        assert written == {"metric_values": i + 1, "steps": i + 1}
    with open_history(location) as history:
        assert history.versions["steps"] == 3 and history.files["steps"] == 3
        assert _count(location) == 30 and _count(location, "metric_values") == 60
        [row] = queries.fleet(history)
        got = (row["run_id"], row["project"], row["records"], row["last_step"])
        assert got == ("r", "p", 30, 30)
        assert row["status"] == "healthy" and queries.fleet(history, project="other") == []
        assert stream_queries.duplicate_records(history) == []
    assert len(_objects(client, location, "steps", ".parquet")) == 3

    report = store.maintain(retain_hours=0)
    assert report["steps"] == {"files_added": 1, "files_removed": 3, "vacuumed": 3}
    assert report["metric_values"]["files_added"] == 1
    assert len(_objects(client, location, "steps", ".parquet")) == 1  # deleted on the server
    with open_history(location) as history:
        assert history.files["steps"] == 1 and history.versions["steps"] > 3
        assert history.sql(
            "SELECT count(*) AS n, count(DISTINCT seq) AS d FROM steps"
        ).to_pylist() == [{"n": 30, "d": 30}]
    assert store.delete("steps", "seq <= 5") == 5
    assert _count(location) == 25


def test_two_processes_append_to_the_same_s3_tables_at_once(s3, location, tmp_path):
    """Two sinks commit batches to the same tables as fast as they can: every row lands
    exactly once and no commit is lost (the tables exist first: two processes creating one
    table at once can both commit a CREATE TABLE — delta-rs retries the loser's at the next
    version — which would throw the version count off, not the rows)."""
    log, n = s3[2], 10
    DeltaStore(location)
    before = log.read_text().count('" 412 ')
    options = json.dumps(location.options)
    writers = {
        run: subprocess.Popen(
            [sys.executable, "-c", WRITER, location.uri, options, run, str(n), str(tmp_path)],
            cwd=ROOT,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for run in ("ra", "rb")
    }
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready-{run}").exists() for run in writers):
            dead = [w for w in writers.values() if w.poll() is not None]
            if dead or time.monotonic() > deadline:
                pytest.fail(f"writer not ready: {dead and dead[0].communicate()[1][-2000:]}")
            time.sleep(0.01)
        (tmp_path / "go").touch()
        outs = {run: w.communicate(timeout=120) for run, w in writers.items()}
    finally:
        for w in writers.values():
            if w.poll() is None:
                w.kill()
                w.wait(timeout=10)
    for run, w in writers.items():
        assert w.returncode == 0, outs[run][1][-3000:]
    ids = {json.loads(outs[run][0])["app_id"] for run in writers}
    assert len(ids) == 2
    with open_history(location) as history:
        per_run = history.sql(
            "SELECT run_id, count(*) AS n, count(DISTINCT seq) AS d "
            "FROM steps GROUP BY ALL ORDER BY 1"
        ).to_pylist()
        assert per_run == [{"run_id": r, "n": 5 * n, "d": 5 * n} for r in ("ra", "rb")]
        assert _count(location, "metric_values") == 2 * 2 * 5 * n
        assert stream_queries.duplicate_records(history) == []
        assert stream_queries.value_count_mismatches(history) == []
        # the creation plus each writer's n commits: none overwritten by a racing one
        assert history.versions["steps"] == history.versions["metric_values"] == 2 * n
    # how often the two raced for one version (412s the server answered): informational
    raced = log.read_text().count('" 412 ') - before
    print(f"commits that lost a race and were retried: {raced}")


def _race(endpoint: str, table: str = "") -> str:
    """Arm the server's race maker for ``table`` (``/bucket/key``), or read its state."""
    url = f"{endpoint}/__race__{table}"
    request = urllib.request.Request(
        url, data=b"" if table else None, method="PUT" if table else "GET"
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as reply:
        return reply.read().decode()


def test_a_writer_that_loses_the_race_for_a_version_commits_the_next(s3, location):
    """The race made certain: writer A looks at the log (steps at version 0) just before its
    commit, B commits version 1 meanwhile; A's commit of version 1 is refused (412) and A
    commits version 2 instead — both batches stored, once each."""
    endpoint, _, log = s3
    a, b = DeltaStore(location), DeltaStore(location)
    table = "/" + location.table_uri("steps").removeprefix("s3://")
    assert _race(endpoint, table) == "armed"
    results: list = []

    def write_a():
        try:
            results.append(a.write(_records("ra", range(1, 11))))
        except Exception as exc:  # reported below
            results.append(exc)

    writer = threading.Thread(target=write_a, daemon=True)
    writer.start()
    deadline = time.monotonic() + 20
    while _race(endpoint) != "holding":  # A has uploaded its data and read the log
        assert writer.is_alive(), f"A was never held: {results}"
        assert time.monotonic() < deadline, "A was never held"
        time.sleep(0.01)
    assert b.write(_records("rb", range(1, 11))) == {"metric_values": 2, "steps": 1}
    writer.join(timeout=30)
    assert not writer.is_alive() and _race(endpoint) == "released"
    assert results == [{"metric_values": 1, "steps": 2}]
    refused = [
        line
        for line in log.read_text().splitlines()
        if f"PUT {table}/_delta_log/{1:020d}.json" in line and '" 412 ' in line
    ]
    assert len(refused) == 1  # A's try at version 1
    with open_history(location) as history:
        per_run = history.sql("SELECT run_id, count(*) AS n FROM steps GROUP BY ALL ORDER BY 1")
        assert per_run.to_pylist() == [{"run_id": "ra", "n": 10}, {"run_id": "rb", "n": 10}]
        assert stream_queries.duplicate_records(history) == []
        assert stream_queries.value_count_mismatches(history) == []


def test_a_retried_batch_is_stored_once_on_s3(location, monkeypatch):
    """As in test_storage: a commit that landed but reported an error (here: a lost reply)
    is not appended again by the retry, nor by a restarted writer with the same app_id."""
    error = OSError("Generic S3 error: error sending request: connection reset")
    calls = commit_lands_then_fails_once(monkeypatch, error)
    store = DeltaStore(location)
    number = store.next_batch()
    with pytest.raises(OSError):
        store.write(_records("r", range(10)), number)
    assert store.write(_records("r", range(10)), number) == {}  # the sink's retry
    assert calls == [20, 10]  # values once, steps once: nothing appended twice
    assert (_count(location), _count(location, "metric_values")) == (10, 20)

    restarted = DeltaStore(location, app_id=store.app_id)  # same writer, a new process
    assert restarted.write(_records("r", range(10)), number) == {}
    assert calls == [20, 10]
    restarted.write(_records("r", range(10, 12)), number + 1)  # the next batch is new
    assert (_count(location), _count(location, "metric_values")) == (12, 24)


def test_a_remote_history_reads_local_copies_of_its_files_fetched_once(location, tmp_path):
    """Pages over a remote store read local copies of its (immutable) Parquet files: the
    same answers as the Arrow-dataset path, each file fetched once, then only new files."""
    from foreshock.storage.file_cache import FileCache

    store = DeltaStore(location)
    for i in range(2):
        store.write(_records("r", range(i * 10 + 1, i * 10 + 11)))
    cache = FileCache(tmp_path / "cache", max_bytes=2**30)
    query = (  # rounded: two read paths may add in another order
        "SELECT metric, count(*) AS n, round(sum(value), 6) AS total FROM metric_values "
        "GROUP BY ALL"
    )

    def answer(cache) -> list:
        with open_history(location, cache=cache) as history:
            return sorted(tuple(row.values()) for row in history.sql(query).to_pylist())

    remote = answer(None)
    assert answer(cache) == remote and cache.downloads == 4  # 2 files each of 2 tables
    assert answer(cache) == remote and cache.downloads == 4  # nothing fetched again
    store.write(_records("r", range(21, 31)))
    assert answer(cache) != remote and cache.downloads == 6  # only the new batch's two
    assert answer(cache) == answer(None)
    small = FileCache(tmp_path / "small", max_bytes=10)  # too small: read remotely
    assert answer(small) == answer(None) and small.downloads == 0


def test_tune_publishes_into_a_store_on_s3_and_detectors_load_it_from_there(location):
    """The detector-config registry lives on the store's own URI: `foreshock tune --store
    s3://…` publishes there (it used to take the URI for a local folder), `detect --store
    s3://…` loads the live config from there, a rollback walks back, and a named profile
    published there is read back."""
    from foreshock.detectors import registry
    from foreshock.detectors.config import DetectorConfig
    from foreshock.detectors.profiles import load_profiles, save_profile
    from foreshock.lab.recorded import shipped_runs
    from foreshock.operate.store_runs import store_recorded_runs

    names = [f"healthy-s{s}" for s in range(6)] + ["fa-lowprec-s1", "lr-high-s1"]
    paths = [p for p in shipped_runs() if p.name.split(".")[0] in names]
    with DeltaStore(location) as store:
        store_recorded_runs(store, paths, config=None)
    env = {
        **os.environ,
        **{f"FORESHOCK_STORE_OPTION_{k.upper()}": v for k, v in location.options.items()},
    }

    def cli(*argv: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "foreshock.app.cli", *argv, "--store", location.uri]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)

    grid = ["--grid-k", "0.5", "--grid-confirm", "1", "--grid-trend-beta", "0.2"]
    tuned = cli("tune", *grid, "--note", "on s3", "--json")
    assert tuned.returncode == 0, tuned.stderr
    version = json.loads(tuned.stdout)["published"]
    assert registry.live_version(location) == version
    assert [(e["version"], e["note"]) for e in registry.history(location)] == [(version, "on s3")]
    detected = cli("detect", "--replay", str(paths[-1]), "--json")
    assert detected.returncode == 0 and "no live config" not in detected.stderr, detected.stderr
    assert json.loads(detected.stdout)["config_version"] == version

    other = registry.publish(location, DetectorConfig(k=0.25))
    assert registry.live_config(location) == DetectorConfig(k=0.25)
    assert registry.rollback(location) == version and other != version
    save_profile(registry.profiles_folder(location), "mine", DetectorConfig(k=0.75), [{"a": 1}])
    published = load_profiles(registry.profiles_folder(location))
    assert published.configs == {"mine": DetectorConfig(k=0.75)}
    assert published.signatures == {"mine": [{"a": 1}]}


def test_a_torn_commit_on_s3_is_named_and_repaired(s3, location):
    """A commit object cut in half (a copy or sync tool, not a writer: a PUT is whole) is
    named by `store check` and moved aside by `store repair`, as on a local store; the table
    is then readable at its last good version."""
    from deltalake import DeltaTable

    from foreshock.storage.repair import damaged_commits, repair

    client = s3[1]
    store = DeltaStore(location)
    for i in range(2):
        store.write(_records("r", range(i * 10 + 1, i * 10 + 11)))
    [newest] = [k for k in _objects(client, location, "steps", ".json") if k.endswith("2.json")]
    body = client.get_object(Bucket=BUCKET, Key=newest)["Body"].read()
    client.put_object(Bucket=BUCKET, Key=newest, Body=body[: len(body) // 2])
    env = {
        **os.environ,
        **{f"FORESHOCK_STORE_OPTION_{k.upper()}": v for k, v in location.options.items()},
    }
    command = [sys.executable, "-m", "foreshock.app.cli", "store", "check", "--store", location.uri]
    check = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert check.returncode == 2 and newest.rsplit("/", 1)[-1] in check.stderr, check.stderr
    assert "Traceback" not in check.stderr
    [damage] = damaged_commits(location)
    assert (damage.table, damage.version) == ("steps", 2)
    [done] = repair(location)
    assert "steps is at version 1" in done and damaged_commits(location) == []
    table = DeltaTable(location.table_uri("steps"), storage_options=location.options)
    assert table.version() == 1 and table.to_pyarrow_table().num_rows == 10
    assert any("/steps/" in k for k in _objects(client, location, "_repair", "2.json"))
