//! The dashboard's actions (pause, resume, cancel, retry, fork, and bulk ones), taken through
//! the same functions as the `cairn` commands, so that the same checks apply.

use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::App;

/// The secret an action must carry (`X-Cairn-Token`), so that a page of another site cannot act.
#[derive(Clone)]
pub struct Token {
    pub secret: String,
    /// Made at start (and printed), rather than read from a file.
    pub generated: bool,
}

pub async fn act(
    State(app): State<App>,
    UrlPath(action): UrlPath<String>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let _ = (&app, &action, &headers, &body);
    (StatusCode::FORBIDDEN, "actions are not allowed\n").into_response()
}

/// 32 random bytes from the kernel, as hex.
pub fn fresh_token() -> crate::cli::error::CliResult<Token> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(|e| {
            crate::cli::error::CliError::failure(format_args!(
                "cannot make an action token from /dev/urandom: {e}"
            ))
        })?;
    let secret = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(Token {
        secret,
        generated: true,
    })
}

/// The token in `file`'s first line; a file every user may read is refused.
pub fn token_from_file(file: &std::path::Path) -> crate::cli::error::CliResult<Token> {
    use std::os::unix::fs::MetadataExt;
    let named = |what: String| {
        crate::cli::error::CliError::failure(format_args!(
            "--token-file {}: {what}",
            file.display()
        ))
    };
    let metadata = std::fs::metadata(file).map_err(|e| named(format!("{e}")))?;
    if metadata.mode() & 0o004 != 0 {
        return Err(named(format!(
            "every user may read it (mode {:o}): chmod o-r it",
            metadata.mode() & 0o7777
        )));
    }
    let text = std::fs::read_to_string(file).map_err(|e| named(format!("{e}")))?;
    let secret = text.lines().next().unwrap_or("").trim().to_string();
    if secret.len() < 16 {
        return Err(named(
            "its first line must hold a token of at least 16 characters".into(),
        ));
    }
    Ok(Token {
        secret,
        generated: false,
    })
}
