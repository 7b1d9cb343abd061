//! A connection string as messages may show it: the password is left out, whichever form
//! the string has (`postgresql://user:secret@host/db`, `?password=secret`, or libpq's
//! `key=value` form with `password=secret` or `password='a secret'`).

/// What replaces a password.
const HIDDEN: &str = "***";

/// `url` with every password replaced by `***`.
pub fn redacted_url(url: &str) -> String {
    let url = match url.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}://{}", without_userinfo_password(rest)),
        None => url.to_string(),
    };
    without_password_parameters(&url)
}

/// `user:secret@host/...` → `user:***@host/...` (the userinfo ends at the last `@` before
/// the path).
fn without_userinfo_password(rest: &str) -> String {
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return rest.to_string();
    };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{user}:{HIDDEN}{}", &rest[at..]),
        None => rest.to_string(),
    }
}

/// `password=secret` → `password=***`, as a URL parameter (ends at `&`) or a `key=value`
/// pair (ends at white space; a quoted value at its closing quote).
fn without_password_parameters(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(found) = find_password_key(rest) {
        let (before, after_key) = rest.split_at(found.value_start);
        out.push_str(before);
        out.push_str(HIDDEN);
        rest = &after_key[value_len(after_key)..];
    }
    out.push_str(rest);
    out
}

struct PasswordKey {
    /// Where the value begins (after `=` and any spaces).
    value_start: usize,
}

/// The next `password` key that starts a parameter (at the start, or after `?`, `&` or
/// white space) and is followed by `=`.
fn find_password_key(text: &str) -> Option<PasswordKey> {
    let mut from = 0;
    while let Some(offset) = text[from..].find("password") {
        let start = from + offset;
        let starts_parameter = text[..start]
            .chars()
            .next_back()
            .is_none_or(|c| c == '?' || c == '&' || c.is_whitespace());
        let after = &text[start + "password".len()..];
        let trimmed = after.trim_start();
        if starts_parameter && trimmed.starts_with('=') {
            let after_equals = &trimmed[1..];
            let spaces = after_equals.len() - after_equals.trim_start().len();
            let value_start = text.len() - after_equals.len() + spaces;
            return Some(PasswordKey { value_start });
        }
        from = start + "password".len();
    }
    None
}

/// The length of the value at the start of `text`.
fn value_len(text: &str) -> usize {
    if let Some(quoted) = text.strip_prefix('\'') {
        let mut escaped = false;
        for (i, c) in quoted.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '\'' if !escaped => return i + 2,
                _ => escaped = false,
            }
        }
        return text.len();
    }
    text.find(|c: char| c == '&' || c.is_whitespace())
        .unwrap_or(text.len())
}

#[cfg(test)]
mod tests {
    use super::redacted_url;

    #[test]
    fn passwords_are_hidden_in_every_form() {
        assert_eq!(
            redacted_url("postgresql://ann:s3cr@t@db.example:5432/q?sslmode=require"),
            "postgresql://ann:***@db.example:5432/q?sslmode=require"
        );
        assert_eq!(
            redacted_url("postgres://ann@db/q?password=hunter2&sslmode=disable"),
            "postgres://ann@db/q?password=***&sslmode=disable"
        );
        assert_eq!(
            redacted_url("host=db user=ann password = 'a se\\'cret' dbname=q"),
            "host=db user=ann password = *** dbname=q"
        );
        assert_eq!(redacted_url("host=db password=x"), "host=db password=***");
        assert_eq!(
            redacted_url("postgresql:///postgres?host=/tmp/x&user=cairn"),
            "postgresql:///postgres?host=/tmp/x&user=cairn"
        );
        assert_eq!(
            redacted_url("host=/tmp/password dbname=q"),
            "host=/tmp/password dbname=q",
            "a word in another value is not a key"
        );
    }
}
