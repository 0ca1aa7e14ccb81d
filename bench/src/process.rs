//! Child processes under measurement (`marin3r discovery-service`, `marin3r
//! shutdown-manager`), killed when dropped, and their memory from `/proc/<pid>/status`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use marin3r_tests::KillOnDrop;
use marin3r_tests::xds::localhost;

/// A field of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`, …).
pub fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    let prefix = format!("{field}:");
    let line = text
        .lines()
        .find(|l| l.starts_with(&prefix))
        .ok_or_else(|| anyhow!("{path} has no {field}"))?;
    let value = line[prefix.len()..]
        .split_whitespace()
        .next()
        .ok_or_else(|| anyhow!("{path}: empty {field}"))?;
    Ok(value.parse()?)
}

/// CPU time `pid` used so far (user + system), seconds, from `/proc/<pid>/stat`.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    // The fields after the parenthesised command name start at field 3 (state); utime
    // and stime are fields 14 and 15.
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("{path}: no command name"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| -> Result<u64> {
        Ok(fields
            .get(i)
            .ok_or_else(|| anyhow!("{path}: field {} missing", i + 3))?
            .parse()?)
    };
    // USER_HZ is 100 on Linux.
    Ok((tick(11)? + tick(12)?) as f64 / 100.0)
}

/// Resident set size of `pid`, KiB.
pub fn rss_kib(pid: u32) -> Result<u64> {
    status_kib(pid, "VmRSS")
}

fn free_port() -> Result<u16> {
    marin3r_testkit::free_port().context("free port")
}

fn spawn(name: &str, cmd: &mut Command, log: &Path) -> Result<KillOnDrop> {
    let stderr = std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
    cmd.stdout(Stdio::null()).stderr(Stdio::from(stderr));
    KillOnDrop::spawn(name, cmd).with_context(|| format!("start {name}"))
}

/// Polls `GET http://addr{path}` until it answers 200, while `process` runs.
async fn wait_http_ok(
    process: &mut KillOnDrop,
    addr: SocketAddr,
    path: &str,
    log: &Path,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = process.try_wait() {
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            bail!("{} exited ({status}) while starting:\n{tail}", process.name);
        }
        if let Ok(r) = marin3r_tests::xds::get(addr, path).await
            && r.status == 200
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{} did not answer GET {path} within 30 s", process.name);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `marin3r discovery-service --config-dir …` as a separate process on 127.0.0.1.
pub struct DiscoveryService {
    pub process: KillOnDrop,
    pub xdss: SocketAddr,
    pub metrics: SocketAddr,
    pub log: PathBuf,
}

impl DiscoveryService {
    /// Starts `bin` serving `config_dir` with `certs_dir/{server,ca}` (as written by
    /// `Bundle::write_to`) and waits for `/readyz`. Logs (JSON, INFO, the default) go to
    /// `log`.
    pub async fn start(
        bin: &Path,
        certs_dir: &Path,
        config_dir: &Path,
        log: &Path,
    ) -> Result<Self> {
        Self::launch(bin, certs_dir, log, |cmd| {
            cmd.arg("--config-dir").arg(config_dir);
        })
        .await
    }

    /// Starts `bin` in Kubernetes mode against the API server of `kubeconfig` (its
    /// current context), watching `namespace`, and waits for `/readyz` (the first lists
    /// synced).
    pub async fn start_kubernetes(
        bin: &Path,
        certs_dir: &Path,
        kubeconfig: &Path,
        namespace: &str,
        log: &Path,
    ) -> Result<Self> {
        Self::launch(bin, certs_dir, log, |cmd| {
            cmd.env("KUBECONFIG", kubeconfig)
                .env("WATCH_NAMESPACE", namespace)
                .env_remove("KUBERNETES_SERVICE_HOST")
                .env_remove("KUBERNETES_SERVICE_PORT");
        })
        .await
    }

    async fn launch(
        bin: &Path,
        certs_dir: &Path,
        log: &Path,
        mode: impl FnOnce(&mut Command),
    ) -> Result<Self> {
        let xdss = localhost(free_port()?);
        let metrics = localhost(free_port()?);
        let health = localhost(free_port()?);
        let mut cmd = Command::new(bin);
        cmd.arg("discovery-service");
        mode(&mut cmd);
        cmd.args(["--xdss-bind-address", "127.0.0.1", "--xdss-port"])
            .arg(xdss.port().to_string())
            .arg("--server-certificate-path")
            .arg(certs_dir.join("server"))
            .arg("--ca-certificate-path")
            .arg(certs_dir.join("ca"))
            .arg("--metrics-bind-address")
            .arg(metrics.to_string())
            .arg("--health-probe-bind-address")
            .arg(health.to_string())
            .env_remove("RUST_LOG");
        let mut process = spawn("discovery-service", &mut cmd, log)?;
        wait_http_ok(&mut process, health, "/readyz", log).await?;
        Ok(Self {
            process,
            xdss,
            metrics,
            log: log.to_path_buf(),
        })
    }

    pub fn rss_kib(&self) -> Result<u64> {
        rss_kib(self.process.id())
    }

    /// An error (with the log tail) if the process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        match self.process.try_wait() {
            None => Ok(()),
            Some(status) => {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                bail!(
                    "the discovery service exited ({status}):\n{}",
                    tail.join("\n")
                )
            }
        }
    }
}

/// Resident memory of an idle process, KiB.
#[derive(Debug, Clone)]
pub struct IdleRss {
    /// The program the process runs by then (`/proc/PID/exe`): `marin3r shutdown-manager`
    /// execs `marin3r-shutdown-manager` when that is installed next to it.
    pub exe: PathBuf,
    /// `VmRSS`.
    pub rss: u64,
    /// `RssAnon`: heap, stacks, relocated data (the rest is mapped files: the binary and
    /// its libraries).
    pub anon: u64,
}

/// `marin3r shutdown-manager` on 127.0.0.1: idle RSS one second after its first
/// `/healthz` answer.
pub async fn shutdown_manager_idle_rss(bin: &Path, dir: &Path) -> Result<IdleRss> {
    let addr = localhost(free_port()?);
    let log = dir.join("shutdown-manager.log");
    let mut cmd = Command::new(bin);
    cmd.arg("shutdown-manager")
        .args(["--bind-address", "127.0.0.1", "--port"])
        .arg(addr.port().to_string())
        .args(["--envoy-admin-address", "http://127.0.0.1:9"])
        .arg("--ready-file")
        .arg(dir.join("shutdown-ok"));
    let mut process = spawn("shutdown-manager", &mut cmd, &log)?;
    wait_http_ok(&mut process, addr, "/healthz", &log).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss = IdleRss {
        exe: std::fs::read_link(format!("/proc/{}/exe", process.id()))?,
        rss: rss_kib(process.id())?,
        anon: status_kib(process.id(), "RssAnon")?,
    };
    if let Some(status) = process.try_wait() {
        bail!("the shutdown manager exited ({status})");
    }
    Ok(rss)
}

/// The open-files limit of this process (soft), from `/proc/self/limits`.
pub fn open_files_limit() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/self/limits")?;
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .ok_or_else(|| anyhow!("/proc/self/limits has no open files line"))?;
    let soft = line["Max open files".len()..]
        .split_whitespace()
        .next()
        .ok_or_else(|| anyhow!("bad limits line {line:?}"))?;
    if soft == "unlimited" {
        return Ok(u64::MAX);
    }
    Ok(soft.parse()?)
}
