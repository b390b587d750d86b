//! Photo memory benchmark: the peak resident memory (`VmHWM`) of one
//! `meatspace-api-server` while concurrent worst-case photo uploads are
//! refused or accepted, with the configured limits. It prints figures; it
//! asserts nothing.
//!
//! ```text
//! scripts/photo-memory.sh [UPLOADS]      # default 4 concurrent uploads per case
//! ```
//!
//! By hand: `photo_memory [--uploads N] [--server PATH]` (default:
//! `MEATSPACE_API_SERVER_BIN`, else the `meatspace-api-server` next to
//! the `examples/` directory). Extra
//! `MEATSPACE_*` variables of the environment (e.g.
//! `MEATSPACE_PHOTO_DECODE_MEMORY_BYTES`) pass through to the server.
//!
//! Each case runs on a fresh server (the embedded SQLite default, a
//! temporary data directory, free 127.0.0.1 ports, `RUST_LOG=warn`): one
//! active task, the peak so far read as the baseline, then N identical
//! uploads at once, then the peak again. The cases are the decompression
//! attack (zero-filled PNGs of a few hundred kilobytes that decode to
//! hundreds of megabytes) and the largest photos a phone sends:
//!
//! - 8192 × 8192 RGBA16 PNG (67 MP: over the 40 MP bound, refused from
//!   its header);
//! - 6324 × 6324 RGBA8 PNG (just under 40 MP; 160 MB of pixels: over the
//!   128 MiB decode budget, refused from its header);
//! - 4000 × 3000 RGBA8 PNG (12 MP, 48 MB of pixels: accepted; two decode
//!   at once within the budget, the others wait for room);
//! - 4000 × 3000 JPEG (a phone photo, 36 MB of pixels: accepted).

use std::process::Stdio;
use std::time::Duration;

use meatspace_tests::process::{Binary, DevApi, free_port, until_ready};
use meatspace_tests::server::images;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// `VmHWM` (peak resident set) of `pid`, in MiB.
fn peak_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn jpeg(width: u32, height: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([(x % 251) as u8, (y % 241) as u8, ((x + y) % 239) as u8])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    image::DynamicImage::ImageRgb8(img)
        .write_to(&mut out, image::ImageFormat::Jpeg)
        .unwrap();
    out.into_inner()
}

struct Server {
    child: tokio::process::Child,
    base: String,
    dev_key: String,
    _dir: tempfile::TempDir,
}

async fn start(server: &std::path::Path) -> Server {
    let dir = tempfile::tempdir().expect("temporary directory");
    let addr = format!("127.0.0.1:{}", free_port());
    let dev_key = "msd_photo-memory-benchmark-key-0123456789".to_owned();
    let child = tokio::process::Command::new(server)
        .env_clear()
        .env("MEATSPACE_DATA_DIR", dir.path())
        .env("MEATSPACE_DEV_KEY", &dev_key)
        .env("MEATSPACE_LISTEN_ADDR", &addr)
        .env("MEATSPACE_METRICS_LISTEN_ADDR", "127.0.0.1:0")
        .env("MEATSPACE_RATE_LIMIT_PER_SECOND", "0")
        .env("RUST_LOG", "warn")
        .envs(std::env::vars().filter(|(k, _)| {
            ["MALLOC_", "MEATSPACE_PHOTO_", "MEATSPACE_MAX_PHOTO_"]
                .iter()
                .any(|prefix| k.starts_with(prefix))
        }))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", server.display()));
    let base = format!("http://{addr}");
    until_ready(&base, Duration::from_secs(60)).await;
    Server {
        child,
        base,
        dev_key,
        _dir: dir,
    }
}

#[tokio::main]
async fn main() {
    let uploads: usize = arg("--uploads").map_or(4, |s| s.parse().expect("--uploads N"));
    let server = arg("--server")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Binary::ApiServer.path());
    println!("building the uploads ...");
    let cases: Vec<(&str, &str, Vec<u8>)> = vec![
        (
            "8192x8192 RGBA16 PNG, zero-filled",
            "image/png",
            images::zero_png(8192, 8192, true),
        ),
        (
            "6324x6324 RGBA8 PNG, zero-filled (39.99 MP)",
            "image/png",
            images::zero_png(6324, 6324, false),
        ),
        (
            "4000x3000 RGBA8 PNG, zero-filled",
            "image/png",
            images::zero_png(4000, 3000, false),
        ),
        ("4000x3000 JPEG", "image/jpeg", jpeg(4000, 3000)),
    ];
    println!(
        "{uploads} concurrent uploads per case, a fresh server each; peak RSS = VmHWM of the server\n"
    );
    println!(
        "{:<46} {:>10} {:>14} {:>12} {:>12}",
        "case", "file", "answers", "idle MiB", "peak MiB"
    );
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    for (name, content_type, body) in cases {
        let mut s = start(&server).await;
        let pid = s.child.id().expect("pid");
        let (id, _, token) = DevApi::new(&s.base, &s.dev_key)
            .active_task("Photograph the building", "Ada")
            .await;
        let idle = peak_mib(pid);
        let sends = (0..uploads).map(|_| {
            client
                .post(format!("{}/api/v1/worker/tasks/{id}/photos", s.base))
                .bearer_auth(&token)
                .header("content-type", content_type)
                .body(body.clone())
                .send()
        });
        let answers = futures::future::join_all(sends).await;
        let mut statuses: Vec<u16> = answers
            .iter()
            .map(|r| r.as_ref().map_or(0, |r| r.status().as_u16()))
            .collect();
        statuses.sort_unstable();
        statuses.dedup();
        let peak = peak_mib(pid);
        let answered = format!(
            "{uploads}x {}",
            statuses
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join("/")
        );
        println!(
            "{name:<46} {:>7} KB {answered:>14} {idle:>12.0} {peak:>12.0}",
            body.len() / 1024
        );
        let _ = s.child.kill().await;
    }
}
