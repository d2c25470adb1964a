//! Memory held by file descriptors (ESCAPES case 42, memfd/tmpfs variant), shared by the escape
//! suite (one-shot runs) and the toolsrv suite (prepared runs): the fill script, a sampler of
//! the host's `Shmem:`, and the reading of the script's output.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// `fill(kind, step, total)`: see the script.
pub const FILL_PY: &str = include_str!("../escapes/fill.py");

pub const MIB: u64 = 1 << 20;

/// What a run may add to the host's Shmem beyond its bound: the tool's own small files, and
/// other processes of the machine (other tests) that create shared memory meanwhile. The
/// unbounded case grows by 3 × the bound, far beyond this.
pub const SLACK: u64 = 128 * MIB;

/// The host's `Shmem:` in bytes.
pub fn host_shmem() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("Shmem:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .expect("no Shmem: line in /proc/meminfo")
}

/// Samples the host's Shmem every 5 ms from `start` until `stop`: the peak growth.
pub struct ShmemSampler {
    base: u64,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl ShmemSampler {
    pub fn start() -> ShmemSampler {
        let base = host_shmem();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut peak = base;
            while !flag.load(Ordering::Relaxed) {
                peak = peak.max(host_shmem());
                std::thread::sleep(Duration::from_millis(5));
            }
            peak.max(host_shmem())
        });
        ShmemSampler { base, stop, thread }
    }

    /// The peak growth over the start while it ran.
    pub fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap().saturating_sub(self.base)
    }
}

/// What the fill script printed: the bytes it held at most, the largest Shmem growth it saw
/// itself right after an allocation, how it ended ("stopped ERRNO", "all N", or nothing when
/// it was killed).
#[derive(Debug, Default)]
pub struct Fill {
    pub held: u64,
    pub growth: u64,
    pub stopped: Option<String>,
    pub all: bool,
}

pub fn parse_fill(stdout: &str) -> Fill {
    let mut f = Fill::default();
    for line in stdout.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["held", held, growth] => {
                f.held = f.held.max(held.parse().unwrap());
                f.growth = f.growth.max(growth.parse::<i64>().unwrap().max(0) as u64);
            }
            ["stopped", e] => f.stopped = Some((*e).to_owned()),
            ["all", _] => f.all = true,
            _ => {}
        }
    }
    f
}

/// The fill call as Python source (after the script).
pub fn fill_call(kind: &str, step: u64, total: u64) -> String {
    format!("fill('{kind}', {step}, {total})")
}
