//! The limits the comparison sets the server beside (`scripts/bench.sh
//! --compare`): what a minimal HTTP server does with the empty poll's
//! answer, and what SQLite itself does with the create's row.
//!
//! - **A bare hyper service** (this program started again with
//!   `--bare-http`): the same answer bytes (status, headers, body) as the
//!   server's empty poll, from a hyper HTTP/1 service on a multi-threaded
//!   tokio runtime with nothing else in the path. The HTTP ceiling of the
//!   machine for this generator, in the server's own stack.
//! - **nginx** (`return 200` with the same body and content type), when
//!   nginx is installed (`scripts/bench.sh` installs it): the other
//!   reference the issue names. The faster of the two is the limit.
//! - **SQLite, natively**: the row the server wrote for one create,
//!   inserted again and again by SQLite's own shell (`sqlite3`, one native
//!   process, one transaction per create) with
//!   the server's pragmas (WAL, `synchronous = NORMAL`, foreign keys). A
//!   create on SQLite is that one `INSERT INTO tasks` in its own
//!   transaction, so this is the database doing exactly the create's work
//!   with no server around it. A second row commits 64 per transaction:
//!   what grouping writes could buy.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{CpuUse, clock_ticks_per_second};

// ---- the bare hyper service ------------------------------------------------------------

/// One recorded HTTP answer: what the bare services repeat.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    /// Headers other than those every server sets itself (date, length).
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    /// Records `response` (its body read whole).
    pub async fn record(response: reqwest::Response) -> Result<Answer> {
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .filter(|(name, _)| {
                !matches!(
                    name.as_str(),
                    "date" | "content-length" | "connection" | "transfer-encoding"
                )
            })
            .filter_map(|(name, value)| {
                Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
            })
            .collect();
        let body = response.bytes().await?.to_vec();
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    fn content_type(&self) -> &str {
        self.headers
            .iter()
            .find(|(n, _)| n == "content-type")
            .map_or("application/octet-stream", |(_, v)| v.as_str())
    }

    /// The answer as a file: the status, then `name: value` lines, an empty
    /// line and the body (what `--bare-http` reads).
    fn write(&self, path: &Path) -> Result<()> {
        let mut text = format!("{}\n", self.status).into_bytes();
        for (name, value) in &self.headers {
            text.extend_from_slice(format!("{name}: {value}\n").as_bytes());
        }
        text.push(b'\n');
        text.extend_from_slice(&self.body);
        std::fs::write(path, text)?;
        Ok(())
    }

    fn read(path: &Path) -> Result<Answer> {
        let text = std::fs::read(path)?;
        let split = text
            .windows(2)
            .position(|w| w == b"\n\n")
            .context("no empty line after the headers")?;
        let head = std::str::from_utf8(&text[..split])?;
        let mut lines = head.lines();
        let status = lines.next().context("no status")?.parse()?;
        let headers = lines
            .filter_map(|l| l.split_once(": "))
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
            .collect();
        Ok(Answer {
            status,
            headers,
            body: text[split + 2..].to_vec(),
        })
    }
}

/// `api_load --bare-http ADDR ANSWER_FILE`: serves the recorded answer to
/// every request until killed. Runs on its own runtime, as the server does
/// (one worker thread per CPU).
pub fn serve_bare(args: &[String]) -> Result<()> {
    let [addr, file] = args else {
        bail!("usage: api_load --bare-http ADDR ANSWER_FILE");
    };
    let answer = Arc::new(Answer::read(Path::new(file))?);
    let addr: std::net::SocketAddr = addr.parse()?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async move {
            let listener = tokio::net::TcpListener::bind(addr).await?;
            loop {
                let (stream, _) = listener.accept().await?;
                let _ = stream.set_nodelay(true);
                let answer = answer.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |_req| {
                        let answer = answer.clone();
                        async move {
                            let mut res = hyper::Response::builder().status(answer.status);
                            for (name, value) in &answer.headers {
                                res = res.header(name, value);
                            }
                            res.body(http_body_util::Full::new(hyper::body::Bytes::from(
                                answer.body.clone(),
                            )))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        })
}

/// A reference HTTP server running as a child process.
pub struct Reference {
    child: tokio::process::Child,
    pub pid: u32,
    pub base_url: String,
}

impl Reference {
    /// This program again, as the bare hyper service of `answer`.
    pub async fn bare_hyper(answer: &Answer, work: &Path) -> Result<Reference> {
        let port = free_port()?;
        let file = work.join("answer.http");
        answer.write(&file)?;
        let mut command = tokio::process::Command::new(std::env::current_exe()?);
        command
            .arg("--bare-http")
            .arg(format!("127.0.0.1:{port}"))
            .arg(&file);
        Reference::start(command, "the bare hyper service", port).await
    }

    /// nginx answering `answer` with `return`, when it is installed.
    pub async fn nginx(answer: &Answer, work: &Path) -> Result<Option<Reference>> {
        let Some(nginx) = super::compare::which("nginx") else {
            return Ok(None);
        };
        let body = std::str::from_utf8(&answer.body).context("the answer is not text")?;
        let port = free_port()?;
        let prefix = work.join("nginx");
        std::fs::create_dir_all(prefix.join("logs"))?;
        let escaped = body.replace('\\', "\\\\").replace('"', "\\\"");
        let conf = format!(
            "daemon off;\nmaster_process on;\nworker_processes auto;\npid {pid};\n\
             error_log {prefix}/logs/error.log warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  access_log off;\n  server_tokens off;\n  keepalive_requests 1000000;\n\
             client_body_temp_path {prefix}/body; proxy_temp_path {prefix}/proxy;\n\
             fastcgi_temp_path {prefix}/fastcgi; uwsgi_temp_path {prefix}/uwsgi; scgi_temp_path {prefix}/scgi;\n\
             server {{\n    listen 127.0.0.1:{port};\n    default_type \"{ct}\";\n\
             location / {{ return {status} \"{escaped}\"; }}\n  }}\n}}\n",
            pid = prefix.join("nginx.pid").display(),
            prefix = prefix.display(),
            ct = answer.content_type(),
            status = answer.status,
        );
        let conf_path = prefix.join("nginx.conf");
        std::fs::write(&conf_path, conf)?;
        let mut command = tokio::process::Command::new(nginx);
        command.arg("-p").arg(&prefix).arg("-c").arg(&conf_path);
        Ok(Some(Reference::start(command, "nginx", port).await?))
    }

    /// Starts `command` (`what` for errors), which is to listen on `port`,
    /// and waits until it does.
    async fn start(
        mut command: tokio::process::Command,
        what: &str,
        port: u16,
    ) -> Result<Reference> {
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {what}"))?;
        let pid = child.id().context("no pid")?;
        let base_url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            if Instant::now() > deadline {
                bail!("the reference server did not listen on {base_url} within 20 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Reference {
            child,
            pid,
            base_url,
        })
    }

    /// The process's CPU, with its children's (nginx's workers).
    pub fn tree_pids(&self) -> Vec<u32> {
        let mut pids = vec![self.pid];
        if let Ok(children) =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", self.pid))
        {
            pids.extend(
                children
                    .split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
        pids
    }

    pub async fn stop(mut self) -> Result<()> {
        // nginx leaves its workers behind on SIGKILL of the master, not on
        // SIGTERM (its fast shutdown): TERM first.
        let _ = tokio::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.pid.to_string())
            .status()
            .await;
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            self.child.kill().await?;
        }
        Ok(())
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

// ---- SQLite, natively --------------------------------------------------------------------

/// The figures of one native run.
pub struct NativeRun {
    pub per_second: f64,
    pub cpu: CpuUse,
}

/// Has SQLite's own shell (`sqlite3`, native code over the C library)
/// insert copies of the newest draft task's row of the file at `path` (the
/// row a create wrote; a fresh id each), `per_transaction` rows per
/// transaction, with the server's pragmas, for about `duration`. Creates
/// per second, and the shell's CPU. The shell parses each INSERT anew
/// (no prepared statement), which costs SQLite a little against the
/// server, never the other way.
pub async fn sqlite_native_create(
    sqlite3: &Path,
    path: &Path,
    duration: Duration,
    per_transaction: usize,
) -> Result<NativeRun> {
    use sqlx::{Column as _, Connection as _, Row as _, TypeInfo as _, ValueRef as _};
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display())).await?;
    let row =
        sqlx::query("SELECT * FROM tasks WHERE state = 'draft' ORDER BY created_at DESC LIMIT 1")
            .fetch_optional(&mut conn)
            .await?
            .context("no draft task (a create) in the database")?;
    let mut columns = Vec::new();
    let mut literals = Vec::new();
    for (i, column) in row.columns().iter().enumerate() {
        columns.push(column.name().to_owned());
        let raw = row.try_get_raw(i)?;
        let literal = if raw.is_null() {
            "NULL".to_owned()
        } else {
            match raw.type_info().name() {
                "INTEGER" => row.try_get::<i64, _>(i)?.to_string(),
                "REAL" => format!("{:?}", row.try_get::<f64, _>(i)?),
                "BLOB" => {
                    let bytes: Vec<u8> = row.try_get(i)?;
                    format!(
                        "X'{}'",
                        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
                    )
                }
                _ => format!("'{}'", row.try_get::<String, _>(i)?.replace('\'', "''")),
            }
        };
        literals.push(literal);
    }
    conn.close().await?;
    let id_column = columns
        .iter()
        .position(|c| c == "id")
        .context("tasks has no id column")?;
    let script = |creates: usize| {
        let mut sql = String::from(
            "PRAGMA journal_mode = WAL;\nPRAGMA synchronous = NORMAL;\nPRAGMA foreign_keys = ON;\nPRAGMA busy_timeout = 5000;\n",
        );
        let head = format!("INSERT INTO tasks ({}) VALUES (", columns.join(", "));
        let mut values = literals.clone();
        for k in 0..creates {
            if k % per_transaction == 0 {
                sql.push_str("BEGIN IMMEDIATE;\n");
            }
            values[id_column] = format!("'{}'", uuid::Uuid::new_v4());
            sql.push_str(&head);
            sql.push_str(&values.join(", "));
            sql.push_str(");\n");
            if k % per_transaction == per_transaction - 1 || k == creates - 1 {
                sql.push_str("COMMIT;\n");
            }
        }
        sql
    };
    let run = |sql: String| async move {
        let mut child = tokio::process::Command::new(sqlite3)
            .arg("-batch")
            .arg("-bail")
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("start sqlite3")?;
        let pid = child.id().context("sqlite3 has no pid")?;
        let mut stdin = child.stdin.take().context("no stdin")?;
        // The script is written first, whole, so the timing is SQLite's.
        let file = tempfile::NamedTempFile::new()?;
        std::fs::write(file.path(), sql.as_bytes())?;
        let started = Instant::now();
        let mut read = tokio::fs::File::open(file.path()).await?;
        let ticks_at = |pid: u32| super::process_ticks(&pid.to_string());
        let cpu_ticks = tokio::spawn(async move {
            let mut last = 0;
            while std::path::Path::new(&format!("/proc/{pid}")).exists() {
                last = last.max(ticks_at(pid));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            last
        });
        tokio::io::copy(&mut read, &mut stdin).await?;
        drop(stdin);
        let output = child.wait_with_output().await?;
        let elapsed = started.elapsed();
        if !output.status.success() {
            bail!(
                "sqlite3 failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok::<_, anyhow::Error>((elapsed, cpu_ticks.await.unwrap_or(0)))
    };
    // Calibrate, then run for about the duration.
    let probe = 2_000;
    let (elapsed, _) = run(script(probe)).await?;
    let creates = ((probe as f64 / elapsed.as_secs_f64()) * duration.as_secs_f64()) as usize;
    let creates = creates.max(probe);
    let (elapsed, ticks) = run(script(creates)).await?;
    let seconds = elapsed.as_secs_f64();
    Ok(NativeRun {
        per_second: creates as f64 / seconds,
        cpu: CpuUse {
            server: 0.0,
            load_generator: ticks as f64 / clock_ticks_per_second() / seconds,
            rest: 0.0,
        },
    })
}
