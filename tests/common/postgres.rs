//! A throwaway PostgreSQL cluster for tests: `initdb` into a temp dir, `pg_ctl` start on a
//! Unix socket in that dir (no TCP), stopped and removed on drop.
//!
//! PostgreSQL refuses to run as root, so when the tests run as root the cluster's programs run
//! as the `postgres` user (the Debian package creates it) and the temp dir is handed to it.
//! Without PostgreSQL, [`PgCluster::start`] prints a loud skip message and returns `None`
//! (under `CI=true` it fails the test instead: `.ci/run` installs the `postgresql` package).

use std::fs;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::{Pid, User};
use tempfile::TempDir;

use super::prerequisite_missing;

/// How long `pg_ctl` may take to start or stop the cluster: a loaded two-core machine can be
/// slow to run recovery or open the socket, and waiting costs nothing when all is well.
const PG_CTL_WAIT_SECONDS: &str = "120";

/// The superuser `initdb` creates, whom the tests connect as (trust authentication on the
/// socket, which only the temp dir's owner can reach).
pub(crate) const SUPERUSER: &str = "cairn";

/// A running throwaway cluster; dropping it stops the postmaster it started and removes its
/// files.
pub(crate) struct PgCluster {
    dir: TempDir,
    bin: PathBuf,
    /// The user the cluster runs as, when the tests run as root.
    run_as: Option<User>,
    /// The postmaster's pid, read from `postmaster.pid` once it was up.
    postmaster: Pid,
}

impl PgCluster {
    /// Start a new cluster, or (outside CI) say loudly that `test` is skipped and return
    /// `None` when PostgreSQL is not installed.
    pub(crate) fn start(test: &str) -> Option<PgCluster> {
        let Some(bin) = server_bindir() else {
            prerequisite_missing(
                test,
                "needs PostgreSQL's server programs (initdb, pg_ctl), which are not installed \
                 (apt-get install postgresql)",
            );
            return None;
        };
        let run_as = if nix::unistd::geteuid().is_root() {
            let user = User::from_name("postgres")
                .expect("looking up the postgres user")
                .unwrap_or_else(|| {
                    panic!(
                        "{test}: running as root, and there is no `postgres` user to run \
                         PostgreSQL as (it refuses root); the postgresql package creates it"
                    )
                });
            Some(user)
        } else {
            None
        };
        let dir = tempfile::Builder::new()
            .prefix("cairn-pg-")
            .tempdir_in(cluster_parent(run_as.is_some()))
            .expect("creating the cluster's temp dir");
        if let Some(user) = &run_as {
            nix::unistd::chown(dir.path(), Some(user.uid), Some(user.gid))
                .expect("handing the temp dir to the postgres user");
        }
        let mut cluster = PgCluster {
            dir,
            bin,
            run_as,
            postmaster: Pid::from_raw(0),
        };
        cluster.init();
        cluster.configure();
        cluster.run_pg_ctl(&["start", "-w", "-t", PG_CTL_WAIT_SECONDS, "-l"], true);
        cluster.postmaster = cluster.read_postmaster_pid();
        Some(cluster)
    }

    /// A connection string for cairn: the socket directory, the superuser, the `postgres`
    /// database.
    pub(crate) fn url(&self) -> String {
        format!(
            "postgresql:///postgres?host={}&user={SUPERUSER}",
            self.dir.path().display()
        )
    }

    /// The temp dir holding the data directory, the socket and the server log.
    pub(crate) fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The postmaster's pid.
    pub(crate) fn postmaster_pid(&self) -> i32 {
        self.postmaster.as_raw()
    }

    /// Restart the server with `pg_ctl restart -m <mode>` (`fast`: connections are ended;
    /// `immediate`: the server dies without a checkpoint and recovers), waiting until it
    /// accepts connections again.
    pub(crate) fn restart(&mut self, mode: &str) {
        self.run_pg_ctl(
            &["restart", "-m", mode, "-w", "-t", PG_CTL_WAIT_SECONDS, "-l"],
            true,
        );
        self.postmaster = self.read_postmaster_pid();
    }

    /// Stop the server (`pg_ctl stop -m <mode>`) for an outage; [`PgCluster::resume`] starts
    /// it again.
    pub(crate) fn stop(&mut self, mode: &str) {
        let output = self.run_pg_ctl(
            &["stop", "-m", mode, "-w", "-t", PG_CTL_WAIT_SECONDS],
            false,
        );
        assert!(
            output.status.success(),
            "pg_ctl stop -m {mode} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Start the server again after [`PgCluster::stop`].
    pub(crate) fn resume(&mut self) {
        self.run_pg_ctl(&["start", "-w", "-t", PG_CTL_WAIT_SECONDS, "-l"], true);
        self.postmaster = self.read_postmaster_pid();
    }

    /// Create a database and return the connection string of it, for tests that want several.
    pub(crate) fn create_database(&self, name: &str) -> String {
        let psql = self.bin.join("psql");
        let output = self
            .command(&psql)
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(self.dir.path())
            .args(["-U", SUPERUSER, "-d", "postgres", "-c"])
            .arg(format!("CREATE DATABASE \"{name}\""))
            .output()
            .expect("running psql");
        check("psql CREATE DATABASE", &output);
        format!(
            "postgresql:///{name}?host={}&user={SUPERUSER}",
            self.dir.path().display()
        )
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// `initdb` with trust authentication on the socket only (nobody but the temp dir's owner
    /// can reach it), no fsync of the new files (a test cluster never outlives a crash).
    fn init(&self) {
        let output = self
            .command(&self.bin.join("initdb"))
            .arg("-D")
            .arg(self.data_dir())
            .args(["-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--no-sync"])
            .args(["--locale", "C"])
            .output()
            .expect("running initdb");
        check("initdb", &output);
    }

    /// Socket only, in the temp dir; no fsync (the tests kill daemons, never the database);
    /// small buffers, since many tests run a cluster each at once.
    fn configure(&self) {
        let conf = self.data_dir().join("postgresql.conf");
        let mut file = fs::OpenOptions::new()
            .append(true)
            .open(&conf)
            .expect("opening postgresql.conf");
        write!(
            file,
            "\nlisten_addresses = ''\nunix_socket_directories = '{}'\nfsync = off\n\
             full_page_writes = off\nmax_connections = 100\nshared_buffers = 16MB\n",
            self.dir.path().display()
        )
        .expect("writing postgresql.conf");
    }

    /// Run `pg_ctl -D <data> <args>`; `log` adds the log file as the last argument's value.
    /// Panics with the server log when `check_status` and it fails.
    fn run_pg_ctl(&self, args: &[&str], log: bool) -> Output {
        let mut command = self.command(&self.bin.join("pg_ctl"));
        command.arg("-D").arg(self.data_dir()).args(args);
        if log {
            command.arg(self.log_file());
        }
        let output = command.output().expect("running pg_ctl");
        if log && !output.status.success() {
            let server_log = fs::read_to_string(self.log_file()).unwrap_or_default();
            panic!(
                "pg_ctl {args:?} failed: {}\n{}\nserver log:\n{server_log}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        output
    }

    fn read_postmaster_pid(&self) -> Pid {
        let text = fs::read_to_string(self.data_dir().join("postmaster.pid"))
            .expect("reading postmaster.pid after pg_ctl start");
        let pid = text
            .lines()
            .next()
            .and_then(|line| line.trim().parse().ok())
            .unwrap_or_else(|| panic!("postmaster.pid does not start with a pid: {text:?}"));
        Pid::from_raw(pid)
    }

    /// A command that runs as the cluster's user, in the temp dir.
    fn command(&self, program: &Path) -> Command {
        let mut command = Command::new(program);
        command.current_dir(self.dir.path()).env("LC_ALL", "C");
        if let Some(user) = &self.run_as {
            // std drops the supplementary groups too when root switches to another uid.
            command.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        }
        command
    }
}

impl Drop for PgCluster {
    /// Stop only the postmaster this cluster started: `pg_ctl stop -m immediate`, and if that
    /// fails, SIGKILL to its pid. The temp dir goes with the `TempDir`.
    fn drop(&mut self) {
        let output = self.run_pg_ctl(
            &["stop", "-m", "immediate", "-w", "-t", PG_CTL_WAIT_SECONDS],
            false,
        );
        if !output.status.success() && self.postmaster.as_raw() > 0 {
            let _ = kill(self.postmaster, Signal::SIGKILL);
        }
        // Its backends leave once the postmaster is gone; wait a little so that removing the
        // directory does not race them.
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.postmaster.as_raw() > 0
            && kill(self.postmaster, None).is_ok()
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Where the cluster's temp dir goes: the usual temp dir, unless the socket's path would be
/// too long there (Unix socket paths are limited to about 100 bytes) or, when the cluster runs
/// as another user, that user could not reach it (a `TMPDIR` under root's home); then `/tmp`.
fn cluster_parent(other_user: bool) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let usual = std::env::temp_dir();
    let reachable = |dir: &Path| {
        dir.ancestors().all(|ancestor| {
            fs::metadata(ancestor).is_ok_and(|meta| meta.permissions().mode() & 0o001 != 0)
        })
    };
    // The temp dir's name and the socket's add about 30 bytes.
    let short_enough = usual.as_os_str().len() <= 60;
    if short_enough && (!other_user || reachable(&usual)) {
        usual
    } else {
        PathBuf::from("/tmp")
    }
}

/// The directory of PostgreSQL's server programs: `pg_config --bindir` when it holds
/// `initdb`, else the newest `/usr/lib/postgresql/<version>/bin` (Debian keeps them off
/// `PATH`), else wherever `initdb` is on `PATH`.
pub(crate) fn server_bindir() -> Option<PathBuf> {
    let has_server = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Ok(output) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        if output.status.success() && has_server(&dir) {
            return Some(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, dir)| has_server(dir))
        .collect();
    versions.sort();
    if let Some((_, dir)) = versions.pop() {
        return Some(dir);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).find(|dir| has_server(dir))
}

fn check(what: &str, output: &Output) {
    assert!(
        output.status.success(),
        "{what} failed: {}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Rows of text columns (`NULL` as `None`) of `statement` run with text parameters, on a
/// connection of its own (for looking at a shared queue's tables from a test).
pub(crate) fn query_texts(url: &str, statement: &str, params: &[&str]) -> Vec<Vec<Option<String>>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the test's query");
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connecting to the test cluster");
        tokio::spawn(connection);
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params
            .iter()
            .map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync))
            .collect();
        client
            .query(statement, &params)
            .await
            .unwrap_or_else(|e| panic!("running {statement:?}: {e}"))
            .iter()
            .map(|row| (0..row.len()).map(|i| row.get(i)).collect())
            .collect()
    })
}

/// Put `task` (a task file's JSON, with an `id`) into the shared queue at `url`, creating the
/// schema if needed: what `cairn submit --db` does.
pub(crate) fn submit_task(url: &str, task: &serde_json::Value) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for submitting");
    let id = task["id"].as_str().expect("the task has an id");
    let definition = task.to_string();
    runtime.block_on(async {
        let queue = cairn::queue::postgres::PgQueue::connect(url).expect("connecting");
        queue.migrate().await.expect("migrating the schema");
        queue
            .submit(&cairn::queue::postgres::NewTask {
                id,
                priority: 0,
                crash_limit: 5,
                definition: &definition,
                submitted_by: None,
            })
            .await
            .expect("submitting the task");
    });
}

/// The final record of task `id` in the shared queue, if it has one.
pub(crate) fn final_record(url: &str, id: &str) -> Option<serde_json::Value> {
    query_texts(
        url,
        "SELECT record::text FROM cairn_records WHERE task_id = $1",
        &[id],
    )
    .into_iter()
    .next()
    .and_then(|row| row.into_iter().next().flatten())
    .map(|text| serde_json::from_str(&text).expect("a record is JSON"))
}

/// `cairn ARGS` with the database in `CAIRN_DATABASE_URL` (as operators set it), run in a
/// directory with no queue: with `--db` the queue directory is not used.
pub(crate) fn cairn_db(url: &str, args: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"));
    command
        .args(args)
        .current_dir(std::env::temp_dir())
        .env("CAIRN_DATABASE_URL", url)
        .env("CAIRN_WAIT", super::DAEMON_WAIT)
        .env_remove("CAIRN_QUEUE")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    command
}
