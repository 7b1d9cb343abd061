//! The TLS options of a connection string that cairn reads itself, as libpq names them:
//! `sslmode` (libpq's six values; the client library knows only three) and `sslrootcert`
//! (which it does not know). They are taken out of the string before it is parsed, in both of
//! libpq's forms: a `postgresql://` URL's query, or `key=value` pairs.

use std::path::PathBuf;

/// What the connection string asks of TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct TlsOptions {
    /// `sslmode` as written (`None`: not named, libpq's default `prefer`).
    pub sslmode: Option<String>,
    /// `sslrootcert`: a PEM file of the certificates to trust instead of the system's
    /// (`system`: the system's, as without it).
    pub root_cert: Option<PathBuf>,
}

/// The `sslmode` the client library is given for the one named (`None`: not one of libpq's).
/// The server's certificate is always verified, chain and host name, against the roots: so
/// `require`, `verify-ca` and `verify-full` all mean libpq's `verify-full`.
pub(super) fn library_mode(sslmode: &str) -> Option<&'static str> {
    match sslmode {
        "disable" => Some("disable"),
        "allow" | "prefer" => Some("prefer"),
        "require" | "verify-ca" | "verify-full" => Some("require"),
        _ => None,
    }
}

/// `url` without its `sslmode` and `sslrootcert`, with `sslmode` given back in the client
/// library's words, and what they were. An `sslmode` that is none of libpq's is left for the
/// library to refuse.
pub(super) fn take_tls_options(url: &str) -> (String, TlsOptions) {
    if url.starts_with("postgresql://") || url.starts_with("postgres://") {
        take_from_url(url)
    } else {
        take_from_pairs(url)
    }
}

fn take_from_url(url: &str) -> (String, TlsOptions) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), TlsOptions::default());
    };
    let mut options = TlsOptions::default();
    let mut kept = Vec::new();
    for pair in query.split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "sslmode" => options.sslmode = Some(percent_decoded(value)),
            "sslrootcert" => options.root_cert = Some(PathBuf::from(percent_decoded(value))),
            _ => kept.push(pair.to_string()),
        }
    }
    if let Some(mode) = &options.sslmode {
        kept.push(format!(
            "sslmode={}",
            library_mode(mode).unwrap_or(mode.as_str())
        ));
    }
    let rebuilt = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    (rebuilt, options)
}

fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// libpq's `key = value` pairs: values may be single-quoted, with `\'` and `\\` inside.
fn take_from_pairs(text: &str) -> (String, TlsOptions) {
    let mut options = TlsOptions::default();
    let mut kept: Vec<String> = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        if chars.peek() != Some(&'=') {
            // Not a pair: left for the library to refuse.
            return (text.to_string(), TlsOptions::default());
        }
        chars.next();
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let (mut raw, mut value) = (String::new(), String::new());
        if chars.peek() == Some(&'\'') {
            raw.push('\'');
            chars.next();
            while let Some(c) = chars.next() {
                raw.push(c);
                match c {
                    '\\' => {
                        if let Some(escaped) = chars.next() {
                            raw.push(escaped);
                            value.push(escaped);
                        }
                    }
                    '\'' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                raw.push(c);
                value.push(c);
                chars.next();
            }
        }
        match key.as_str() {
            "sslmode" => options.sslmode = Some(value),
            "sslrootcert" => options.root_cert = Some(PathBuf::from(value)),
            _ => kept.push(format!("{key}={raw}")),
        }
    }
    if let Some(mode) = &options.sslmode {
        kept.push(format!(
            "sslmode={}",
            library_mode(mode).unwrap_or(mode.as_str())
        ));
    }
    (kept.join(" "), options)
}

#[cfg(test)]
mod tests {
    use super::{take_tls_options, TlsOptions};

    #[test]
    fn libpq_s_tls_options_are_taken_out_of_both_forms_of_connection_string() {
        let (url, options) = take_tls_options(
            "postgresql://ann@db.example/q?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&connect_timeout=5",
        );
        assert_eq!(
            url,
            "postgresql://ann@db.example/q?connect_timeout=5&sslmode=require"
        );
        assert_eq!(options.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(
            options.root_cert.as_deref(),
            Some(std::path::Path::new("/etc/ca.pem"))
        );
        let (url, options) = take_tls_options("postgres://db/q");
        assert_eq!(
            (url.as_str(), options),
            ("postgres://db/q", TlsOptions::default())
        );
        let (url, options) = take_tls_options("postgres://db/q?sslrootcert=system");
        assert_eq!(url, "postgres://db/q");
        assert_eq!(options.sslmode, None);

        let (pairs, options) = take_tls_options(
            "host=db.example password='a \\' b' sslmode = verify-ca sslrootcert='/etc/my ca.pem'",
        );
        assert_eq!(pairs, "host=db.example password='a \\' b' sslmode=require");
        assert_eq!(options.sslmode.as_deref(), Some("verify-ca"));
        assert_eq!(
            options.root_cert.as_deref(),
            Some(std::path::Path::new("/etc/my ca.pem"))
        );
        // What is not libpq's is left for the library to refuse.
        let (pairs, _) = take_tls_options("host=db sslmode=sometimes");
        assert_eq!(pairs, "host=db sslmode=sometimes");
    }
}
