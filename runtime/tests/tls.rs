//! TLS to PostgreSQL (`sslmode`, `sslrootcert`) and to Redis (`rediss://`),
//! each against a TLS front of the machine's server with a certificate
//! authority the test makes (`flow_tests::tls_proxy`): what is checked in
//! each mode, and that a certificate of another authority or for another
//! name is refused where it must be.

use std::sync::Arc;

use flow_runtime::limit::{Limiter, Limits, RedisLimiter, RedisSettings, Unobserved};
use flow_runtime::postgres::PostgresStore;
use flow_runtime::store::{RunQuery, RunStore};
use flow_tests::TempDir;
use flow_tests::postgres::TestSchema;
use flow_tests::tls_proxy::{Certificates, Protocol, TlsProxy};

/// This test's authority, which signed the proxies' certificate for
/// `localhost`, and another that signed nothing the proxies show.
struct Authorities {
    ours: Certificates,
    theirs: Certificates,
    _dir: TempDir,
}

fn authorities(name: &str) -> Authorities {
    let dir = TempDir::new(name);
    Authorities {
        ours: Certificates::make(dir.path(), "ours", &["localhost"]),
        theirs: Certificates::make(dir.path(), "theirs", &["localhost"]),
        _dir: dir,
    }
}

fn upstream(url: &str) -> std::net::SocketAddr {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let host_port = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    let host_port = host_port.split(['/', '?']).next().unwrap_or(host_port);
    host_port
        .parse()
        .expect("the test server's address is host:port")
}

/// Connects to the store at `location` and reads from it.
async fn store_answers(location: &str) -> Result<(), String> {
    let store = PostgresStore::connect(location)
        .await
        .map_err(|e| e.to_string())?;
    let query = RunQuery {
        workflow: None,
        status: None,
        limit: 1,
        before: None,
    };
    store
        .account_runs("acme", &query)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn postgres_over_tls_checks_what_its_sslmode_says() {
    flow_tests::require!(Postgres);
    let authorities = authorities("tls-postgres");
    let server = flow_tests::postgres::server_url();
    let proxy = TlsProxy::start(&authorities.ours, Protocol::Postgres, upstream(&server)).await;
    let schema = TestSchema::new();
    let user = server
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .map_or("postgres", |(user, _)| user);
    let at = |host: &str, parameters: &str| {
        format!(
            "postgres://{user}@{host}:{}/test?schema={}&{parameters}",
            proxy.port,
            schema.name()
        )
    };
    let root =
        |certificates: &Certificates| format!("sslrootcert={}", certificates.authority.display());

    store_answers(&at(
        "localhost",
        &format!("sslmode=verify-full&{}", root(&authorities.ours)),
    ))
    .await
    .expect("verify-full: our authority, for localhost");
    let refused = store_answers(&at(
        "localhost",
        &format!("sslmode=verify-full&{}", root(&authorities.theirs)),
    ))
    .await
    .expect_err("another authority's trust");
    assert!(refused.contains("certificate"), "{refused}");

    // 127.0.0.1 is not the name the certificate was issued for.
    let refused = store_answers(&at(
        "127.0.0.1",
        &format!("sslmode=verify-full&{}", root(&authorities.ours)),
    ))
    .await
    .expect_err("verify-full checks the name");
    assert!(refused.contains("certificate"), "{refused}");
    store_answers(&at(
        "127.0.0.1",
        &format!("sslmode=verify-ca&{}", root(&authorities.ours)),
    ))
    .await
    .expect("verify-ca checks the authority, not the name");
    let refused = store_answers(&at(
        "127.0.0.1",
        &format!("sslmode=verify-ca&{}", root(&authorities.theirs)),
    ))
    .await
    .expect_err("verify-ca checks the authority");
    assert!(refused.contains("certificate"), "{refused}");

    // `require` encrypts without checking, as libpq's does.
    store_answers(&at("127.0.0.1", "sslmode=require"))
        .await
        .expect("require: encrypted, unchecked");
    // Without sslmode there is no TLS, which this server refuses.
    assert!(
        store_answers(&at("127.0.0.1", "connect_timeout=2"))
            .await
            .is_err()
    );
}

/// A limiter that reached Redis takes a permit without failing open.
async fn reaches_redis(url: &str) -> bool {
    let mut settings = RedisSettings::new(url);
    settings.prefix = format!("flow-test-tls-{}", std::process::id());
    settings.answer_within = std::time::Duration::from_secs(2);
    let limiter = Arc::new(
        RedisLimiter::new(
            settings,
            Limits {
                default: 1,
                accounts: Default::default(),
            },
            Arc::new(Unobserved),
        )
        .expect("a redis URL"),
    );
    drop(limiter.acquire("acme").await);
    limiter.fail_opens() == 0
}

#[tokio::test]
async fn redis_over_tls_checks_the_certificate() {
    flow_tests::require!(Redis);
    let authorities = authorities("tls-redis");
    let proxy = TlsProxy::start(
        &authorities.ours,
        Protocol::Tls,
        upstream(&flow_tests::services::redis_url()),
    )
    .await;
    let url =
        |host: &str, parameters: &str| format!("rediss://{host}:{}/?{parameters}", proxy.port);
    let ours = format!("sslrootcert={}", authorities.ours.authority.display());
    let theirs = format!("sslrootcert={}", authorities.theirs.authority.display());

    assert!(
        reaches_redis(&url("localhost", &ours)).await,
        "verify-full by default"
    );
    assert!(
        !reaches_redis(&url("localhost", &theirs)).await,
        "another authority"
    );
    assert!(
        !reaches_redis(&url("127.0.0.1", &ours)).await,
        "another name"
    );
    assert!(
        reaches_redis(&url("127.0.0.1", &format!("sslmode=verify-ca&{ours}"))).await,
        "verify-ca: the authority, not the name"
    );
    assert!(
        reaches_redis(&url("127.0.0.1", "sslmode=require")).await,
        "require: encrypted, unchecked"
    );
    assert!(
        flow_runtime::limit::redis_client("redis://127.0.0.1:6379/?sslmode=require").is_err(),
        "TLS settings on a plain URL are a mistake, not ignored"
    );
}
