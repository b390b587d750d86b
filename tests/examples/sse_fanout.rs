//! SSE fan-out benchmark: how many idle event streams (or long polls) one
//! `meatspace-api-server` holds, and its memory while holding them. It
//! prints figures; it asserts nothing about speed.
//!
//! ```text
//! scripts/sse-fanout.sh [STREAMS] [sse|longpoll] [HTTP2_CONNECTIONS]   # default 10000 sse
//! ```
//!
//! With `HTTP2_CONNECTIONS` (`--http2 N`), the streams are requests of N
//! HTTP/2 connections (prior knowledge, as a client multiplexing its
//! requests would hold them) instead of one HTTP/1.1 connection each.
//!
//! In `longpoll` mode each connection sends `GET …/events?after=<last>&wait=30` (the longest wait)
//! instead and waits in the server's feed hub (counted by the
//! `meatspace_long_polls_waiting` gauge) until the cancel answers it.
//!
//! The script raises the open-file limit (`ulimit -n`), builds the server
//! and this example in release mode and runs it. By hand:
//! `sse_fanout [--streams N] [--mode sse|longpoll] [--server PATH]` (default:
//! `MEATSPACE_API_SERVER_BIN`, else the `meatspace-api-server` next to the
//! `examples/` directory).
//!
//! It starts the binary on the embedded SQLite default (a temporary data
//! directory, a free 127.0.0.1 port, `RUST_LOG=warn`), creates one task,
//! publishes it, prints the server's resident memory (`VmRSS`) at idle,
//! opens N streams of that task's feed (`GET /api/v1/tasks/{id}/events/stream`,
//! one TCP connection each, 256 opening at a time, each until it has read
//! `task.published`), prints the memory and thread count again with every
//! stream idle, then cancels the task and measures how long until every
//! stream has received `task.cancelled` (the fan-out: one commit wakes N
//! streams through the process-wide hub; each reads the database once). The database pool stays at its
//! configured size throughout: idle streams hold no connection.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use meatspace_tests::process::{Binary, DevApi, free_port, until_ready};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn status_field(pid: u32, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .map(|l| l[field.len()..].trim().to_owned())
        .unwrap_or_default()
}

/// Reads until `marker` has arrived; false if the stream ended first.
async fn read_until(s: &mut TcpStream, buf: &mut Vec<u8>, marker: &str) -> bool {
    let mut chunk = [0u8; 1024];
    loop {
        if String::from_utf8_lossy(buf).contains(marker) {
            return true;
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The server's `meatspace_long_polls_waiting` gauge.
async fn long_polls_waiting(client: &reqwest::Client, base: &str) -> usize {
    let Ok(response) = client.get(format!("{base}/metrics")).send().await else {
        return 0;
    };
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("meatspace_long_polls_waiting "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as usize)
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

#[tokio::main]
async fn main() {
    let streams: usize = arg("--streams")
        .map(|s| s.parse().expect("--streams N"))
        .unwrap_or(10_000);
    let long_poll = match arg("--mode").as_deref() {
        None | Some("sse") => false,
        Some("longpoll") => true,
        Some(other) => panic!("--mode sse|longpoll, not {other}"),
    };
    // HTTP/2 with prior knowledge: the streams share this many connections.
    let http2_connections: Option<usize> =
        arg("--http2").map(|s| s.parse().expect("--http2 CONNECTIONS"));
    let server = arg("--server")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Binary::ApiServer.path());
    let dir = tempfile::tempdir().expect("temporary directory");
    let addr = format!("127.0.0.1:{}", free_port());
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let dev_key = "msd_sse-fanout-benchmark-key-0123456789";
    let mut child = tokio::process::Command::new(&server)
        .env_clear()
        .env("MEATSPACE_DATA_DIR", dir.path())
        .env("MEATSPACE_DEV_KEY", dev_key)
        .env("MEATSPACE_LISTEN_ADDR", &addr)
        .env("MEATSPACE_METRICS_LISTEN_ADDR", &metrics_addr)
        .env("RUST_LOG", "warn")
        // Every stream uses the one task's token: no per-credential limit,
        // and no cap on the streams of one token or address.
        .env("MEATSPACE_RATE_LIMIT_PER_SECOND", "0")
        .env("MEATSPACE_MAX_STREAMS_PER_CREDENTIAL", "1000000")
        .env("MEATSPACE_MAX_STREAMS_PER_ADDRESS", "1000000")
        // Allocator tuning passes through (e.g. MALLOC_ARENA_MAX=2).
        .envs(std::env::vars().filter(|(k, _)| k.starts_with("MALLOC_")))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", server.display()));
    let pid = child.id().expect("pid");
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let base = format!("http://{addr}");
    until_ready(&base, Duration::from_secs(60)).await;
    let api = DevApi::new(&base, dev_key);
    let (id, token) = api.create_task("fan-out benchmark").await;
    // Published first, so every stream starts by reading one event.
    api.agent_post(&token, id, "publish").await;
    println!(
        "server idle: VmRSS {}, threads {}, open fds {}",
        status_field(pid, "VmRSS:"),
        status_field(pid, "Threads:"),
        open_fds(pid)
    );

    // Open the streams.
    // The feed's newest event id: a long poll after it waits.
    let last = api
        .events(&token, id, "after=0")
        .await
        .last()
        .and_then(|event| event["id"].as_i64())
        .expect("the published task has events");
    let request = Arc::new(if long_poll {
        format!(
            "GET /api/v1/tasks/{id}/events?after={last}&wait=30 HTTP/1.1\r\nHost: {addr}\r\n\
             Authorization: Bearer {token}\r\n\r\n"
        )
    } else {
        format!(
            "GET /api/v1/tasks/{id}/events/stream HTTP/1.1\r\nHost: {addr}\r\n\
             Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
        )
    });
    let gate = Arc::new(Semaphore::new(256));
    let opened = Arc::new(AtomicUsize::new(0));
    let got_event = Arc::new(AtomicUsize::new(0));
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<Result<(), String>>(streams);
    let started = Instant::now();
    let http2_clients: Vec<reqwest::Client> = (0..http2_connections.unwrap_or(0))
        .map(|_| {
            reqwest::Client::builder()
                .no_proxy()
                .http2_prior_knowledge()
                .build()
                .unwrap()
        })
        .collect();
    for i in 0..streams {
        if !http2_clients.is_empty() {
            let client = http2_clients[i % http2_clients.len()].clone();
            let url = if long_poll {
                format!("{base}/api/v1/tasks/{id}/events?after={last}&wait=30")
            } else {
                format!("{base}/api/v1/tasks/{id}/events/stream")
            };
            let (token, gate, opened, got_event, ready) = (
                token.clone(),
                gate.clone(),
                opened.clone(),
                got_event.clone(),
                ready_tx.clone(),
            );
            tokio::spawn(async move {
                let permit = gate.acquire_owned().await.unwrap();
                let response = match client.get(url).bearer_auth(token).send().await {
                    Ok(r) if r.status() == 200 => r,
                    Ok(r) => return ready.send(Err(r.status().to_string())).await.unwrap_or(()),
                    Err(e) => return ready.send(Err(e.to_string())).await.unwrap_or(()),
                };
                let mut body = response.bytes_stream();
                let mut buf = Vec::new();
                let mut until = async |marker: &str| {
                    use futures::StreamExt;
                    while !String::from_utf8_lossy(&buf).contains(marker) {
                        match body.next().await {
                            Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
                            _ => return false,
                        }
                    }
                    true
                };
                if !long_poll && !until("event: task.published").await {
                    return ready.send(Err("no first event".into())).await.unwrap_or(());
                }
                opened.fetch_add(1, Ordering::Relaxed);
                drop(permit);
                let _ = ready.send(Ok(())).await;
                if until("task.cancelled").await {
                    got_event.fetch_add(1, Ordering::Relaxed);
                }
                std::future::pending::<()>().await
            });
            continue;
        }
        let (request, gate, opened, got_event, ready) = (
            request.clone(),
            gate.clone(),
            opened.clone(),
            got_event.clone(),
            ready_tx.clone(),
        );
        let addr = addr.clone();
        tokio::spawn(async move {
            let permit = gate.acquire_owned().await.unwrap();
            let mut s = match TcpStream::connect(&addr).await {
                Ok(s) => s,
                Err(e) => return ready.send(Err(e.to_string())).await.unwrap_or(()),
            };
            if let Err(e) = s.write_all(request.as_bytes()).await {
                return ready.send(Err(e.to_string())).await.unwrap_or(());
            }
            let mut buf = Vec::with_capacity(1024);
            if long_poll {
                // The answer comes only with the cancel; the main task waits
                // for the server's gauge to count every poll as waiting.
                opened.fetch_add(1, Ordering::Relaxed);
                drop(permit);
                let _ = ready.send(Ok(())).await;
                if read_until(&mut s, &mut buf, "task.cancelled").await {
                    got_event.fetch_add(1, Ordering::Relaxed);
                }
                return std::future::pending::<()>().await;
            }
            let mut chunk = [0u8; 1024];
            // The response head.
            loop {
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => {
                        return ready
                            .send(Err("closed before the head".into()))
                            .await
                            .unwrap_or(());
                    }
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
                if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            if !buf.starts_with(b"HTTP/1.1 200") {
                let head = String::from_utf8_lossy(&buf[..buf.len().min(80)]).into_owned();
                return ready.send(Err(head)).await.unwrap_or(());
            }
            // The first event (the stream's first database read), then idle.
            // Holding the permit until then bounds the reads in flight.
            if !read_until(&mut s, &mut buf, "event: task.published").await {
                return ready.send(Err("no first event".into())).await.unwrap_or(());
            }
            opened.fetch_add(1, Ordering::Relaxed);
            drop(permit);
            let _ = ready.send(Ok(())).await;
            if read_until(&mut s, &mut buf, "event: task.cancelled").await {
                got_event.fetch_add(1, Ordering::Relaxed);
            }
            // Hold the connection until the program ends.
            std::future::pending::<()>().await;
        });
    }
    drop(ready_tx);
    let mut failures = 0;
    let mut first_failure = None;
    for _ in 0..streams {
        match ready_rx.recv().await {
            Some(Ok(())) => {}
            Some(Err(e)) => {
                failures += 1;
                first_failure.get_or_insert(e);
            }
            None => break,
        }
    }
    let open = opened.load(Ordering::Relaxed);
    println!(
        "opened {open} of {streams} streams in {:.1} s ({failures} failed{})",
        started.elapsed().as_secs_f64(),
        first_failure
            .map(|e| format!(", first: {e}"))
            .unwrap_or_default()
    );
    if long_poll {
        // Every poll has read its (empty) page and waits in the feed hub.
        let give_up = Instant::now() + Duration::from_secs(120);
        loop {
            let waiting = long_polls_waiting(&client, &format!("http://{metrics_addr}")).await;
            if waiting >= open {
                break;
            }
            assert!(
                Instant::now() < give_up,
                "only {waiting} of {open} long polls are waiting"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // A benchmark, not a test: let the allocator settle before reading RSS.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = status_field(pid, "VmRSS:");
    println!(
        "server with {open} idle {}{}: VmRSS {rss}, threads {}, open fds {}",
        if long_poll { "long polls" } else { "streams" },
        http2_connections
            .map(|n| format!(" over {n} HTTP/2 connections"))
            .unwrap_or_default(),
        status_field(pid, "Threads:"),
        open_fds(pid)
    );

    // Fan-out: one event to every stream (the terminal one: the streams end).
    let t0 = Instant::now();
    api.agent_post(&token, id, "cancel").await;
    let give_up = Instant::now() + Duration::from_secs(120);
    while got_event.load(Ordering::Relaxed) < open && Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    println!(
        "fan-out: {} of {open} streams received task.cancelled within {:.0} ms of the cancel",
        got_event.load(Ordering::Relaxed),
        t0.elapsed().as_secs_f64() * 1000.0
    );
    println!(
        "server after the fan-out: VmRSS {}, peak VmHWM {}",
        status_field(pid, "VmRSS:"),
        status_field(pid, "VmHWM:")
    );
    let _ = child.start_kill();
    let _ = child.wait().await;
}
