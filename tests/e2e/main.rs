//! End-to-end tests: the real `cairn` binary (and, where a fault must be injected at a file
//! operation, the daemon in this process) run against temporary queues, with real child
//! processes and real signals; also the benchmarks, the examples and the systemd units as a
//! user meets them. One binary, one module per area, sharing the helpers in `tests/common`.
//!
//! Run one area with `cargo test --test e2e crash::`, one test with its full name.

// Each scenario reads as one story; the line limit is for the library's functions.
#![allow(clippy::too_many_lines)]

#[path = "../common/mod.rs"]
mod common;

mod bench_checkpoint;
mod bench_queue;
mod bench_web;
mod budget;
mod budget_pause;
mod bulk;
mod checkpoint_files;
mod cli;
mod cli_as_root;
mod cli_inspect;
mod cli_status;
#[cfg(feature = "postgres")]
mod cluster;
mod commands;
mod control;
#[cfg(feature = "postgres")]
mod control_parity;
mod crash;
mod crash_blame;
mod daemon_faults;
mod disk_full;
mod examples;
mod failures;
mod frozen_start;
mod hostile_names;
mod intake;
mod intake_fairness;
mod items;
mod log_bound;
mod numbers;
mod operator;
#[cfg(feature = "postgres")]
mod postgres_backend;
#[cfg(feature = "postgres")]
mod postgres_budget;
#[cfg(feature = "postgres")]
mod postgres_cli;
#[cfg(feature = "postgres")]
mod postgres_faults;
#[cfg(feature = "postgres")]
mod postgres_intake;
#[cfg(feature = "postgres")]
mod postgres_leases;
#[cfg(feature = "postgres")]
mod postgres_roles;
mod queue_modes;
mod run_as_submitter;
mod service;
mod spawn_exhaustion;
mod spawn_path;
mod stop_resume;
mod strace;
mod submitter_limits;
mod systemd_units;
mod task_environment;
mod task_limits;
mod torture_quick;
mod web_browser;
mod web_dashboard;
mod web_metrics;
#[cfg(feature = "postgres")]
mod web_postgres;
mod worker;
mod worker_ack;
mod worker_channel;
