//! What `/proc` says of a process the benchmarks started: its CPU time and peak memory.

use std::fs;

use anyhow::Context;

use super::round_to;

/// CPU time of a process (or thread), and of its reaped children (user + system), in ms.
pub(super) struct CpuTimes {
    pub(super) user_ms: f64,
    pub(super) system_ms: f64,
    pub(super) children_ms: f64,
}

/// [`CpuTimes`] from a `stat` file of `/proc` (a process's or one thread's).
#[allow(unsafe_code)] // sysconf has no safe wrapper in nix for the clock tick
pub(super) fn cpu_times(path: &str) -> anyhow::Result<CpuTimes> {
    let stat = fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    // Fields after the command name, which is in parentheses and may hold spaces: utime,
    // stime, cutime and cstime are fields 14 to 17 of the whole line, 12 to 15 of these.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<f64> = after_name
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(|f| f.parse().unwrap_or(f64::NAN))
        .collect();
    anyhow::ensure!(
        fields.len() == 4 && fields.iter().all(|f| f.is_finite()),
        "{path} has no CPU times"
    );
    // SAFETY: sysconf with a constant.
    let ticks = unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) } as f64;
    let ms = |t: f64| round_to(t * 1000.0 / ticks, 1);
    Ok(CpuTimes {
        user_ms: ms(fields[0]),
        system_ms: ms(fields[1]),
        children_ms: ms(fields[2] + fields[3]),
    })
}

/// The peak resident memory so far (`VmHWM`) of process `pid`, in MiB.
pub(super) fn peak_rss_mib(pid: i32) -> anyhow::Result<f64> {
    let path = format!("/proc/{pid}/status");
    let status = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .ok()
        })
        .with_context(|| format!("{path} has no VmHWM line"))?;
    Ok(round_to(kib / 1024.0, 1))
}
