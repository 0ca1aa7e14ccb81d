//! What the numbers were taken on: cores, CPU model, memory, kernel, toolchain, Envoy,
//! and the load average (other work on the machine disturbs every figure).

use std::path::Path;
use std::process::Command;

/// A description of the machine, each field human-readable ("unknown" when unreadable).
#[derive(Debug, Clone)]
pub struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub memory: String,
    pub kernel: String,
    pub rustc: String,
    pub envoy: String,
}

fn first_line_of(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_string())
}

impl Machine {
    /// Reads `/proc` and runs `rustc --version` and `envoy --version`.
    pub fn probe(envoy: Option<&Path>) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kib| kib.parse::<f64>().ok())
            .map(|kib| format!("{:.1} GiB", kib / 1024.0 / 1024.0))
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        let rustc = first_line_of(Command::new("rustc").arg("--version"))
            .unwrap_or_else(|| "unknown".into());
        let envoy = envoy
            .and_then(|bin| first_line_of(Command::new(bin).arg("--version")))
            .map(|v| {
                // "envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL" → "1.40.0 (<sha>…)"
                let version = v
                    .split_once("version:")
                    .map_or(v.as_str(), |(_, r)| r.trim());
                let mut parts = version.split('/');
                match (parts.next(), parts.next()) {
                    (Some(sha), Some(release)) => {
                        format!("{release} ({})", sha.chars().take(12).collect::<String>())
                    }
                    _ => version.to_string(),
                }
            })
            .unwrap_or_else(|| "not found".into());
        Self {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            memory,
            kernel,
            rustc,
            envoy,
        }
    }
}

/// The 1, 5 and 15 minute load averages (`uptime`), from `/proc/loadavg`.
pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some([it.next()??, it.next()??, it.next()??])
}

/// CPU time in clock ticks (USER_HZ): busy time of the whole machine (`/proc/stat`) and
/// of this process plus its reaped children (`/proc/self/stat`: utime, stime, cutime,
/// cstime).
#[derive(Debug, Clone, Copy)]
pub struct CpuTicks {
    at: std::time::Instant,
    machine_busy: u64,
    own: u64,
}

/// The kernel's USER_HZ for `/proc/stat` and `/proc/<pid>/stat` (100 on Linux).
const USER_HZ: f64 = 100.0;

impl CpuTicks {
    pub fn now() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
        let fields: Vec<u64> = cpu
            .split_whitespace()
            .map(|v| v.parse().ok())
            .collect::<Option<_>>()?;
        // user nice system idle iowait irq softirq steal …: busy = all but idle, iowait.
        let total: u64 = fields.iter().take(8).sum();
        let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
        let own_stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the parenthesised command name; utime is field 14 (1-based).
        let rest = own_stat.rsplit_once(')')?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
        // `rest` starts at field 3 (state), so field n is index n - 3.
        let own = tick(11)? + tick(12)? + tick(13)? + tick(14)?;
        Some(Self {
            at: std::time::Instant::now(),
            machine_busy: total.saturating_sub(idle),
            own,
        })
    }

    /// Cores' worth of CPU that processes other than this one (and its reaped children)
    /// used between `earlier` and `self`.
    pub fn others_since(&self, earlier: &Self) -> f64 {
        let secs = self.at.duration_since(earlier.at).as_secs_f64();
        if secs <= 0.0 {
            return 0.0;
        }
        let busy = self.machine_busy.saturating_sub(earlier.machine_busy) as f64;
        let own = self.own.saturating_sub(earlier.own) as f64;
        ((busy - own).max(0.0) / USER_HZ) / secs
    }
}
