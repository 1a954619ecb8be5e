//! From a StartupMessage to an authenticated client holding a server connection: resolve where
//! the client's database lives (`[databases]` mapping or pass-through), authenticate (relayed
//! or local), and take a connection from the pool or open one.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use wire::backend;
use wire::startup::StartupMessage;

use super::auth::{authenticate_locally, relay_upstream_auth};
use super::{ClientConn, ClientError, LoginDeadline};
use crate::config::{AuthType, Config, PoolMode};
use crate::pool::{
    Lease, Pool, PoolKey, PoolSettings, ReleaseState, ServerConn, ServerCredential, ServerError,
    Trust,
};
use crate::shared::Shared;
use crate::stats::Stats;

/// Where and as whom a client's session runs on the server.
#[derive(Debug, Clone)]
pub struct Route {
    pub key: PoolKey,
    /// The name the client used for its database.
    pub client_database: String,
    /// Password from a `[databases]` entry.
    pub password: Option<String>,
    /// The StartupMessage parameters pgmemo sends to the server.
    pub server_params: Vec<(String, String)>,
    /// Hash of `server_params`: pooled connections are shared only between equal startups.
    pub fingerprint: u64,
    /// Transaction pooling: the client's other startup parameters, which become session
    /// settings replayed on whichever server connection it uses (servers are opened with
    /// user and database only, so that every client of the pool can share them).
    pub client_params: Vec<(String, String)>,
    /// What pgmemo logs in to the server with when it opens a connection on its own (set by
    /// [`login`]).
    pub credential: ServerCredential,
}

impl Route {
    /// Applies the `[databases]` mapping to a client's startup parameters.
    pub fn resolve(config: &Config, startup: &StartupMessage) -> Route {
        let user = startup.param("user").unwrap_or_default().to_owned();
        let client_database = startup
            .param("database")
            .filter(|d| !d.is_empty())
            .unwrap_or(&user)
            .to_owned();
        let mapping = config.databases.get(&client_database);
        let host = mapping
            .and_then(|m| m.host.clone())
            .unwrap_or_else(|| config.upstream.host.clone());
        let port = mapping.and_then(|m| m.port).unwrap_or(config.upstream.port);
        let database = mapping
            .and_then(|m| m.dbname.clone())
            .unwrap_or_else(|| client_database.clone());
        let server_user = mapping.and_then(|m| m.user.clone()).unwrap_or(user);
        let mut server_params = vec![
            ("user".to_owned(), server_user.clone()),
            ("database".to_owned(), database.clone()),
        ];
        let others = startup
            .params
            .iter()
            .filter(|(k, _)| k != "user" && k != "database" && !k.starts_with("_pq_."))
            .cloned();
        let mut client_params = Vec::new();
        if config.pool_mode == PoolMode::Transaction {
            client_params.extend(others);
        } else {
            server_params.extend(others);
        }
        let mut h = DefaultHasher::new();
        server_params.hash(&mut h);
        Route {
            key: PoolKey {
                host,
                port,
                database,
                user: server_user,
                alias: client_database.clone(),
            },
            client_database,
            password: mapping.and_then(|m| m.password.clone()),
            server_params,
            fingerprint: h.finish(),
            client_params,
            credential: ServerCredential::None,
        }
    }
}

/// The pool settings in force now.
pub fn pool_settings(config: &Config) -> PoolSettings {
    PoolSettings {
        server_lifetime: config.server_lifetime.0,
        server_idle_timeout: config.server_idle_timeout.0,
        server_check_delay: config.server_check_delay.0,
        server_check_query: config.server_check_query.clone(),
        server_check_timeout: config.server_connect_timeout.0,
        server_reset_query: config.server_reset_query.clone(),
    }
}

/// Gives back a server connection lent at login that no client request used (a client gone
/// before its first request). In transaction pooling
/// pgmemo tracks what the server holds (its prepared statements, its settings), so the
/// connection goes straight back to its pool: the reset query (`DISCARD ALL`) would drop
/// what the tracking says is there. In session pooling it is reset as after any session.
pub fn give_back_unused(lease: Lease, server: Box<ServerConn>, config: &Config) {
    if config.pool_mode == PoolMode::Transaction {
        lease.return_idle(server, true);
    } else {
        lease.release(
            server,
            ReleaseState::Boundary(backend::TransactionStatus::Idle),
            pool_settings(config),
        );
    }
}

/// Authenticates the client (by `deadline`) and lends it a server connection (after waiting
/// up to `query_wait_timeout` for a place, which does not count against the deadline). On
/// success the client has received AuthenticationOk; the caller sends ParameterStatus,
/// BackendKeyData and ReadyForQuery.
pub async fn login(
    client: &mut ClientConn,
    shared: &Arc<Shared>,
    startup: &StartupMessage,
    mut deadline: LoginDeadline,
) -> Result<(Route, Lease, Box<ServerConn>), ClientError> {
    let generation = shared.config_generation();
    let config = shared.config();
    let mut route = Route::resolve(&config, startup);
    let pool = shared.pools.get(
        &route.key,
        config.pool_size_for(&route.client_database, &route.key.user),
        generation,
    );
    let wait = config.query_wait_timeout.0;
    let mut probe = None;
    if config.auth_type == AuthType::Upstream {
        route.credential = upstream_credential(&config, &route, shared);
        loop {
            match pool.trust.get() {
                Trust::Trusted => {
                    let served = deadline
                        .not_counting(trusted_login(client, shared, &pool, &route, wait))
                        .await?;
                    if let Some((lease, conn)) = served {
                        deadline
                            .bound(client.send(&backend::authentication_ok()))
                            .await?;
                        return Ok((route, lease, conn));
                    }
                    // The server did not let pgmemo in without a password (or is not
                    // reachable): a relayed exchange finds out.
                    pool.trust.set(Trust::Unknown);
                }
                Trust::Asks => break,
                Trust::Unknown => {
                    probe = pool.trust.probe();
                    if probe.is_some() {
                        break;
                    }
                }
                Trust::Probing => {
                    deadline
                        .bound(async {
                            pool.trust.probed().await;
                            Ok(())
                        })
                        .await?
                }
            }
        }
    }
    let on_asked = || pool.trust.set(Trust::Asks);
    let accepted = authenticate(
        client,
        shared,
        &config,
        route,
        startup,
        &mut deadline,
        &on_asked,
    )
    .await?;
    let route = accepted.route;
    if let Some((conn, asked)) = accepted.relayed {
        pool.trust
            .set(if asked { Trust::Asks } else { Trust::Trusted });
        drop(probe);
        // Authenticated: the connection joins the pool once it has a place.
        let mut lease = match acquire(client, &pool, wait, shared).await {
            Ok(lease) => lease,
            Err(e) => {
                tokio::spawn(conn.close());
                return Err(e);
            }
        };
        lease.reserve_new();
        return Ok((route, lease, conn));
    }
    let (lease, conn) = serve_from_pool(client, shared, &pool, &route, wait).await?;
    Ok((route, lease, conn?))
}

/// Authenticates the client as [`login`] does but takes no place in any pool: the admin
/// console's login must work while the pool it would share with the workload is full
/// (exactly when an operator needs `SHOW POOLS`). Returns the connection a relayed exchange
/// ran on (`auth_type = upstream`), which the caller closes when done.
pub async fn login_unpooled(
    client: &mut ClientConn,
    shared: &Arc<Shared>,
    startup: &StartupMessage,
    mut deadline: LoginDeadline,
) -> Result<(Route, Option<Box<ServerConn>>), ClientError> {
    let config = shared.config();
    let route = Route::resolve(&config, startup);
    let accepted = authenticate(
        client,
        shared,
        &config,
        route,
        startup,
        &mut deadline,
        &|| {},
    )
    .await?;
    Ok((accepted.route, accepted.relayed.map(|(conn, _)| conn)))
}

/// A client the server (relayed) or pgmemo (userlist) has accepted.
struct Accepted {
    /// Its route, with the credential pgmemo opens its server connections with.
    route: Route,
    /// The connection a relayed exchange ran on, and whether the server asked for a password.
    relayed: Option<(Box<ServerConn>, bool)>,
}

/// Checks the client, by `deadline`: relays its exchange over a new server connection
/// (`auth_type = upstream`), or checks it against the userlist. No pool place is held
/// meanwhile: a client that stalls at the password request must not keep authenticated
/// clients from the pool's servers. The relayed exchange's backends are bounded as they are
/// without pgmemo, by `max_client_conn` and the server's own `max_connections` and
/// `authentication_timeout`.
async fn authenticate(
    client: &mut ClientConn,
    shared: &Arc<Shared>,
    config: &Config,
    mut route: Route,
    startup: &StartupMessage,
    deadline: &mut LoginDeadline,
    on_asked: &(dyn Fn() + Sync),
) -> Result<Accepted, ClientError> {
    if config.auth_type == AuthType::Upstream {
        route.credential = upstream_credential(config, &route, shared);
        let timeout = config.server_connect_timeout.0;
        let upstream_tls = shared.upstream_tls.as_ref();
        let (mut conn, asked) = deadline
            .bound(async {
                let mut conn = open(shared, &route, upstream_tls).await?;
                let asked = relay_upstream_auth(client, &mut conn, timeout, on_asked).await?;
                Ok((conn, asked))
            })
            .await?;
        bounded(timeout, conn.finish_startup()).await?;
        return Ok(Accepted {
            route,
            relayed: Some((conn, asked)),
        });
    }
    let user = startup.param("user").unwrap_or_default();
    let userlist = shared.userlist();
    let local = deadline
        .bound(authenticate_locally(
            client,
            &userlist,
            config.auth_type,
            user,
            &shared.auth_seed,
        ))
        .await?;
    // Before an idle connection may serve the login: transaction pooling opens the client's
    // later server connections with these credentials.
    let same_user = route.key.user == user;
    let password = route
        .password
        .clone()
        .or_else(|| same_user.then_some(local.password).flatten())
        .or_else(|| known_password(config, &route, &userlist));
    route.credential = match (password, local.scram_keys) {
        (Some(p), _) => ServerCredential::Password(p),
        (None, Some(keys)) if same_user && route.password.is_none() => {
            ServerCredential::ScramKeys(keys)
        }
        _ => ServerCredential::None,
    };
    Ok(Accepted {
        route,
        relayed: None,
    })
}

/// What pgmemo opens its own server connections with under `auth_type = upstream`: a
/// password it holds for the server user, if any.
fn upstream_credential(config: &Config, route: &Route, shared: &Shared) -> ServerCredential {
    match known_password(config, route, &shared.userlist()) {
        Some(p) => ServerCredential::Password(p),
        None => ServerCredential::None,
    }
}

/// Serves a login the server trusts from the pool, with no relayed exchange: an idle
/// connection, or a new one pgmemo opens without a password while it holds the pool place
/// (so that a crowd of logins opens no more connections than the pool has places). `None`
/// when the new connection could not be opened that way: the server asks for a password
/// now, or is not reachable, and a relayed exchange must tell the client which.
async fn trusted_login(
    client: &mut ClientConn,
    shared: &Arc<Shared>,
    pool: &Arc<Pool>,
    route: &Route,
    wait: std::time::Duration,
) -> Result<Option<(Lease, Box<ServerConn>)>, ClientError> {
    let unauthenticated = Route {
        credential: ServerCredential::None,
        ..route.clone()
    };
    let (lease, conn) = serve_from_pool(client, shared, pool, &unauthenticated, wait).await?;
    Ok(conn.ok().map(|conn| (lease, conn)))
}

/// Takes a place in `pool` (waiting up to `wait`) and serves `route` from it: an idle
/// connection, or a new one opened with `route.credential` on that place. The place comes
/// back with the outcome of opening, which the caller may fall back from.
async fn serve_from_pool(
    client: &mut ClientConn,
    shared: &Arc<Shared>,
    pool: &Arc<Pool>,
    route: &Route,
    wait: std::time::Duration,
) -> Result<(Lease, Result<Box<ServerConn>, ClientError>), ClientError> {
    let mut lease = acquire(client, pool, wait, shared).await?;
    let settings = pool_settings(&shared.config());
    if let Some(conn) = lease.take_idle(route.fingerprint, &settings, None).await {
        return Ok((lease, Ok(conn)));
    }
    lease.reserve_new();
    let opened = open_authenticated(shared, route).await;
    Ok((lease, opened))
}

/// How much a queued client may send ahead (its first queries, pipelined behind the startup)
/// before pgmemo stops reading it until it has a place: what it sends beyond that waits in
/// the kernel, and its departure is then noticed only when the wait ends.
pub(super) const MAX_AHEAD_WHILE_QUEUED: usize = 64 * 1024;

/// Queues for a place in `pool` for at most `wait` while watching the client: one that closes
/// its connection meanwhile leaves the queue at once, so that it keeps neither its turn (a
/// server would be taken or opened for nobody) nor its `max_client_conn` slot until
/// `query_wait_timeout`. What the client sends meanwhile is kept in its buffer for the
/// session.
async fn acquire(
    client: &mut ClientConn,
    pool: &Arc<Pool>,
    wait: std::time::Duration,
    shared: &Shared,
) -> Result<Lease, ClientError> {
    tokio::select! {
        biased;
        acquired = pool.acquire(wait) => acquired.map_err(|e| {
            Stats::bump(&shared.stats.pool_wait_timeouts);
            e.into()
        }),
        gone = client.gone(MAX_AHEAD_WHILE_QUEUED) => Err(gone),
    }
}

/// `step` of opening a server connection (authentication, the rest of the startup), within
/// `server_connect_timeout` of its own: a server that accepts and then says nothing must not
/// hold a login.
async fn bounded<T>(
    timeout: std::time::Duration,
    step: impl std::future::Future<Output = Result<T, ServerError>>,
) -> Result<T, ServerError> {
    tokio::time::timeout(timeout, step)
        .await
        .unwrap_or(Err(ServerError::Timeout(timeout)))
}

/// A password pgmemo holds for the server user: the `[databases]` entry's, a plain userlist
/// secret, or the upstream URL's when it names the same user.
fn known_password(
    config: &Config,
    route: &Route,
    userlist: &crate::auth::Userlist,
) -> Option<String> {
    route
        .password
        .clone()
        .or_else(|| match userlist.get(&route.key.user) {
            Some(crate::auth::Secret::Plain(p)) => Some(p.clone()),
            _ => None,
        })
        .or_else(|| {
            (config.upstream.user.as_deref() == Some(route.key.user.as_str()))
                .then(|| config.upstream.password.clone())
                .flatten()
        })
}

/// Opens and logs in a new server connection for a client that is already authenticated
/// (transaction pooling opens them as clients need them).
pub async fn open_authenticated(
    shared: &Arc<Shared>,
    route: &Route,
) -> Result<Box<ServerConn>, ClientError> {
    let mut conn = open(shared, route, shared.upstream_tls.as_ref()).await?;
    bounded(shared.config().server_connect_timeout.0, async {
        conn.authenticate(&route.key.user, &route.credential)
            .await?;
        conn.finish_startup().await
    })
    .await?;
    Ok(conn)
}

async fn open(
    shared: &Arc<Shared>,
    route: &Route,
    tls: Option<&crate::tls::UpstreamTls>,
) -> Result<Box<ServerConn>, ClientError> {
    let config = shared.config();
    let (timeout, keepalive) = (config.server_connect_timeout.0, config.tcp_keepalive());
    drop(config);
    let opened = tokio::time::timeout(
        timeout,
        ServerConn::open(
            &route.key.host,
            route.key.port,
            tls,
            &route.server_params,
            route.fingerprint,
            &keepalive,
        ),
    )
    .await
    .unwrap_or(Err(crate::pool::ServerError::Timeout(timeout)));
    match opened {
        Ok(mut conn) => {
            Stats::bump(&shared.stats.server_connects);
            conn.listing = Some(shared.pools.servers.add(&route.key, conn.is_tls()));
            Ok(conn)
        }
        Err(e) => {
            Stats::bump(&shared.stats.server_connect_failures);
            tracing::warn!(host = %route.key.host, port = route.key.port, error = %e, "server connection failed");
            Err(e.into())
        }
    }
}
