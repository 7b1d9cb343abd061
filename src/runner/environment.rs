//! The environment a task's commands get: built, not inherited.
//!
//! A daemon's environment holds what its service was given: `CAIRN_DATABASE_URL` with its
//! password, an `EnvironmentFile=`'s secrets, the notification socket. None of it is a task's
//! business, and with `--run-as-submitter` the task is another user's. So a command gets only:
//! its task's `env`, cairn's `CAIRN_*` variables, and from the daemon the short list below
//! ([`PASSED_FROM_DAEMON`], the `LC_*` locale variables) plus what the operator names with
//! `cairn run --pass-env NAME` (`CAIRN_PASS_ENV`). `HOME`, `USER`, `LOGNAME` and `SHELL` are
//! those of the user the command runs as, from the user database (see docs/security.md).

use std::ffi::{OsStr, OsString};

use super::spawn::InheritedEnv;

/// The daemon's variables every command gets, when the daemon has them: where programs are,
/// the locale and the time zone.
pub const PASSED_FROM_DAEMON: [&str; 4] = ["PATH", "LANG", "LANGUAGE", "TZ"];

/// Locale variables (`LC_ALL`, `LC_CTYPE`, ...) pass too.
const PASSED_PREFIX: &str = "LC_";

/// The environment variables of systemd's notification protocol, which the daemon speaks
/// (`daemon::notify`) and commands must not get, neither from the daemon nor from their task's
/// `env`: a task must not be able to speak for the daemon.
pub const NOTIFY_ENV: [&str; 3] = ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"];

/// Variables no operator may pass on to tasks (`--pass-env`): the database URL holds the
/// password of the daemon's role.
const NEVER_PASSED: [&str; 1] = ["CAIRN_DATABASE_URL"];

/// Why a name given to `--pass-env` is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PassEnvError {
    #[error("{0:?} is not a variable name (empty, or holding '=' or a NUL byte)")]
    NotAName(String),
    #[error(
        "{0} is never passed to tasks: it holds the database's password (the daemon's role \
         would be every task's)"
    )]
    Secret(String),
    #[error("{0} belongs to the service manager's notification protocol and is never passed")]
    Notify(String),
}

/// Check the names an operator passes on to tasks (`--pass-env`).
pub fn check_pass_names(names: &[String]) -> Result<(), PassEnvError> {
    for name in names {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(PassEnvError::NotAName(name.clone()));
        }
        if NEVER_PASSED.contains(&name.as_str()) {
            return Err(PassEnvError::Secret(name.clone()));
        }
        if NOTIFY_ENV.contains(&name.as_str()) {
            return Err(PassEnvError::Notify(name.clone()));
        }
    }
    Ok(())
}

/// What commands get from the daemon: from this process's environment, the names above and
/// those in `pass`; and the login variables of the daemon's user (which a task run as its
/// submitter gets its submitter's instead: `Confinement::login_env`).
pub fn daemon_env(pass: &[String]) -> InheritedEnv {
    let login = crate::runner::identity::RunAs::of_uid(nix::unistd::geteuid().as_raw())
        .map(|user| user.login_env().to_vec())
        .unwrap_or_default();
    built_env(std::env::vars_os(), pass, &login)
}

/// [`daemon_env`] from the variables `vars` and the login variables `login`.
fn built_env(
    vars: impl IntoIterator<Item = (OsString, OsString)>,
    pass: &[String],
    login: &[(String, String)],
) -> InheritedEnv {
    let passed = |name: &OsStr| {
        let Some(name) = name.to_str() else {
            return false;
        };
        if NEVER_PASSED.contains(&name) || NOTIFY_ENV.contains(&name) {
            return false;
        }
        PASSED_FROM_DAEMON.contains(&name)
            || name.starts_with(PASSED_PREFIX)
            || pass.iter().any(|p| p == name)
    };
    // The login variables first: a listed name the daemon has (`--pass-env HOME`) wins.
    let mut chosen: Vec<(OsString, OsString)> = login
        .iter()
        .map(|(name, value)| (OsString::from(name), OsString::from(value)))
        .collect();
    chosen.extend(vars.into_iter().filter(|(name, _)| passed(name)));
    InheritedEnv::from_vars(chosen, &NOTIFY_ENV)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(n, v)| (OsString::from(n), OsString::from(v)))
            .collect()
    }

    #[test]
    fn a_command_gets_the_listed_variables_and_no_other_of_the_daemon() {
        let daemon = vars(&[
            ("PATH", "/usr/bin:/bin"),
            ("LANG", "C.UTF-8"),
            ("LC_TIME", "en_GB.UTF-8"),
            ("TZ", "Europe/Paris"),
            ("CAIRN_DATABASE_URL", "postgresql://cairn:secret@db/cairn"),
            ("AWS_SECRET_ACCESS_KEY", "hunter2"),
            ("NOTIFY_SOCKET", "/run/systemd/notify"),
            ("LD_PRELOAD", "/tmp/evil.so"),
            ("HOME", "/root"),
            ("PROXY", "http://proxy:3128"),
        ]);
        let login = [("HOME".to_string(), "/var/lib/cairn".to_string())];
        let env = built_env(daemon.clone(), &["PROXY".into()], &login);
        let got = |name: &str| {
            env.get(name)
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        assert_eq!(got("PATH").as_deref(), Some("/usr/bin:/bin"));
        assert_eq!(got("LANG").as_deref(), Some("C.UTF-8"));
        assert_eq!(got("LC_TIME").as_deref(), Some("en_GB.UTF-8"));
        assert_eq!(got("TZ").as_deref(), Some("Europe/Paris"));
        assert_eq!(got("PROXY").as_deref(), Some("http://proxy:3128"));
        // The daemon user's home from the user database, not the daemon's HOME.
        assert_eq!(got("HOME").as_deref(), Some("/var/lib/cairn"));
        for withheld in [
            "CAIRN_DATABASE_URL",
            "AWS_SECRET_ACCESS_KEY",
            "NOTIFY_SOCKET",
            "LD_PRELOAD",
        ] {
            assert_eq!(got(withheld), None, "{withheld} reached the command");
        }
        // Even named by the operator, the database URL and the notify socket stay.
        let env = built_env(
            daemon,
            &["CAIRN_DATABASE_URL".into(), "NOTIFY_SOCKET".into()],
            &[],
        );
        assert_eq!(env.get("CAIRN_DATABASE_URL"), None);
        assert_eq!(env.get("NOTIFY_SOCKET"), None);
    }

    #[test]
    fn the_database_url_and_malformed_names_cannot_be_passed() {
        assert!(check_pass_names(&["HTTPS_PROXY".into(), "LD_LIBRARY_PATH".into()]).is_ok());
        for (name, expected) in [
            (
                "CAIRN_DATABASE_URL",
                PassEnvError::Secret("CAIRN_DATABASE_URL".into()),
            ),
            (
                "NOTIFY_SOCKET",
                PassEnvError::Notify("NOTIFY_SOCKET".into()),
            ),
            ("A=B", PassEnvError::NotAName("A=B".into())),
            ("", PassEnvError::NotAName(String::new())),
        ] {
            assert_eq!(check_pass_names(&[name.to_string()]), Err(expected));
        }
    }
}
