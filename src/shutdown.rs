//! How a stop request travels from a signal (or an embedding program) to every running task.
//!
//! Three levels, each implying the ones before it:
//! 1. `stop`: start no new task or iteration; commands in flight may finish their iteration.
//! 2. `terminate`: the stop grace has run out; children get SIGTERM, then SIGKILL.
//! 3. `immediate`: a second signal; children are killed at once, committed work is flushed.

use tokio_util::sync::CancellationToken;

/// A cloneable handle on the daemon's stop state.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    stop: CancellationToken,
    terminate: CancellationToken,
    immediate: CancellationToken,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    /// First signal: drain. Calling it again escalates to [`Shutdown::request_immediate`].
    pub fn request_stop(&self) {
        if self.stop.is_cancelled() {
            self.request_immediate();
        } else {
            self.stop.cancel();
        }
    }

    /// The grace is over: terminate the children still running.
    pub fn request_terminate(&self) {
        self.stop.cancel();
        self.terminate.cancel();
    }

    /// Stop at once.
    pub fn request_immediate(&self) {
        self.stop.cancel();
        self.terminate.cancel();
        self.immediate.cancel();
    }

    pub fn is_stopping(&self) -> bool {
        self.stop.is_cancelled()
    }

    pub fn is_immediate(&self) -> bool {
        self.immediate.is_cancelled()
    }

    pub async fn stopped(&self) {
        self.stop.cancelled().await
    }

    pub async fn terminating(&self) {
        self.terminate.cancelled().await
    }

    pub async fn immediately(&self) {
        self.immediate.cancelled().await
    }
}
