//! Where the store is: its URL, with this store's own parameters (`schema`,
//! TLS) taken out before the rest goes to the driver.

use super::*;

/// A store URL read: what tokio-postgres reads, and what this store reads
/// itself.
pub(super) struct Location {
    /// The URL without this store's own parameters.
    pub(super) url: String,
    pub(super) schema: Option<String>,
    pub(super) tls: TlsSettings,
}

/// Takes this store's `schema=NAME`, and the TLS parameters tokio-postgres
/// lacks (`sslmode=verify-ca|verify-full`, `sslrootcert`), out of a URL's
/// query: the rest is for tokio-postgres, which refuses parameters it does
/// not know. Without `sslmode` there is no TLS (libpq would `prefer` it):
/// a deployment asks for it, and then gets it checked.
pub(super) fn split_location(location: &str) -> Result<Location, StoreError> {
    let (base, query) = location.split_once('?').unwrap_or((location, ""));
    let mut schema = None;
    let mut kept: Vec<String> = Vec::new();
    for parameter in query.split('&').filter(|p| !p.is_empty()) {
        match parameter.strip_prefix("schema=") {
            Some(name) => schema = Some(name.to_string()),
            None => kept.push(parameter.to_string()),
        }
    }
    let tls = TlsSettings::take(&mut kept, TlsMode::Disable)
        .map_err(|message| StoreError::Unusable(format!("postgres: {message}")))?;
    if let Some(name) = &schema {
        let mut characters = name.chars();
        let valid = name.len() <= 63
            && characters
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
            && characters.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            return Err(StoreError::Unusable(format!(
                "schema `{name}`: a schema name is a lowercase letter or `_`, then letters, digits or `_` (at most 63)"
            )));
        }
    }
    let url = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok(Location { url, schema, tls })
}

/// Reads a store URL as `connect` does, without connecting: what a
/// configuration check can refuse before a server starts.
pub fn check_location(location: &str) -> Result<(), StoreError> {
    parse_location(location).map(|_| ())
}

/// The connection settings, the schema and the TLS of a store URL.
pub(super) fn parse_location(
    location: &str,
) -> Result<(tokio_postgres::Config, Option<String>, TlsSettings), StoreError> {
    let Location { url, schema, tls } = split_location(location)?;
    // Neither parser's messages quote the URL, so no password leaks; the
    // URL parser's say what is wrong (`invalid port number`) where
    // tokio-postgres says only that something is.
    let mut config: tokio_postgres::Config = url.parse().map_err(|e: tokio_postgres::Error| {
        let why = reqwest::Url::parse(&url)
            .err()
            .map_or(e.to_string(), |e| e.to_string());
        StoreError::Unusable(format!("postgres: {why}"))
    })?;
    config.ssl_mode(match tls.mode {
        TlsMode::Disable => tokio_postgres::config::SslMode::Disable,
        TlsMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        TlsMode::Require | TlsMode::VerifyCa | TlsMode::VerifyFull => {
            tokio_postgres::config::SslMode::Require
        }
    });
    if tls.mode != TlsMode::Disable {
        // A root file that cannot be read is found now, not at the first
        // connection.
        tls.client_config()
            .map_err(|message| StoreError::Unusable(format!("postgres: {message}")))?;
    }
    Ok((config, schema, tls))
}

/// The machine's name, to tell owners apart in the `runs` table.
pub(super) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "unknown-host".to_string())
}
