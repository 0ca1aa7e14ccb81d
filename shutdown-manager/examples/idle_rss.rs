//! Measures the idle footprint of the shutdown manager: serves on 127.0.0.1 (port 0) on
//! a current-thread runtime, answers one `/healthz`, idles for a second and prints
//! `VmRSS` / `VmHWM` from `/proc/self/status`.
//!
//! `cargo run --release -p marin3r-shutdown-manager --example idle_rss [-- --multi-thread]`
//! (`--multi-thread`: a default multi-thread runtime instead, for comparison).

use std::time::Duration;

use marin3r_shutdown_manager::{Config, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn status_field(name: &str) -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(name))
                .map(|l| l.trim_start_matches(name).trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let multi_thread = std::env::args().any(|a| a == "--multi-thread");
    let runtime = if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    };
    println!(
        "runtime:            {}",
        if multi_thread {
            "multi-thread"
        } else {
            "current-thread"
        }
    );
    runtime.block_on(async {
        let dir = std::env::temp_dir().join(format!("idle-rss-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let config = Config {
            port: 0,
            bind_address: "127.0.0.1".parse()?,
            ready_file: dir.join("shutdown-ok"),
            ..Config::default()
        };
        let listener = tokio::net::TcpListener::bind((config.bind_address, 0)).await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, config, async move {
            let _ = stopped.await;
        }));

        tokio::time::sleep(Duration::from_millis(100)).await;
        println!("started:            VmRSS {}", status_field("VmRSS:"));

        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        if !response.starts_with("HTTP/1.1 200") {
            return Err(format!("unexpected /healthz answer: {response}").into());
        }

        tokio::time::sleep(Duration::from_secs(1)).await;
        println!("idle after 1s:      VmRSS {}", status_field("VmRSS:"));
        println!("peak:               VmHWM {}", status_field("VmHWM:"));

        let _ = stop.send(());
        server.await??;
        std::fs::remove_dir_all(&dir)?;
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}
