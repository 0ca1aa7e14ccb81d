//! Runs one CPU-bound core N times on one thread, for instruction-count profiles:
//! `valgrind --tool=callgrind target/release/examples/cores_loop review 2000`.
//! `injection` = `mutate_pod` on the realistic Pod; `review` = the whole AdmissionReview
//! path (parse, plan, patch, base64, serialise).
#![allow(clippy::print_stdout)]

use std::hint::black_box;

use anyhow::{Context as _, Result, bail};
use marin3r_bench::webhook::{realistic_pod, realistic_review};
use marin3r_sidecar::{Defaults, mutate_pod};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let core = args.next().unwrap_or_else(|| "review".into());
    let n: u32 = args
        .next()
        .unwrap_or_else(|| "2000".into())
        .parse()
        .context("N must be an integer")?;
    let defaults = Defaults::default();
    match core.as_str() {
        "injection" => {
            let pod = realistic_pod();
            for _ in 0..n {
                black_box(mutate_pod(black_box(&pod), Some("default"), &defaults)?);
            }
        }
        "review" => {
            let body = serde_json::to_vec(&realistic_review())?;
            for _ in 0..n {
                let (out, _) = marin3r_webhook::admission::mutate(black_box(&body), &defaults)
                    .map_err(|e| anyhow::anyhow!("admission: {e}"))?;
                black_box(out.to_json()?);
            }
        }
        other => bail!("unknown core {other:?}: injection or review"),
    }
    println!("{core} x {n}");
    Ok(())
}
