//! The worker channel: a FIFO (named pipe) in the task's run directory that a worker writes
//! JSON lines to.
//!
//! A FIFO because it works from a plain shell (`printf '...\n' >> "$CAIRN_CHANNEL"`) and from
//! Python's `open(path, "a")`, uses no disk however long the worker runs, and keeps each line of
//! up to `PIPE_BUF` (4096) bytes whole even with several writers. The daemon opens it for reading
//! *and* writing before the worker starts, so a worker's `open` never blocks and the reader never
//! sees end-of-file between two writers.
//!
//! The way back is a second FIFO, the [`AckPipe`] (`$CAIRN_ACK`): a worker that puts `"ack":
//! true` in a message gets one line once the daemon has handled it, saying which iteration is
//! committed. The daemon holds it open for reading and writing, so a worker's reader never sees
//! end-of-file while the daemon lives (and does see it once the daemon is gone), and writes to it
//! without blocking: a line that does not fit (a worker that asks and never reads) is dropped.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use nix::sys::stat::Mode;
use serde::Deserialize;
use serde_json::Value;
use tokio::net::unix::pipe;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};

/// Longest channel line read; longer ones are reported and skipped.
pub const MAX_LINE_BYTES: usize = 64 * 1024 * 1024;

/// One line from a worker. Several keys in one line are all taken.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    #[serde(default)]
    pub checkpoint: Option<CheckpointMessage>,
    #[serde(default)]
    pub progress: Option<ProgressMessage>,
    #[serde(default)]
    pub cost: Option<f64>,
    #[serde(default)]
    pub output: Option<Value>,
    /// Answer this message on the ack pipe once it is handled (see [`AckPipe`]).
    #[serde(default)]
    pub ack: Option<bool>,
    /// Any message shows the worker is alive; this one says only that.
    #[serde(default)]
    #[allow(dead_code)]
    pub heartbeat: Option<bool>,
}

/// `{"checkpoint": {"iteration": N, "state": ...}}`: iterations 0..N are done.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointMessage {
    pub iteration: u64,
    #[serde(default)]
    pub state: Value,
    /// Files in the scratch directory the checkpoint keeps: name → relative path.
    #[serde(default)]
    pub files: std::collections::BTreeMap<String, String>,
}

/// `{"progress": {"done": N, "total": M}}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgressMessage {
    pub done: u64,
    #[serde(default)]
    pub total: Option<u64>,
}

/// The read end of a worker's channel; the FIFO is removed when it is dropped.
pub struct Channel {
    path: PathBuf,
    /// `None` only for the moment it is rebuilt after a too-long line.
    lines: Option<FramedRead<pipe::Receiver, LinesCodec>>,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel").field("path", &self.path).finish()
    }
}

impl Channel {
    /// Make a fresh FIFO at `path`, replacing a stale one (blocking: an inode to allocate);
    /// [`Channel::open`] then opens it.
    pub fn make(path: &Path) -> io::Result<()> {
        make_fifo(path)
    }

    /// Open the FIFO made at `path` (on the runtime: its reader joins the runtime's reactor).
    pub fn open(path: &Path) -> io::Result<Channel> {
        let receiver = pipe::OpenOptions::new()
            .read_write(true)
            .open_receiver(path)?;
        Ok(Channel {
            path: path.to_path_buf(),
            lines: Some(FramedRead::new(
                receiver,
                LinesCodec::new_with_max_length(MAX_LINE_BYTES),
            )),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The next line, parsed. Never ends on its own (the daemon holds a write end).
    pub async fn next(&mut self) -> Result<Message, ChannelError> {
        loop {
            let Some(lines) = self.lines.as_mut() else {
                return std::future::pending().await;
            };
            match lines.next().await {
                Some(Ok(line)) if line.trim().is_empty() => continue,
                Some(Ok(line)) => return parse_message(&line),
                Some(Err(LinesCodecError::MaxLineLengthExceeded)) => {
                    // A framed stream ends after an error; rebuild it around the same pipe and
                    // codec (which goes on discarding up to the end of the long line), or the
                    // worker would block forever writing into a channel nobody reads.
                    if let Some(framed) = self.lines.take() {
                        let codec = framed.decoder().clone();
                        let buffered = framed.read_buffer().clone();
                        let mut rebuilt = FramedRead::new(framed.into_inner(), codec);
                        *rebuilt.read_buffer_mut() = buffered;
                        self.lines = Some(rebuilt);
                    }
                    return Err(ChannelError::LineTooLong);
                }
                Some(Err(LinesCodecError::Io(e))) => return Err(ChannelError::Read(e)),
                None => std::future::pending::<()>().await,
            }
        }
    }

    /// The lines still buffered after the worker exited: read until none arrives for a moment.
    pub async fn drain(&mut self) -> Vec<Result<Message, ChannelError>> {
        let mut messages = Vec::new();
        while let Ok(message) = tokio::time::timeout(Duration::from_millis(50), self.next()).await {
            messages.push(message);
        }
        messages
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The daemon's side of `$CAIRN_ACK`: a FIFO it writes one line to per message that asked
/// for it; removed when dropped.
///
/// The lines are `{"checkpoint":N,"committed":C}` (the message's checkpoint iteration, or the
/// latest one received when it carried none; `C` the iteration count of the phase's last
/// durable checkpoint, where a restart resumes) and `{"error":"..."}` for a line that was not a
/// valid message (whether it asked or not: the daemon cannot tell).
pub struct AckPipe {
    path: PathBuf,
    /// Opened read-write and non-blocking: the daemon never waits on a worker that does not read.
    file: std::fs::File,
}

impl std::fmt::Debug for AckPipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AckPipe").field("path", &self.path).finish()
    }
}

/// The longest error line written; pipes keep writes up to `PIPE_BUF` (4096) bytes whole.
const MAX_ACK_ERROR_CHARS: usize = 500;

impl AckPipe {
    /// Make a fresh FIFO at `path` (replacing a stale one) and open it.
    pub fn create(path: &Path) -> io::Result<AckPipe> {
        make_fifo(path)?;
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(path)?;
        Ok(AckPipe {
            path: path.to_path_buf(),
            file,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tell the worker that its checkpoint `iteration` is handled and `committed` is durable.
    pub fn acknowledge(&self, iteration: u64, committed: u64) {
        self.write_line(&format!(
            "{{\"checkpoint\":{iteration},\"committed\":{committed}}}\n"
        ));
    }

    /// Tell the worker that a line it sent was refused, and why.
    pub fn refuse(&self, problem: &str) {
        let problem: String = problem.chars().take(MAX_ACK_ERROR_CHARS).collect();
        let line = serde_json::json!({ "error": problem }).to_string() + "\n";
        self.write_line(&line);
    }

    /// One `write`: whole, or (pipe full, nobody reading) not at all.
    fn write_line(&self, line: &str) {
        use std::io::Write;
        if let Err(e) = (&self.file).write(line.as_bytes()) {
            tracing::debug!(path = %self.path.display(), "ack line dropped: {e}");
        }
    }
}

impl Drop for AckPipe {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Make a FIFO at `path`, replacing whatever stale file is there.
fn make_fifo(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    nix::unistd::mkfifo(path, Mode::from_bits_truncate(0o600)).map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("creating the FIFO {}: {e}", path.display()),
        )
    })
}

/// Why a channel line was not taken; the worker hears it on its ack pipe, the log gets it too.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// `quoted`: the start of the line, quoted.
    #[error("not a channel message ({source}): {quoted}")]
    Json {
        #[source]
        source: serde_json::Error,
        quoted: String,
    },
    #[error("not a channel message (a message and its checkpoint and progress are JSON objects): {quoted}")]
    NotObjects { quoted: String },
    #[error("a line longer than {MAX_LINE_BYTES} bytes was skipped")]
    LineTooLong,
    #[error("reading the channel: {0}")]
    Read(#[source] io::Error),
}

/// Parse one channel line (without its newline) into a message; the error quotes its start.
pub fn parse_message(line: &str) -> Result<Message, ChannelError> {
    let quote = || {
        let start: String = line.chars().take(200).collect();
        format!("{start:?}")
    };
    let value: Value = serde_json::from_str(line).map_err(|source| ChannelError::Json {
        source,
        quoted: quote(),
    })?;
    // serde would read a struct from an array by position; messages have named fields.
    let objects_where_expected = value.is_object()
        && ["checkpoint", "progress"].iter().all(|field| {
            value
                .get(field)
                .is_none_or(|v| v.is_null() || v.is_object())
        });
    if !objects_where_expected {
        return Err(ChannelError::NotObjects { quoted: quote() });
    }
    // Parsed again from the text, so that a field given twice is refused.
    serde_json::from_str(line).map_err(|source| ChannelError::Json {
        source,
        quoted: quote(),
    })
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;

    use super::AckPipe;

    /// A reader of the pipe as a helper opens it: read-only, non-blocking.
    fn open_reader(pipe: &AckPipe) -> std::fs::File {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(pipe.path())
            .expect("opening the ack pipe for reading")
    }

    fn read_all(reader: &mut std::fs::File) -> String {
        let mut text = String::new();
        let mut buf = [0u8; 65536];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => text.push_str(std::str::from_utf8(&buf[..n]).expect("UTF-8")),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("reading the ack pipe: {e}"),
            }
        }
        text
    }

    #[test]
    fn answers_are_whole_lines_and_a_full_pipe_drops_them_without_blocking() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let pipe = AckPipe::create(&dir.path().join("ack")).expect("creating the ack pipe");
        let mut reader = open_reader(&pipe);
        pipe.acknowledge(7, 6);
        pipe.refuse("not a channel message: \"x\"");
        assert_eq!(
            read_all(&mut reader),
            "{\"checkpoint\":7,\"committed\":6}\n{\"error\":\"not a channel message: \\\"x\\\"\"}\n"
        );
        // Nobody reads: far more than the pipe holds; this must return, with whole lines kept.
        for n in 0..20_000 {
            pipe.acknowledge(n, n);
        }
        let kept = read_all(&mut reader);
        let lines: Vec<&str> = kept.lines().collect();
        assert!(lines.len() < 20_000, "{} answers kept", lines.len());
        for (n, line) in lines.iter().enumerate() {
            assert_eq!(*line, format!("{{\"checkpoint\":{n},\"committed\":{n}}}"));
        }
        // Room again: the next answer gets through.
        pipe.acknowledge(20_000, 20_000);
        assert_eq!(
            read_all(&mut reader),
            "{\"checkpoint\":20000,\"committed\":20000}\n"
        );
    }

    #[test]
    fn a_long_refusal_is_cut_to_fit_one_atomic_write() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let pipe = AckPipe::create(&dir.path().join("ack")).expect("creating the ack pipe");
        let mut reader = open_reader(&pipe);
        pipe.refuse(&"\u{1}".repeat(10_000));
        let line = read_all(&mut reader);
        assert!(line.len() <= 4096, "{} bytes", line.len());
        let answer: serde_json::Value = serde_json::from_str(&line).expect("one JSON line");
        assert!(answer["error"].is_string());
    }
}
