//! Connecting: the connection string, optional TLS, and the pool the queue's statements share.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Hook, Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::error::PgError;

/// Connections one daemon keeps: its statements are short and never span a running command,
/// so a few serve many tasks.
pub const DEFAULT_POOL_SIZE: usize = 4;

/// How long a statement waits for a pooled connection before failing; a daemon retries.
const POOL_WAIT: Duration = Duration::from_secs(30);

/// How long a new connection may take (the URL's `connect_timeout` wins).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long sent bytes may go unacknowledged before TCP drops the connection (the URL's
/// `tcp_user_timeout` wins), and the keepalive probes' idle time and interval.
const UNANSWERED_TCP: Duration = Duration::from_secs(10);
const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);

/// The shared queue in one PostgreSQL database, as one process sees it.
///
/// Cloning is cheap; clones share the pool. `instance` tells this process apart from another
/// daemon registered under the same node name.
#[derive(Clone)]
pub struct PgQueue {
    pub(super) pool: Pool,
    pub(super) config: tokio_postgres::Config,
    pub(super) tls: MakeRustlsConnect,
    pub(super) instance: i64,
    /// The connection string's `sslmode`, as written.
    sslmode_named: Option<String>,
}

impl std::fmt::Debug for PgQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgQueue")
            .field("hosts", &self.config.get_hosts())
            .field("dbname", &self.config.get_dbname())
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl PgQueue {
    /// A queue on the database named by `url` (a `postgresql://` URL or libpq's `key=value`
    /// form), with [`DEFAULT_POOL_SIZE`] connections. Connects lazily: a database that is down
    /// is reported by the first statement.
    ///
    /// TLS follows the URL's `sslmode`, libpq's words: `disable` never uses it; `allow` and
    /// `prefer` (the default) use it over TCP when the server offers it and fall back to plain
    /// text when it does not; `require`, `verify-ca` and `verify-full` insist on it. Whenever
    /// TLS is used the server's certificate is verified, chain and host name (libpq's
    /// `verify-full`), against the system's roots (`SSL_CERT_FILE` / `SSL_CERT_DIR` point
    /// elsewhere) or the PEM file `sslrootcert` names. Unix sockets never use TLS.
    pub fn connect(url: &str) -> Result<Self, PgError> {
        Self::connect_with_pool_size(url, DEFAULT_POOL_SIZE)
    }

    /// [`PgQueue::connect`] with `pool_size` connections at most.
    pub fn connect_with_pool_size(url: &str, pool_size: usize) -> Result<Self, PgError> {
        let (url, tls_options) = super::conninfo::take_tls_options(url);
        if let Some(mode) = &tls_options.sslmode {
            if super::conninfo::library_mode(mode).is_none() {
                return Err(PgError::InvalidSslMode(mode.clone()));
            }
        }
        let mut config = tokio_postgres::Config::from_str(&url).map_err(PgError::InvalidUrl)?;
        // As libpq: no TLS on a Unix socket, whatever sslmode says (the server offers none).
        let hosts = config.get_hosts();
        if !hosts.is_empty()
            && hosts
                .iter()
                .all(|host| matches!(host, tokio_postgres::config::Host::Unix(_)))
        {
            config.ssl_mode(SslMode::Disable);
        }
        if config.get_application_name().is_none() {
            config.application_name("cairn");
        }
        // A silent partition must end in an error, not a connection that waits for ever: a
        // connect gives up after a while, and a connection whose peer stopped answering is
        // found dead by TCP within seconds (unless the URL says otherwise).
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_tcp_user_timeout().is_none() {
            config.tcp_user_timeout(UNANSWERED_TCP);
        }
        config
            .keepalives(true)
            .keepalives_idle(KEEPALIVE_IDLE)
            .keepalives_interval(KEEPALIVE_IDLE)
            .keepalives_retries(3);
        let tls = tls_connector(config.get_ssl_mode(), tls_options.root_cert.as_deref())?;
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .post_create(Hook::async_fn(|client, _| {
                Box::pin(async move {
                    prefer_lz4(client).await;
                    Ok(())
                })
            }))
            .max_size(pool_size.max(1))
            .wait_timeout(Some(POOL_WAIT))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(PgError::Pool)?;
        Ok(PgQueue {
            pool,
            config,
            tls,
            instance: fastrand::i64(1..),
            sslmode_named: tls_options.sslmode,
        })
    }

    /// A warning when connections to a server on another host may go in plain text: TCP to a
    /// host that is not this one, with `sslmode` `prefer` or `allow` (or not named: libpq's
    /// default is `prefer`). Naming `sslmode=disable` says plain text is meant.
    pub fn plain_text_warning(&self) -> Option<String> {
        let mode = self.sslmode_named.as_deref();
        if !matches!(mode, None | Some("prefer") | Some("allow")) {
            return None;
        }
        let remote: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .filter_map(|host| match host {
                tokio_postgres::config::Host::Tcp(name) if !is_local(name) => Some(name.clone()),
                _ => None,
            })
            .collect();
        if remote.is_empty() {
            return None;
        }
        Some(format!(
            "the connection to the database on {} may fall back to plain text (sslmode={}): \
             its password and every task's data could be read on the way; name \
             sslmode=verify-full to insist on TLS, or sslmode=disable to say plain text is meant",
            remote.join(", "),
            mode.unwrap_or("prefer, the default")
        ))
    }

    /// A pooled connection.
    pub(super) async fn client(&self) -> Result<deadpool_postgres::Object, PgError> {
        self.pool.get().await.map_err(PgError::Connect)
    }

    /// The database's schema version (0: cairn never migrated it).
    pub async fn schema_version(&self) -> Result<i32, PgError> {
        let client = self.client().await?;
        super::schema::current_version(&client).await
    }

    /// Bring the database's schema up to this cairn's version (see [`super::schema`]).
    pub async fn migrate(&self) -> Result<super::Migrated, PgError> {
        let mut client = self.client().await?;
        super::schema::migrate(&mut client).await
    }
}

/// Have the new connection compress large values it stores with lz4 when the server can.
/// A checkpoint's bytes are gzip, which no TOAST compression shrinks: PostgreSQL's own pglz
/// reads all of a checkpoint before giving up (a quarter of the server's time saving 64 KiB
/// states), lz4 gives up at once. A server without lz4 (built without it, or before 14)
/// refuses the setting and keeps pglz; nothing else changes.
async fn prefer_lz4(client: &tokio_postgres::Client) {
    if let Err(error) = client
        .batch_execute("SET default_toast_compression = lz4")
        .await
    {
        tracing::debug!(%error, "the server keeps its own TOAST compression");
    }
}

/// Whether `host` names this machine.
fn is_local(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// rustls with the ring provider and the system's root certificates, or those of the PEM file
/// `root_cert` (none are needed when TLS is disabled).
fn tls_connector(
    mode: SslMode,
    root_cert: Option<&std::path::Path>,
) -> Result<MakeRustlsConnect, PgError> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    let root_cert = root_cert.filter(|path| *path != std::path::Path::new("system"));
    if let (Some(path), true) = (root_cert, mode != SslMode::Disable) {
        let certs = rustls::pki_types::CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| PgError::RootCert {
                path: path.to_path_buf(),
                problem: e.to_string(),
            })?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(PgError::RootCert {
                path: path.to_path_buf(),
                problem: "it holds no certificate".to_string(),
            });
        }
    } else if mode != SslMode::Disable {
        let found = rustls_native_certs::load_native_certs();
        for error in &found.errors {
            tracing::warn!(%error, "could not load a system root certificate");
        }
        roots.add_parsable_certificates(found.certs);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(PgError::Tls)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

#[cfg(test)]
mod tests {
    use super::PgQueue;

    #[test]
    fn verify_full_is_accepted_and_plain_text_to_another_host_is_warned_of() {
        let warning = |url: &str| PgQueue::connect(url).unwrap().plain_text_warning();
        let said = warning("postgresql://ann@db.example/q").expect("a warning");
        assert!(
            said.contains("db.example") && said.contains("sslmode=verify-full"),
            "{said}"
        );
        assert!(warning("host=db.example user=ann sslmode=prefer").is_some());
        assert_eq!(
            warning("postgresql://ann@db.example/q?sslmode=verify-full"),
            None
        );
        assert_eq!(warning("host=db.example sslmode=verify-ca"), None);
        assert_eq!(
            warning("postgresql://ann@db.example/q?sslmode=disable"),
            None
        );
        assert_eq!(warning("postgresql://ann@localhost/q"), None);
        assert_eq!(warning("postgresql://ann@127.0.0.1:5433/q"), None);
        assert_eq!(warning("postgresql:///q?host=/run/postgresql"), None);
        let refused = PgQueue::connect("postgresql://db/q?sslmode=sometimes").unwrap_err();
        assert!(refused.to_string().contains("sslmode"), "{refused}");
        let missing = PgQueue::connect(
            "postgresql://db/q?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
        )
        .unwrap_err();
        assert!(
            missing.to_string().contains("/nonexistent/ca.pem"),
            "{missing}"
        );
    }
}
