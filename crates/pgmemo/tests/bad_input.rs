//! pgmemo facing clients that do not follow the protocol, talked to with hand-written bytes on
//! a raw TCP socket: garbage and oversized startup packets, unsupported versions and requests,
//! invalid and oversized messages after login, truncated messages, silent clients, too many
//! clients, and Terminate. pgmemo must answer as PostgreSQL does (a FATAL error with the right
//! SQLSTATE, then close), never leak a server connection, and keep serving everyone else.

mod raw;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use testkit::{
    assert_eventually, eventually_some, pgmemo_config_for, spawn_pgmemo, unique, within,
    LocalPostgres, PgmemoInstance,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use wire::backend::{Authentication, BackendMessage, TransactionStatus};
use wire::startup::StartupMessage;
use wire::{frontend, ErrorResponse, Frame};

const USER: &str = "postgres";
const DB: &str = "test";
/// How long any single expected answer may take.
const ANSWER_DEADLINE: Duration = Duration::from_secs(10);
/// Upper bound for any single test; a hang fails instead of blocking the suite.
const TEST_DEADLINE: Duration = Duration::from_secs(60);

async fn pgmemo_with(change: impl FnOnce(&mut pgmemo::Config)) -> PgmemoInstance {
    let mut config = pgmemo_config_for(LocalPostgres::PORT);
    change(&mut config);
    spawn_pgmemo(config).await.expect("pgmemo starts")
}

async fn pgmemo() -> PgmemoInstance {
    pgmemo_with(|_| {}).await
}

/// A StartupMessage for protocol 3.`minor` with the given parameters.
fn startup(minor: u16, params: &[(&str, &str)]) -> Vec<u8> {
    let mut raw = StartupMessage::encode(params.iter().copied()).to_vec();
    raw[4..8].copy_from_slice(&((3u32 << 16) | u32::from(minor)).to_be_bytes());
    raw
}

fn login_params() -> Vec<(&'static str, &'static str)> {
    vec![("user", USER), ("database", DB)]
}

/// An 8-byte request packet (SSLRequest, GSSENCRequest) or any other bare protocol code.
fn request_code(code: u32) -> Vec<u8> {
    let mut raw = 8u32.to_be_bytes().to_vec();
    raw.extend_from_slice(&code.to_be_bytes());
    raw
}

const SSL_REQUEST: u32 = 80877103;
const GSSENC_REQUEST: u32 = 80877104;

/// A client socket speaking raw protocol bytes.
struct Raw {
    stream: TcpStream,
    buf: BytesMut,
}

impl Raw {
    async fn connect(addr: SocketAddr) -> Raw {
        let stream = TcpStream::connect(addr).await.expect("connect to pgmemo");
        stream.set_nodelay(true).unwrap();
        Raw {
            stream,
            buf: BytesMut::with_capacity(8192),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write to pgmemo");
    }

    /// Reads more bytes; 0 means the peer closed (a reset counts as closed).
    async fn fill(&mut self) -> usize {
        match tokio::time::timeout(ANSWER_DEADLINE, self.stream.read_buf(&mut self.buf)).await {
            Err(_) => panic!("no answer from pgmemo within {ANSWER_DEADLINE:?}"),
            Ok(Ok(n)) => n,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => 0,
            Ok(Err(e)) => panic!("read from pgmemo failed: {e}"),
        }
    }

    /// The next message, or `None` if the connection closed first.
    async fn recv(&mut self) -> Option<BackendMessage> {
        loop {
            if let Some(frame) = Frame::decode(&mut self.buf, 1 << 30).expect("valid framing") {
                return Some(BackendMessage::decode(frame).expect("valid backend message"));
            }
            if self.fill().await == 0 {
                assert!(self.buf.is_empty(), "connection closed mid-message");
                return None;
            }
        }
    }

    /// The next message, which must exist.
    async fn expect_message(&mut self) -> BackendMessage {
        self.recv()
            .await
            .expect("pgmemo closed the connection instead of answering")
    }

    /// The single-byte answer to SSLRequest/GSSENCRequest.
    async fn recv_byte(&mut self) -> u8 {
        while self.buf.is_empty() {
            assert!(self.fill().await > 0, "closed instead of answering");
        }
        let b = self.buf[0];
        let _ = self.buf.split_to(1);
        b
    }

    /// Asserts the connection is closed without any further message.
    async fn expect_closed(&mut self) {
        if let Some(m) = self.recv().await {
            panic!("expected the connection to close, got {m:?}");
        }
    }

    /// Asserts a FATAL ErrorResponse with `code` followed by the end of the connection.
    async fn expect_fatal(&mut self, code: &str) -> ErrorResponse {
        let e = match self.expect_message().await {
            BackendMessage::ErrorResponse(e) => e,
            other => panic!("expected FATAL {code}, got {other:?}"),
        };
        assert_eq!(e.severity, "FATAL", "{e}");
        assert_eq!(e.code, code, "{e}");
        self.expect_closed().await;
        e
    }

    /// Reads the rest of a successful login (after any NegotiateProtocolVersion): everything up
    /// to ReadyForQuery. Returns the messages received.
    async fn finish_login(&mut self) -> Vec<BackendMessage> {
        let mut got = Vec::new();
        loop {
            let m = self.expect_message().await;
            if let BackendMessage::ErrorResponse(e) = &m {
                panic!("login failed: {e}");
            }
            let done = matches!(m, BackendMessage::ReadyForQuery(_));
            got.push(m);
            if done {
                break;
            }
        }
        assert!(
            matches!(
                got.first(),
                Some(BackendMessage::Authentication(Authentication::Ok))
            ),
            "login starts with AuthenticationOk: {got:?}"
        );
        assert!(got
            .iter()
            .any(|m| matches!(m, BackendMessage::BackendKeyData(_))));
        assert!(matches!(
            got.last(),
            Some(BackendMessage::ReadyForQuery(TransactionStatus::Idle))
        ));
        got
    }

    /// Connects and logs in as `postgres` to `test` with protocol 3.0.
    async fn login(addr: SocketAddr) -> Raw {
        let mut raw = Raw::connect(addr).await;
        raw.send(&startup(0, &login_params())).await;
        raw.finish_login().await;
        raw
    }

    /// Runs a simple query; returns the first column of every DataRow (as text) and the final
    /// transaction status. Panics on an ErrorResponse.
    async fn query(&mut self, sql: &str) -> (Vec<Option<String>>, TransactionStatus) {
        self.send(&frontend::query(sql)).await;
        let mut values = Vec::new();
        loop {
            match self.expect_message().await {
                BackendMessage::ReadyForQuery(status) => return (values, status),
                BackendMessage::ErrorResponse(e) => panic!("query {sql:?} failed: {e}"),
                BackendMessage::DataRow(row) => values.push(first_column(row.body())),
                _ => {}
            }
        }
    }

    /// A one-value query's value.
    async fn query_value(&mut self, sql: &str) -> String {
        let (values, _) = self.query(sql).await;
        assert_eq!(values.len(), 1, "{sql}");
        values.into_iter().next().unwrap().expect("not NULL")
    }
}

/// Connects, sends `bytes` and asserts that pgmemo answers them with a FATAL error with `code`
/// and closes the connection; returns the error.
async fn fatal_after(addr: SocketAddr, bytes: &[u8], code: &str) -> ErrorResponse {
    let mut raw = Raw::connect(addr).await;
    raw.send(bytes).await;
    raw.expect_fatal(code).await
}

/// The first column of a DataRow body, as text.
fn first_column(body: &[u8]) -> Option<String> {
    let ncols = i16::from_be_bytes([body[0], body[1]]);
    assert!(ncols >= 1);
    let len = i32::from_be_bytes([body[2], body[3], body[4], body[5]]);
    (len >= 0).then(|| String::from_utf8(body[6..6 + len as usize].to_vec()).unwrap())
}

/// A tokio-postgres client through pgmemo can run a query: pgmemo still serves others.
async fn serves_others(pg: &PgmemoInstance) {
    let client = pg.client(USER, DB).await;
    let v: i32 = client.query_one("SELECT 7", &[]).await.unwrap().get(0);
    assert_eq!(v, 7);
}

/// Whether a backend with this PID still exists on the server.
async fn backend_alive(pid: i32) -> bool {
    let direct = LocalPostgres.client(USER, DB).await;
    direct
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
        == 1
}

#[tokio::test]
async fn garbage_instead_of_startup_packet() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo().await;
        let e = fatal_after(pg.addr(), b"GET / HTTP/1.1\r\n\r\n", "08P01").await;
        assert!(e.message.contains("startup packet"), "{e}");
        assert!(pg.stats().protocol_errors.load(Ordering::Relaxed) >= 1);
        serves_others(&pg).await;
    })
    .await
}

#[tokio::test]
async fn startup_packet_too_long() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo().await;
        // Claims 20000 bytes (PostgreSQL's limit is 10000); only the header is sent, so pgmemo
        // must refuse on the length alone rather than wait for (or buffer) the body.
        let mut packet = 20_000u32.to_be_bytes().to_vec();
        packet.extend_from_slice(&(3u32 << 16).to_be_bytes());
        let e = fatal_after(pg.addr(), &packet, "08P01").await;
        assert!(e.message.contains("length"), "{e}");

        // Lengths below the minimum are refused too.
        fatal_after(pg.addr(), &4u32.to_be_bytes(), "08P01").await;
        serves_others(&pg).await;
    })
    .await
}

#[tokio::test]
async fn protocol_2_is_refused() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo().await;
        let mut packet = startup(0, &login_params());
        packet[4..8].copy_from_slice(&(2u32 << 16).to_be_bytes());
        let e = fatal_after(pg.addr(), &packet, "0A000").await;
        assert!(
            e.message.contains("unsupported frontend protocol 2.0"),
            "{e}"
        );
    })
    .await
}

#[tokio::test]
async fn newer_minor_version_and_protocol_options_are_negotiated() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo().await;
        let mut raw = Raw::connect(pg.addr()).await;
        let mut params = login_params();
        params.push(("_pq_.foo", "bar"));
        raw.send(&startup(5, &params)).await;
        match raw.expect_message().await {
            BackendMessage::NegotiateProtocolVersion {
                version,
                unrecognized,
            } => {
                // PostgreSQL's bytes: its newest version whole (3.0), not a bare minor.
                assert_eq!(version, 0x0003_0000);
                assert_eq!(unrecognized, vec!["_pq_.foo".to_owned()]);
            }
            other => panic!("expected NegotiateProtocolVersion, got {other:?}"),
        }
        let login = raw.finish_login().await;
        assert!(login.iter().any(|m| matches!(
            m,
            BackendMessage::ParameterStatus { name, .. } if name == "server_version"
        )));
        assert_eq!(raw.query_value("SELECT 1 + 1").await, "2");

        // 3.0 without protocol options gets no NegotiateProtocolVersion.
        Raw::login(pg.addr()).await;
    })
    .await
}

#[tokio::test]
async fn ssl_request_without_tls_is_declined_then_startup_works() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo().await;
        let mut raw = Raw::connect(pg.addr()).await;
        raw.send(&request_code(SSL_REQUEST)).await;
        assert_eq!(raw.recv_byte().await, b'N');
        raw.send(&startup(0, &login_params())).await;
        raw.finish_login().await;
        assert_eq!(raw.query_value("SELECT 'after ssl'").await, "after ssl");
    })
    .await
}

#[tokio::test]
async fn gssenc_request_is_declined_then_startup_works() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo().await;
        let mut raw = Raw::connect(pg.addr()).await;
        raw.send(&request_code(GSSENC_REQUEST)).await;
        assert_eq!(raw.recv_byte().await, b'N');
        // libpq then tries SSL, then the plain startup.
        raw.send(&request_code(SSL_REQUEST)).await;
        assert_eq!(raw.recv_byte().await, b'N');
        raw.send(&startup(0, &login_params())).await;
        raw.finish_login().await;
        assert_eq!(raw.query_value("SELECT 'after gss'").await, "after gss");
    })
    .await
}

#[tokio::test]
async fn replication_connections_are_refused() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo().await;
        for value in ["database", "true"] {
            let mut params = login_params();
            params.push(("replication", value));
            let e = fatal_after(pg.addr(), &startup(0, &params), "0A000").await;
            assert!(e.message.contains("replication"), "{e}");
        }
        // replication=false is an ordinary session.
        let mut raw = Raw::connect(pg.addr()).await;
        let mut params = login_params();
        params.push(("replication", "false"));
        raw.send(&startup(0, &params)).await;
        raw.finish_login().await;
    })
    .await
}

#[tokio::test]
async fn missing_user_is_refused() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo().await;
        let e = fatal_after(pg.addr(), &startup(0, &[("database", DB)]), "28000").await;
        assert!(e.message.contains("user"), "{e}");

        let empty_user = startup(0, &[("user", ""), ("database", DB)]);
        fatal_after(pg.addr(), &empty_user, "28000").await;
    })
    .await
}

#[tokio::test]
async fn message_length_below_four_after_login() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo().await;
        let mut raw = Raw::login(pg.addr()).await;
        assert_eq!(raw.query_value("SELECT 'ok'").await, "ok");
        raw.send(b"Q\0\0\0\x02").await;
        let e = raw.expect_fatal("08P01").await;
        assert!(e.message.contains("length"), "{e}");
        assert!(pg.stats().protocol_errors.load(Ordering::Relaxed) >= 1);
        serves_others(&pg).await;
    })
    .await
}

#[tokio::test]
async fn message_longer_than_max_message_size() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo_with(|c| c.max_message_size = pgmemo::config::ByteSize(1 << 20)).await;
        let mut raw = Raw::login(pg.addr()).await;
        // Just below the limit is fine.
        let sql = format!("SELECT length('{}')", "x".repeat((1 << 20) - 100));
        assert_eq!(raw.query_value(&sql).await, ((1 << 20) - 100).to_string());

        // A Query header claiming 2 MB: refused on the header alone.
        let mut header = vec![b'Q'];
        header.extend_from_slice(&(2u32 << 20).to_be_bytes());
        raw.send(&header).await;
        let e = raw.expect_fatal("54000").await;
        assert!(e.message.contains("max_message_size"), "{e}");
        serves_others(&pg).await;
    })
    .await
}

/// A CopyDone sent outside COPY is ignored by the server, and must not make pgmemo take a
/// request still running for answered: the server would go back to the pool with that
/// answer (and the reset's) still to come, and the next client would read them.
#[tokio::test]
async fn a_stray_copy_done_does_not_hand_a_busy_server_to_the_next_client() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo_with(|c| {
            c.pool_size = 1;
            c.cache = pgmemo::config::Switch::Off;
        })
        .await;
        for _ in 0..3 {
            let mut raw = Raw::login(pg.addr()).await;
            let batch = |sql: &str| {
                [
                    raw::parse(sql, &[]),
                    raw::bind(&[]),
                    raw::execute(),
                    raw::sync(),
                    raw::copy_done(),
                ]
                .concat()
            };
            // A large answer, so that what follows it arrives in the same reads.
            raw.send(&batch(
                "SELECT repeat('x', 200000) FROM generate_series(1, 2)",
            ))
            .await;
            raw.send(&batch("SELECT 'forged'::text")).await;
            drop(raw);
            let c = pg.client(USER, DB).await;
            let row = c.query_one("SELECT 42::int", &[]).await.unwrap();
            assert_eq!(row.get::<_, i32>(0), 42);
            assert_eq!(
                c.query_one("SELECT 'next'::text", &[])
                    .await
                    .unwrap()
                    .get::<_, String>(0),
                "next"
            );
        }
    })
    .await
}

#[tokio::test]
async fn truncated_message_then_disconnect_does_not_leak_the_server_connection() {
    within(TEST_DEADLINE, async {
        // The pass-through relay forwards a message's bytes as they arrive, so the server holds
        // half a message when the client vanishes. (With the cache on, requests are read whole
        // before they are routed, and the server never sees the partial one.)
        let pg = pgmemo_with(|c| {
            c.pool_size = 1;
            c.query_wait_timeout = pgmemo::config::Seconds(Duration::from_secs(2));
            c.cache = pgmemo::config::Switch::Off;
        })
        .await;
        let mut raw = Raw::login(pg.addr()).await;
        let pid: i32 = raw
            .query_value("SELECT pg_backend_pid()")
            .await
            .parse()
            .unwrap();
        // Header says 100 bytes, 6 follow, then the client vanishes.
        raw.send(b"Q\0\0\0\x64SELECT").await;
        drop(raw);

        // The only pooled connection comes back (or is replaced): a new client is served.
        let new_pid = eventually_some(Duration::from_secs(15), || {
            let pg = &pg;
            async move {
                let c = pg.try_client(USER, DB).await.ok()?;
                let row = c.query_one("SELECT pg_backend_pid()", &[]).await.ok()?;
                Some(row.get::<_, i32>(0))
            }
        })
        .await
        .expect("a new client is served after the bad one left");
        // The half-written server connection was not handed to anyone: it was closed.
        assert_ne!(
            new_pid, pid,
            "a connection with a partial message was reused"
        );
        assert_eventually(
            Duration::from_secs(10),
            "the old server backend exits",
            || async move { !backend_alive(pid).await },
        )
        .await;
        assert!(pg.stats().servers_closed_dirty.load(Ordering::Relaxed) >= 1);
    })
    .await
}

#[tokio::test]
async fn silent_client_is_closed_after_login_timeout() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo_with(|c| {
            c.client_login_timeout = pgmemo::config::Seconds(Duration::from_millis(300));
        })
        .await;
        let started = Instant::now();
        let mut silent = Raw::connect(pg.addr()).await;
        // A client that sent half a startup packet is just as silent.
        let mut half = Raw::connect(pg.addr()).await;
        half.send(&startup(0, &login_params())[..6]).await;

        // Others are served while the silent ones wait.
        serves_others(&pg).await;

        silent.expect_closed().await;
        let elapsed = started.elapsed();
        assert!(
            elapsed >= Duration::from_millis(250),
            "closed before the timeout: {elapsed:?}"
        );
        assert!(
            elapsed < Duration::from_secs(3),
            "closed too late: {elapsed:?}"
        );
        half.expect_closed().await;
        assert!(started.elapsed() < Duration::from_secs(3));
        serves_others(&pg).await;
    })
    .await
}

/// A cluster that asks role `pw_user` (password `pw-secret`) for its password.
async fn password_cluster() -> testkit::TempPostgres {
    let cluster = testkit::TempPostgres::builder()
        .hba("host all pw_user 127.0.0.1/32 md5")
        .no_default_trust()
        .start()
        .await
        .expect("cluster starts");
    cluster
        .psql("CREATE ROLE pw_user LOGIN PASSWORD 'pw-secret'")
        .await;
    cluster
}

/// Logs `pw_user` of [`password_cluster`] in through `memo` and runs a query.
async fn password_login(
    memo: &PgmemoInstance,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let url = format!(
        "postgres://pw_user:pw-secret@127.0.0.1:{}/postgres",
        memo.addr().port()
    );
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    client.simple_query("SELECT 1").await?;
    Ok(client)
}

/// With `auth_type = upstream` a client that never answers the server's password request
/// holds a server connection: after `client_login_timeout` it gets 08P01 and is closed.
#[tokio::test]
async fn a_client_silent_at_the_password_request_is_closed_after_login_timeout() {
    within(TEST_DEADLINE, async {
        let cluster = password_cluster().await;
        let mut config = pgmemo_config_for(cluster.port());
        config.client_login_timeout = pgmemo::config::Seconds(Duration::from_millis(300));
        config.query_wait_timeout = pgmemo::config::Seconds(Duration::from_secs(10));
        config.pool_size = 1;
        let memo = spawn_pgmemo(config).await.expect("pgmemo starts");
        let started = Instant::now();
        let mut silent = Raw::connect(memo.addr()).await;
        silent
            .send(&startup(
                0,
                &[("user", "pw_user"), ("database", "postgres")],
            ))
            .await;
        // (SCRAM: the password is stored as a SCRAM verifier, which md5 in pg_hba upgrades.)
        let request = silent.expect_message().await;
        assert!(
            matches!(
                request,
                BackendMessage::Authentication(
                    Authentication::Md5Password { .. } | Authentication::Sasl { .. }
                )
            ),
            "the server's password request is relayed: {request:?}"
        );
        match silent.expect_message().await {
            BackendMessage::ErrorResponse(e) => assert_eq!(e.code, "08P01", "{e:?}"),
            other => panic!("expected the login timeout's error, got {other:?}"),
        }
        silent.expect_closed().await;
        let elapsed = started.elapsed();
        assert!(
            elapsed < Duration::from_secs(3),
            "closed too late: {elapsed:?}"
        );
        password_login(&memo)
            .await
            .expect("the next client gets the pool place");
    })
    .await
}

/// With pgmemo checking passwords itself (SCRAM against the userlist), startup and
/// authentication share one `client_login_timeout` from connect: a client silent at the
/// password request, and one that spent most of that time trickling its startup packet, are
/// both closed with 08P01 when it runs out, not a `query_wait_timeout` (which only bounds the
/// wait for a pool place) or a second `client_login_timeout` later.
#[tokio::test]
async fn a_client_stalled_at_a_local_password_request_is_closed_at_its_login_deadline() {
    within(TEST_DEADLINE, async {
        let dir = tempfile::tempdir().expect("temp dir for the userlist");
        let userlist = dir.path().join("userlist.txt");
        std::fs::write(&userlist, format!("\"{USER}\" \"local-pw\"\n")).unwrap();
        let login_timeout = Duration::from_secs(2);
        let pg = pgmemo_with(|c| {
            c.auth_type = pgmemo::config::AuthType::ScramSha256;
            c.auth_file = Some(userlist);
            c.client_login_timeout = pgmemo::config::Seconds(login_timeout);
            c.query_wait_timeout = pgmemo::config::Seconds(Duration::from_secs(30));
        })
        .await;
        let closed_after = |trickle: bool| {
            let addr = pg.addr();
            async move {
                let started = Instant::now();
                let mut client = Raw::connect(addr).await;
                let packet = startup(0, &login_params());
                if trickle {
                    // Three quarters of the login time go to the startup packet, a piece at
                    // a time (the client's behaviour under test, not a wait for pgmemo).
                    for (i, piece) in packet.chunks(packet.len().div_ceil(4)).enumerate() {
                        if i > 0 {
                            tokio::time::sleep(login_timeout / 4).await;
                        }
                        client.send(piece).await;
                    }
                } else {
                    client.send(&packet).await;
                }
                let request = client.expect_message().await;
                assert!(
                    matches!(
                        request,
                        BackendMessage::Authentication(Authentication::Sasl { .. })
                    ),
                    "pgmemo asks for the password itself: {request:?}"
                );
                client.expect_fatal("08P01").await;
                started.elapsed()
            }
        };
        let (silent, trickled) = tokio::join!(closed_after(false), closed_after(true));
        for (what, elapsed) in [("silent", silent), ("trickled", trickled)] {
            assert!(
                elapsed >= login_timeout - Duration::from_millis(50),
                "{what}: closed before client_login_timeout: {elapsed:?}"
            );
            // A second client_login_timeout for the authentication would close the trickling
            // client after 3.5 s.
            assert!(
                elapsed < login_timeout + Duration::from_millis(1200),
                "{what}: closed {elapsed:?} after connecting, past client_login_timeout"
            );
        }
        // A client that answers logs in.
        let url = pg.url_with_password(USER, "local-pw", DB);
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("the password of the userlist logs in");
        tokio::spawn(conn);
        client.simple_query("SELECT 1").await.unwrap();
    })
    .await
}

/// A client stalled at the password request (`auth_type = upstream`) holds no place of the
/// pool: with a pool of one, in both pool modes, another client logs in and queries while the
/// stalled one waits out its long `client_login_timeout`.
#[tokio::test]
async fn a_client_stalled_at_the_password_request_holds_no_pool_place() {
    within(TEST_DEADLINE, async {
        let cluster = password_cluster().await;
        for mode in POOL_MODES {
            let mut config = pgmemo_config_for(cluster.port());
            config.client_login_timeout = pgmemo::config::Seconds(Duration::from_secs(120));
            config.query_wait_timeout = pgmemo::config::Seconds(Duration::from_secs(120));
            config.pool_size = 1;
            config.pool_mode = mode;
            let memo = spawn_pgmemo(config).await.expect("pgmemo starts");
            let mut stalled = Raw::connect(memo.addr()).await;
            stalled
                .send(&startup(
                    0,
                    &[("user", "pw_user"), ("database", "postgres")],
                ))
                .await;
            let request = stalled.expect_message().await;
            assert!(
                matches!(request, BackendMessage::Authentication(_)),
                "{mode:?}: the server's password request is relayed: {request:?}"
            );
            let client = tokio::time::timeout(Duration::from_secs(20), password_login(&memo))
                .await
                .unwrap_or_else(|_| panic!("{mode:?}: the stalled login holds the pool's place"))
                .unwrap_or_else(|e| panic!("{mode:?}: {e}"));
            client.simple_query("SELECT 2").await.unwrap();
            drop(stalled);
        }
    })
    .await
}

/// A client queued for a pool place may send its first queries ahead, behind its startup
/// packet and while it waits: pgmemo watches a queued client for its departure, but what it
/// reads meanwhile stays for the session, which answers every query once the place is free.
#[tokio::test]
async fn queries_sent_ahead_by_a_queued_client_are_answered() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo_with(|c| c.pool_size = 1).await;
        let mut holder = Raw::login(pg.addr()).await;
        assert_eq!(holder.query_value("SELECT 1").await, "1");
        let pool = pg.handle().shared().pools.all()[0].clone();

        let mut queued = Raw::connect(pg.addr()).await;
        let mut ahead = startup(0, &login_params());
        ahead.extend_from_slice(&frontend::query("SELECT 41"));
        queued.send(&ahead).await;
        assert_eventually(ANSWER_DEADLINE, "the client is queued", || {
            let pool = &pool;
            async move { pool.waiting() == 1 }
        })
        .await;
        queued.send(&frontend::query("SELECT 42")).await;

        holder.send(&frontend::terminate()).await;
        holder.expect_closed().await;
        queued.finish_login().await;
        for want in ["41", "42"] {
            let mut values = Vec::new();
            loop {
                match queued.expect_message().await {
                    BackendMessage::DataRow(row) => values.push(first_column(row.body())),
                    BackendMessage::ErrorResponse(e) => panic!("SELECT {want} failed: {e}"),
                    BackendMessage::ReadyForQuery(_) => break,
                    _ => {}
                }
            }
            assert_eq!(values, vec![Some(want.to_owned())]);
        }
    })
    .await
}

#[tokio::test]
async fn max_client_conn_refuses_the_third_client() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo_with(|c| c.max_client_conn = 2).await;
        let first = pg.client(USER, DB).await;
        let mut second = Raw::login(pg.addr()).await;

        let e = fatal_after(pg.addr(), &startup(0, &login_params()), "53300").await;
        assert!(e.message.contains("too many clients"), "{e}");
        assert!(pg.stats().clients_rejected.load(Ordering::Relaxed) >= 1);

        // The two admitted clients are unaffected.
        let v: i32 = first.query_one("SELECT 1", &[]).await.unwrap().get(0);
        assert_eq!(v, 1);
        assert_eq!(second.query_value("SELECT 2").await, "2");

        // Once one leaves, there is room again.
        second.send(&frontend::terminate()).await;
        second.expect_closed().await;
        let again = eventually_some(Duration::from_secs(10), || {
            let pg = &pg;
            async move { pg.try_client(USER, DB).await.ok() }
        })
        .await
        .expect("a client is admitted after another left");
        let v: i32 = again.query_one("SELECT 3", &[]).await.unwrap().get(0);
        assert_eq!(v, 3);
    })
    .await
}

#[tokio::test]
async fn terminate_mid_session_closes_cleanly() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo_with(|c| c.pool_size = 1).await;
        let table = unique("pm_term");
        let mut raw = Raw::login(pg.addr()).await;
        let pid = raw.query_value("SELECT pg_backend_pid()").await;
        let (_, status) = raw
            .query(&format!("BEGIN; CREATE TABLE {table} (x int)"))
            .await;
        assert_eq!(status, TransactionStatus::InTransaction);
        raw.send(&frontend::terminate()).await;
        // No error, no further message: just the end of the connection.
        raw.expect_closed().await;

        // The server connection was rolled back and reset, then handed to the next client.
        let mut next = eventually_some(Duration::from_secs(10), || {
            let addr = pg.addr();
            async move {
                let mut r = Raw::connect(addr).await;
                r.send(&startup(0, &login_params())).await;
                match r.recv().await? {
                    BackendMessage::Authentication(Authentication::Ok) => {}
                    _ => return None,
                }
                loop {
                    match r.recv().await? {
                        BackendMessage::ReadyForQuery(TransactionStatus::Idle) => return Some(r),
                        BackendMessage::ErrorResponse(_) | BackendMessage::ReadyForQuery(_) => {
                            return None
                        }
                        _ => {}
                    }
                }
            }
        })
        .await
        .expect("the next client logs in");
        assert_eq!(
            next.query_value("SELECT pg_backend_pid()").await,
            pid,
            "a cleanly ended session's connection is reused"
        );
        let (exists, status) = next
            .query(&format!("SELECT to_regclass('{table}') IS NOT NULL"))
            .await;
        assert_eq!(
            exists,
            vec![Some("f".to_owned())],
            "the open transaction was committed"
        );
        assert_eq!(status, TransactionStatus::Idle);
        next.send(&frontend::terminate()).await;
        next.expect_closed().await;
        assert_eq!(pg.stats().servers_closed_dirty.load(Ordering::Relaxed), 0);
    })
    .await
}

#[tokio::test]
async fn malformed_startup_packets() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo().await;
        // Parameters without the final terminator.
        let mut packet = 14u32.to_be_bytes().to_vec();
        packet.extend_from_slice(&(3u32 << 16).to_be_bytes());
        packet.extend_from_slice(b"user\0a");
        fatal_after(pg.addr(), &packet, "08P01").await;

        // A CancelRequest code with the wrong length.
        let mut packet = 12u32.to_be_bytes().to_vec();
        packet.extend_from_slice(&80877102u32.to_be_bytes());
        packet.extend_from_slice(&[0, 0, 0, 1]);
        fatal_after(pg.addr(), &packet, "08P01").await;
        serves_others(&pg).await;
    })
    .await
}

#[tokio::test]
async fn cancel_request_with_unknown_key_is_closed_silently() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo().await;
        let mut raw = Raw::connect(pg.addr()).await;
        let mut packet = 16u32.to_be_bytes().to_vec();
        packet.extend_from_slice(&80877102u32.to_be_bytes());
        packet.extend_from_slice(&0x1234_5678u32.to_be_bytes());
        packet.extend_from_slice(&0x0bad_cafeu32.to_be_bytes());
        raw.send(&packet).await;
        // PostgreSQL never answers a CancelRequest; it just closes.
        raw.expect_closed().await;
        assert_eq!(pg.stats().cancel_requests.load(Ordering::Relaxed), 1);
        serves_others(&pg).await;
    })
    .await
}

#[tokio::test]
async fn query_sent_together_with_the_startup_packet() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo().await;
        let mut raw = Raw::connect(pg.addr()).await;
        let mut bytes = startup(0, &login_params());
        bytes.extend_from_slice(&frontend::query("SELECT 'eager'"));
        raw.send(&bytes).await;
        raw.finish_login().await;
        let mut value = None;
        loop {
            match raw.expect_message().await {
                BackendMessage::ReadyForQuery(TransactionStatus::Idle) => break,
                BackendMessage::ErrorResponse(e) => panic!("{e}"),
                BackendMessage::DataRow(row) => value = first_column(row.body()),
                _ => {}
            }
        }
        assert_eq!(value.as_deref(), Some("eager"));
    })
    .await
}

#[tokio::test]
async fn unknown_message_type_after_login() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo_with(|c| {
            c.pool_size = 1;
            c.query_wait_timeout = pgmemo::config::Seconds(Duration::from_secs(2));
        })
        .await;
        let mut raw = Raw::login(pg.addr()).await;
        raw.send(b"\x01\0\0\0\x04").await;
        // PostgreSQL's own answer, relayed.
        let e = raw.expect_fatal("08P01").await;
        assert!(e.message.contains("invalid frontend message type"), "{e}");

        // The broken server connection is not handed out; the pool has room for a new one.
        let v = eventually_some(Duration::from_secs(15), || {
            let pg = &pg;
            async move {
                let c = pg.try_client(USER, DB).await.ok()?;
                let row = c.query_one("SELECT 5", &[]).await.ok()?;
                Some(row.get::<_, i32>(0))
            }
        })
        .await;
        assert_eq!(v, Some(5));
    })
    .await
}

/// pgmemo in either pool mode with the cache on and storing every cacheable miss.
async fn caching_pgmemo(mode: pgmemo::config::PoolMode) -> PgmemoInstance {
    pgmemo_with(|c| {
        c.pool_mode = mode;
        c.cache = pgmemo::config::Switch::On;
        c.cache_admission = pgmemo::config::CacheAdmission::Always;
        c.invalidation = pgmemo::config::Invalidation::Proxy;
    })
    .await
}

const POOL_MODES: [pgmemo::config::PoolMode; 2] = [
    pgmemo::config::PoolMode::Session,
    pgmemo::config::PoolMode::Transaction,
];

/// A Query whose text is not a string (no terminator, or no body at all) gets PostgreSQL's
/// own answer, an ERROR "invalid string in message" after which the session goes on. It is
/// not a cache lookup of the bytes it does have: `SELECT 12` cut before its terminator is
/// not `SELECT 1`.
#[tokio::test]
async fn a_query_that_is_not_a_string_gets_postgresqls_answer() {
    within(TEST_DEADLINE, async {
        for mode in POOL_MODES {
            let pg = caching_pgmemo(mode).await;
            let mut raw = Raw::login(pg.addr()).await;
            for _ in 0..3 {
                assert_eq!(raw.query_value("SELECT 1").await, "1", "{mode:?}");
            }
            for bad in [&b"Q\0\0\0\x0dSELECT 12"[..], b"Q\0\0\0\x04"] {
                raw.send(bad).await;
                match raw.expect_message().await {
                    BackendMessage::ErrorResponse(e) => {
                        assert_eq!(e.severity, "ERROR", "{mode:?} {bad:?}: {e}");
                        assert_eq!(e.code, "08P01", "{mode:?} {bad:?}: {e}");
                        assert!(e.message.contains("invalid string"), "{e}");
                    }
                    other => panic!("{mode:?} {bad:?}: expected an error, got {other:?}"),
                }
                assert!(matches!(
                    raw.expect_message().await,
                    BackendMessage::ReadyForQuery(TransactionStatus::Idle)
                ));
                assert_eq!(raw.query_value("SELECT 1").await, "1", "{mode:?}");
            }
            serves_others(&pg).await;
        }
    })
    .await
}

/// A malformed message header behind a well-formed one in an extended-protocol batch ends
/// the session with a protocol error at once, in both pool modes with the cache on: pgmemo
/// neither waits for the rest of a batch that can never be whole nor keeps what follows.
#[tokio::test]
async fn a_malformed_header_inside_a_batch_is_reported_at_once() {
    within(TEST_DEADLINE, async {
        for mode in POOL_MODES {
            for bad in [&b"S\0\0\0\0"[..], b"E\xff\xff\xff\xff"] {
                let pg = caching_pgmemo(mode).await;
                let mut raw = Raw::login(pg.addr()).await;
                let mut batch = raw::parse("SELECT 1", &[]);
                batch.extend_from_slice(&raw::bind(&[]));
                batch.extend_from_slice(bad);
                batch.extend_from_slice(&[b'x'; 64]);
                raw.send(&batch).await;
                let mut error = None;
                while let Some(m) = raw.recv().await {
                    if let BackendMessage::ErrorResponse(e) = m {
                        error = Some(e);
                    }
                }
                let e = error.unwrap_or_else(|| panic!("{mode:?} {bad:?}: no error"));
                assert_eq!(e.code, "08P01", "{mode:?} {bad:?}: {e}");
                serves_others(&pg).await;
            }
        }
    })
    .await
}

/// Logins with made-up role names each make a pool before PostgreSQL refuses them; those
/// pools are forgotten once nobody uses them, so such logins cannot grow pgmemo's pools (and
/// SHOW POOLS, and the metrics) without end.
#[tokio::test]
async fn pools_of_failed_logins_are_forgotten() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo().await;
        for i in 0..20 {
            let refused = pg.try_client(&format!("nobody_{i}"), DB).await;
            assert!(refused.is_err(), "nobody_{i} logged in");
        }
        assert_eventually(ANSWER_DEADLINE, "the pools are forgotten", || async {
            pg.handle().shared().pools.all().is_empty()
        })
        .await;
        serves_others(&pg).await;
    })
    .await
}

/// A Query message holding `text` as raw bytes (any encoding).
fn raw_query(text: &[u8]) -> Vec<u8> {
    let mut m = vec![b'Q'];
    m.extend_from_slice(&((text.len() + 5) as u32).to_be_bytes());
    m.extend_from_slice(text);
    m.push(0);
    m
}

/// The first column of a one-row query sent as raw bytes, as raw bytes.
async fn latin1_value(raw: &mut Raw, text: &[u8]) -> Option<Vec<u8>> {
    raw.send(&raw_query(text)).await;
    let mut value = None;
    loop {
        match raw.expect_message().await {
            BackendMessage::DataRow(row) => {
                let body = row.body();
                let len = i32::from_be_bytes([body[2], body[3], body[4], body[5]]);
                value = Some(body[6..6 + len as usize].to_vec());
            }
            BackendMessage::ErrorResponse(e) => panic!("{e}"),
            BackendMessage::ReadyForQuery(_) => return value,
            _ => {}
        }
    }
}

/// Under a client_encoding other than UTF-8 a query text is not UTF-8, and its result is not
/// stored under a lossy spelling of it that other texts share: a LATIN1 client asking for
/// `caf\xe9` and then for the bytes of U+FFFD gets each its own answer.
#[tokio::test]
async fn texts_that_are_not_utf8_never_share_a_cached_result() {
    within(TEST_DEADLINE, async {
        let pg = pgmemo_with(|c| {
            c.cache = pgmemo::config::Switch::On;
            c.cache_admission = pgmemo::config::CacheAdmission::Always;
            c.invalidation = pgmemo::config::Invalidation::Proxy;
        })
        .await;
        let mut raw = Raw::connect(pg.addr()).await;
        let mut params = login_params();
        params.push(("client_encoding", "LATIN1"));
        raw.send(&startup(0, &params)).await;
        raw.finish_login().await;
        for _ in 0..3 {
            assert_eq!(
                latin1_value(&mut raw, b"SELECT 'caf\xe9'").await.as_deref(),
                Some(&b"caf\xe9"[..])
            );
        }
        // The UTF-8 bytes of U+FFFD, read as LATIN1.
        assert_eq!(
            latin1_value(&mut raw, b"SELECT 'caf\xef\xbf\xbd'")
                .await
                .as_deref(),
            Some(&b"caf\xef\xbf\xbd"[..])
        );
    })
    .await
}
