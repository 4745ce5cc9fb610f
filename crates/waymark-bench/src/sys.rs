//! What the bench reads from the operating system: CPU time by thread group (the server's
//! runtime and database threads apart from the clients'), a process's resident memory and its
//! peak, the load average, and the open-file limit that 10,000 subscribers need.

use std::path::Path;

use anyhow::{Context, Result};

/// The name of the server runtime's threads (`server_runtime`), its blocking threads (where
/// the SQLite store's `COMMIT`s run) included. sqlx names each SQLite connection's thread
/// `sqlx-sqlite-worker-N` (the raw baselines', and the store's before it ran its statements in
/// place); both count as the server's CPU.
pub(crate) const SERVER_THREADS: &str = "wm-server";

/// CPU time so far, in nanoseconds, of this process's threads: (server, clients).
/// The server's are its runtime's and its database connections' threads; every other thread
/// (the bench's own runtime, which drives the clients) counts as the clients'. A thread that
/// already ended is not counted, so take it around a phase, not across phases.
pub(crate) fn cpu_split() -> (u64, u64) {
    let (mut server, mut clients) = (0, 0);
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return (0, 0);
    };
    for t in tasks.flatten() {
        let dir = t.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        // `schedstat`: time on the CPU (ns), time waiting for it, time slices.
        let ns: u64 = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        if comm.starts_with(SERVER_THREADS) || comm.starts_with("sqlx-sqlite") {
            server += ns;
        } else {
            clients += ns;
        }
    }
    (server, clients)
}

/// `VmRSS` and `VmHWM` (peak) of a process, in bytes, from `/proc/<pid>/status`.
pub(crate) fn rss(pid: &str) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(Path::new("/proc").join(pid).join("status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("no {name} in /proc/{pid}/status"))?;
        let kb: u64 = line
            .split_whitespace()
            .nth(1)
            .context("malformed status line")?
            .parse()?;
        Ok(kb * 1024)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// The 1-minute load average.
pub(crate) fn load() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}
/// Raises this process's soft open-file limit to its hard limit (children inherit it) and
/// checks that `need` descriptors fit.
pub(crate) fn raise_nofile(need: u64) -> Result<()> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    if let Some(max) = l.maximum
        && l.current.is_none_or(|c| c < max)
    {
        l.current = Some(max);
        setrlimit(Resource::Nofile, l).context("raising RLIMIT_NOFILE")?;
    }
    let have = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    anyhow::ensure!(
        have >= need,
        "this needs {need} open files per process, the limit is {have}: raise it (`ulimit -Hn`) or run with `--quick`"
    );
    Ok(())
}
