"""The MySQL engine beyond the contract, on the session's MariaDB: bad input (credentials,
database, options) named within the timeout and never showing the password; what MySQL
refuses (read-only servers, connection limits, long names); proxies; describe among other
sessions' GET_LOCKs."""
from __future__ import annotations

import logging
import textwrap
import time
import uuid
from typing import Any
from urllib.parse import quote

import pytest

import ylock
from tests.helpers import Runner
from ylock.engines.mysql import MySQLEngine
from ylock.testing.proxy import TcpProxy


def url_as(server: Any, user: str, password: str, database: str | None = None) -> str:
    return f"mysql://{quote(user, safe='')}:{quote(password, safe='')}@127.0.0.1:{server.port}/" \
           f"{database or server.database}"


@pytest.fixture
def make_engine() -> Any:
    built: list[ylock.Engine] = []

    def make(url: str, **options: Any) -> Any:
        built.append(ylock.engine_from_url(url, **options))
        return built[-1]
    yield make
    for engine in built:
        engine.close()


def test_a_wrong_password_is_named_within_the_timeout_and_never_shown(mariadb_server, make_engine, caplog):
    secret = "not-the-password-" + uuid.uuid4().hex[:6]
    engine = make_engine(url_as(mariadb_server, mariadb_server.user, secret) + "?connect_timeout=1")
    caplog.set_level(logging.DEBUG)
    started = time.monotonic()
    with pytest.raises(ylock.EngineUnavailable) as info:
        ylock.Lock(engine, "g", "n").try_lock(5)
    assert time.monotonic() - started < 1.5
    assert "refused the credentials" in str(info.value) and "Access denied" in str(info.value)
    shown = [str(info.value), repr(info.value), repr(engine), engine.url_for_display(), caplog.text,
             str(info.value.__cause__)]
    assert not [s for s in shown if secret in s]


def test_an_unknown_database_is_named(mariadb_server, make_engine):
    engine = make_engine(url_as(mariadb_server, mariadb_server.user, mariadb_server.password, "nosuchdb"))
    with pytest.raises(ylock.EngineUnavailable, match="database 'nosuchdb' does not exist"):
        ylock.Lock(engine, "g", "n").try_lock(1)


@pytest.mark.parametrize("query, named", [("max_connections=0", "max_connections"), ("prefix=Bad-Name", "prefix"),
                                          ("proxy=maybe", "proxy"), ("socket_timeout=nan", "socket_timeout"),
                                          ("nosuchoption=1", "nosuchoption"), ("ssl_verify_cert=perhaps",
                                                                               "ssl_verify_cert")])
def test_bad_options_are_configuration_errors_naming_them(query, named):
    with pytest.raises(ylock.ConfigurationError, match=named):
        ylock.engine_from_url(f"mysql://u:pw@127.0.0.1:1/db?{query}")


def test_urls_need_a_database_and_take_percent_encoded_passwords(mariadb_server, make_engine):
    with pytest.raises(ylock.ConfigurationError, match="names its database"):
        ylock.engine_from_url("mysql://u:pw@127.0.0.1:3306/")
    user, password = "u" + uuid.uuid4().hex[:8], "p@ss:w/rd%é"
    mariadb_server.query(f"CREATE USER '{user}'@'%%' IDENTIFIED BY %s", [password])
    mariadb_server.query(f"GRANT ALL ON `{mariadb_server.database}`.* TO '{user}'@'%'")
    engine = make_engine(url_as(mariadb_server, user, password).replace("mysql://", "mariadb://"))
    assert isinstance(engine, MySQLEngine) and password not in repr(engine) and quote(password) not in repr(engine)
    with ylock.Lock(engine, "g" + user, "n").write(timeout=5):
        pass


def test_long_groups_and_names_fit_getlock_s_64_characters(mysql_engine, group, mariadb_server):
    name = "é" * 100 + "x" * 100                          # 200 characters, 300 bytes
    lock = ylock.Lock(mysql_engine, group + "g" * (64 - len(group)), name)
    with lock.write(timeout=5):
        info = mysql_engine.describe_lock(lock.group, name)
        assert info is not None and info.owners == (ylock.current_owner(),)
        names = [row[0] for row in mariadb_server.query("SELECT ID FROM information_schema.PROCESSLIST")]
        assert names


def test_describe_ignores_other_sessions_get_locks(mysql_engine, group, mariadb_server):
    with mariadb_server.connect() as other, other.cursor() as cursor:
        cursor.execute("SELECT GET_LOCK('somebody-elses', 0)")
        with ylock.Lock(mysql_engine, group, "mine").write(timeout=5):
            infos = [i for i in mysql_engine.describe() if i.group == group]
            assert [(i.name, i.mode) for i in infos] == [("mine", "write")]


def test_a_read_only_server_is_refused_before_anything_is_written(mariadb_server, make_engine):
    mariadb_server.query("SET GLOBAL read_only = 1")
    try:
        engine = make_engine(mariadb_server.url)
        with pytest.raises(ylock.ConfigurationError, match="read-only") as info:
            ylock.Lock(engine, "g", "n").try_lock(1)
        assert "primary" in (info.value.hint or "")
    finally:
        mariadb_server.query("SET GLOBAL read_only = 0")


def test_a_connection_limit_is_named(mariadb_server, make_engine, group):
    user = "lim" + uuid.uuid4().hex[:8]
    mariadb_server.query(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw' WITH MAX_USER_CONNECTIONS 1")
    mariadb_server.query(f"GRANT ALL ON `{mariadb_server.database}`.* TO '{user}'@'%'")
    engine = make_engine(url_as(mariadb_server, user, "pw"))
    with ylock.Lock(engine, group, "a").write(timeout=5):          # its one connection
        runner = Runner(lambda: ylock.Lock(engine, group, "b").try_lock(1))
        runner.start()
        with pytest.raises(ylock.EngineUnavailable, match="max_user_connections"):
            runner.outcome()


def test_the_proxy_check_sees_a_proxy_and_trusts_one_said_to_keep_sessions(mariadb_server, make_engine, group):
    assert make_engine(mariadb_server.url).detect_pooler() is None
    with TcpProxy(mariadb_server.port) as proxy:
        url = mariadb_server.url.replace(f":{mariadb_server.port}/", f":{proxy.port}/")
        found = make_engine(url).detect_pooler()
        assert found is not None and "proxy" in found and "proxy=session" in found
        assert make_engine(url + "?proxy=session").detect_pooler() is None
        through = make_engine(url)                    # a TCP proxy keeps sessions: locks work
        with ylock.Lock(through, group, "n").write(timeout=5):
            pass


def test_a_cancelled_wait_leaves_the_server_s_queue_at_once(mysql_engine, group):
    import asyncio

    holder = ylock.Lock(mysql_engine, group, "n")
    holder.lock()

    async def main() -> float:
        task = asyncio.create_task(ylock.Lock(mysql_engine, group, "n").alock(timeout=30))
        while not await asyncio.to_thread(lambda: mysql_engine.describe_lock(group, "n").waiters):
            await asyncio.sleep(0.01)
        task.cancel()
        started = time.monotonic()
        await asyncio.gather(task, return_exceptions=True)
        while await asyncio.to_thread(lambda: mysql_engine.describe_lock(group, "n").waiters):
            await asyncio.sleep(0.005)
        return time.monotonic() - started
    assert asyncio.run(main()) < 0.5                  # KILLed, not left for the server to notice
    holder.unlock()


def test_a_writer_waiting_for_several_readers_keeps_its_one_deadline(mysql_engine, group):
    """The writer waits for every reader inside in one statement: the deadline is the call's,
    shared by all those waits (not one timeout per reader), and it gives the turnstile back."""
    readers = [ylock.Lock(mysql_engine, group, "n") for _ in range(3)]
    for reader in readers:                               # each reader its own thread: its own owner
        runner = Runner(reader.rlock)
        runner.start()
        runner.outcome()
    started = time.monotonic()
    got = Runner(lambda: ylock.Lock(mysql_engine, group, "n").try_lock(0.5))
    got.start()
    assert got.outcome() is False
    assert 0.5 <= time.monotonic() - started < 1.3
    info = mysql_engine.describe_lock(group, "n")
    assert info is not None and info.mode == "read" and len(info.owners) == 3 and not info.waiters
    reader = Runner(lambda: (lambda lock: (lock.try_rlock(0), lock.runlock())[0])(ylock.Lock(mysql_engine, group,
                                                                                              "n")))
    reader.start()
    assert reader.outcome() is True                      # the turnstile was given back


def test_tls_from_url_options_and_pooled_tls_connections_are_reused(tmp_path_factory, group):
    """``?ssl_ca=...&ssl_verify_identity=true`` on a server that requires TLS of the user (a
    connection with ``?ssl_disabled=true`` is refused; PyMySQL asks for TLS unverified when
    the server offers it and no option says otherwise); the pooled TLS connection serves the next lock (a TLS
    session ticket that arrived meanwhile does not make it look stale)."""
    import os
    import pwd
    import tempfile

    from ylock.engines.mysql.ops import Open
    from ylock.testing.mariadb import MariaDBServer
    from ylock.testing.redis import make_tls_files

    where = tempfile.mkdtemp(prefix="ylock-mariadb-tls-")
    os.chmod(where, 0o755)
    files = make_tls_files(where)
    if os.geteuid() == 0:
        mysql = pwd.getpwnam("mysql")
        for path in (files.ca, files.cert, files.key):
            os.chown(path, mysql.pw_uid, mysql.pw_gid)
    server = MariaDBServer(settings={"ssl-ca": files.ca, "ssl-cert": files.cert, "ssl-key": files.key}).start()
    try:
        server.query("CREATE USER 'tlsuser'@'%' IDENTIFIED BY 'pw' REQUIRE SSL")
        server.query(f"GRANT ALL ON `{server.database}`.* TO 'tlsuser'@'%'")
        plain = ylock.engine_from_url(url_as(server, "tlsuser", "pw") + "?ssl_disabled=true")
        with pytest.raises(ylock.EngineUnavailable, match="credentials"):
            ylock.Lock(plain, group, "n").try_lock(1)
        plain.close()
        engine = ylock.engine_from_url(url_as(server, "tlsuser", "pw") + f"?ssl_ca={quote(str(files.ca))}"
                                       "&ssl_verify_identity=true")
        opened: list[object] = []
        do = engine._do

        def counting(op: Any) -> Any:
            if isinstance(op, Open):
                opened.append(op)
            return do(op)
        engine._do = counting
        for _ in range(3):
            with ylock.Lock(engine, group, "n").write(timeout=5):
                pass
            time.sleep(0.05)                              # room for the server's session tickets
        assert len(opened) == 1, opened
        engine.close()
    finally:
        server.cleanup()


def test_driver_errors_are_translated_when_pymysql_also_stands_in_for_mysqldb(mariadb_server):
    """Django's MySQL backend on PyMySQL (``install_as_MySQLdb()``) imports PyMySQL's modules a
    second time as ``MySQLdb.*``, and a connection can then raise that copy's error classes:
    they are still EngineUnavailable (the example project's demo once leaked them)."""
    import subprocess
    import sys

    code = textwrap.dedent(f"""
        import pymysql
        pymysql.install_as_MySQLdb()
        import MySQLdb.connections, MySQLdb.err
        import ylock
        for url in ("mysql://u:p@127.0.0.1:1/db?connect_timeout=0.5",
                    "{url_as(mariadb_server, mariadb_server.user, 'wrong')}"):
            try:
                ylock.Lock(ylock.engine_from_url(url), "g", "n").try_lock(0)
            except ylock.EngineUnavailable as exc:
                print("translated", type(exc.__cause__).__module__)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("translated") == 2, done.stdout + done.stderr
