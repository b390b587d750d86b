//! A real headless Chromium for the web app suites, driven over WebDriver.
//!
//! [`Chromedriver::start`] runs Debian's `chromedriver` on a free port of
//! 127.0.0.1 (killed when dropped); [`Chromedriver::browser`] opens a new
//! Chromium session, headless, with a 360 px wide viewport like a small
//! phone. A missing `chromedriver` or `chromium` is a test failure: `.ci/run`
//! installs both.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

/// Width of the phone-sized viewport, in CSS pixels.
pub const PHONE_WIDTH: u32 = 360;
const PHONE_HEIGHT: u32 = 780;
/// Bound on every wait for the page: generous for a busy 2-core CI.
pub const WAIT: Duration = Duration::from_secs(30);

/// A running chromedriver.
#[derive(Debug)]
pub struct Chromedriver {
    url: String,
    child: tokio::process::Child,
}

impl Chromedriver {
    /// Starts chromedriver on a free port. The port is free when chosen but
    /// another test's process may take it first; chromedriver then exits,
    /// and it is started again on another port.
    pub async fn start() -> Chromedriver {
        for _ in 0..5 {
            if let Some(driver) = Chromedriver::start_once().await {
                return driver;
            }
        }
        panic!("chromedriver exited at start five times (no free port?)");
    }

    /// `None` when chromedriver exited before it was ready.
    async fn start_once() -> Option<Chromedriver> {
        let port = crate::process::free_port();
        let mut child = tokio::process::Command::new("chromedriver")
            .arg(format!("--port={port}"))
            // Its own process group, so that dropping it ends the browsers
            // it started too (see Drop).
            .process_group(0)
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("start chromedriver ({e}): install Debian's chromium and chromium-driver (.ci/run does)")
            });
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client");
        let what = format!("chromedriver ready on {url}");
        let ready = crate::eventually(WAIT, &what, || {
            let exited = matches!(child.try_wait(), Ok(Some(_)));
            let (http, url) = (&http, &url);
            async move {
                if exited {
                    return Some(false);
                }
                let body = http.get(format!("{url}/status")).send().await.ok()?;
                let v = body.json::<Value>().await.ok()?;
                (v["value"]["ready"] == json!(true)).then_some(true)
            }
        })
        .await;
        ready.then_some(Chromedriver { url, child })
    }

    /// A new headless Chromium with a phone-sized viewport.
    pub async fn browser(&self, base_url: &str) -> Browser {
        self.open(base_url, None).await
    }

    /// A new headless Chromium as a desktop browser, `width` by `height`.
    pub async fn desktop(&self, base_url: &str, width: u32, height: u32) -> Browser {
        self.open(base_url, Some((width, height))).await
    }

    async fn open(&self, base_url: &str, desktop: Option<(u32, u32)>) -> Browser {
        let mut args: Vec<String> = [
            "--headless=new",
            "--no-sandbox",
            "--disable-dev-shm-usage",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
        ]
        .map(String::from)
        .to_vec();
        let mut options = json!({ "binary": chromium_binary() });
        match desktop {
            Some((width, height)) => args.push(format!("--window-size={width},{height}")),
            None => {
                options["mobileEmulation"] = json!({
                    "deviceMetrics": { "width": PHONE_WIDTH, "height": PHONE_HEIGHT, "pixelRatio": 1.0, "touch": true }
                });
            }
        }
        options["args"] = json!(args);
        let mut caps = serde_json::Map::new();
        caps.insert("goog:chromeOptions".into(), options);
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("open a Chromium session");
        Browser {
            client,
            base_url: base_url.to_owned(),
        }
    }
}

fn chromium_binary() -> &'static str {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| std::path::Path::new(p).is_file())
        .expect("chromium is not installed: .ci/run installs Debian's chromium")
}

/// Where the page screenshots go: `target/web-screenshots` (next to the
/// build output), or `MEATSPACE_SCREENSHOT_DIR`.
pub fn screenshot_dir() -> PathBuf {
    let dir = std::env::var_os("MEATSPACE_SCREENSHOT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let exe = std::env::current_exe().expect("test binary path");
            exe.ancestors()
                .nth(3)
                .expect("target directory")
                .join("web-screenshots")
        });
    std::fs::create_dir_all(&dir).expect("create the screenshot directory");
    dir
}

impl Drop for Chromedriver {
    /// Kills chromedriver and the Chromium processes it started (its
    /// process group), also when a test panics before closing its sessions.
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A Chrome DevTools Protocol command, sent as chromedriver's extension
/// command `POST /session/{id}/goog/cdp/execute`.
#[derive(Debug)]
struct Cdp {
    cmd: String,
    params: Value,
}

impl fantoccini::wd::WebDriverCompatibleCommand for Cdp {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        let session = session_id.unwrap_or_default();
        base_url.join(&format!("session/{session}/goog/cdp/execute"))
    }

    fn method_and_body(&self, _request_url: &url::Url) -> (http::Method, Option<String>) {
        let body = json!({ "cmd": self.cmd, "params": self.params }).to_string();
        (http::Method::POST, Some(body))
    }
}

/// One browser session against one server.
#[derive(Debug)]
pub struct Browser {
    pub client: Client,
    base_url: String,
}

impl Browser {
    /// Opens `path` (or a full URL).
    pub async fn goto(&self, path: &str) {
        let url = if path.starts_with("http") {
            path.to_owned()
        } else {
            format!("{}{path}", self.base_url)
        };
        self.client.goto(&url).await.expect("navigate");
    }

    /// The path of the current page.
    pub async fn path(&self) -> String {
        self.client
            .current_url()
            .await
            .expect("current URL")
            .path()
            .to_owned()
    }

    pub async fn click(&self, css: &str) {
        self.wait_for(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    /// Types `text` into the field `css`.
    pub async fn fill(&self, css: &str, text: &str) {
        let el = self.wait_for(css).await;
        el.clear().await.ok();
        el.send_keys(text)
            .await
            .unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    /// Waits for an element to exist.
    pub async fn wait_for(&self, css: &str) -> fantoccini::elements::Element {
        match self
            .client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::Css(css))
            .await
        {
            Ok(el) => el,
            Err(e) => panic!("no element {css} on {}: {e}", self.path_now().await),
        }
    }

    async fn path_now(&self) -> String {
        self.client
            .current_url()
            .await
            .map(|u| u.to_string())
            .unwrap_or_default()
    }

    /// The text of the element `css`.
    pub async fn text(&self, css: &str) -> String {
        self.wait_for(css).await.text().await.expect("element text")
    }

    /// Whether an element matching `css` exists now.
    pub async fn has(&self, css: &str) -> bool {
        self.client.find(Locator::Css(css)).await.is_ok()
    }

    /// Waits until the text of `css` contains `needle`, without reloading.
    pub async fn wait_for_text(&self, css: &str, needle: &str) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Ok(el) = self.client.find(Locator::Css(css)).await
                && let Ok(t) = el.text().await
                && t.contains(needle)
            {
                return;
            }
            if tokio::time::Instant::now() > deadline {
                let t = self.client.find(Locator::Css(css)).await;
                let t = match t {
                    Ok(el) => el.text().await.unwrap_or_default(),
                    Err(_) => "(absent)".into(),
                };
                panic!("{css} never contained {needle:?}; it holds {t:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs a Chrome DevTools Protocol command in this browser (through
    /// chromedriver's `goog/cdp/execute`) and returns its result.
    pub async fn cdp(&self, cmd: &str, params: Value) -> Value {
        self.client
            .issue_cmd(Cdp {
                cmd: cmd.to_owned(),
                params,
            })
            .await
            .unwrap_or_else(|e| panic!("CDP {cmd}: {e}"))
    }

    /// Makes the browser report this position to the page (the DevTools
    /// geolocation override), as a phone at that place would, and lets the
    /// page ask for it without a prompt.
    pub async fn set_position(&self, latitude: f64, longitude: f64, accuracy: f64) {
        self.cdp(
            "Browser.grantPermissions",
            json!({ "permissions": ["geolocation"], "origin": self.base_url }),
        )
        .await;
        self.cdp(
            "Emulation.setGeolocationOverride",
            json!({ "latitude": latitude, "longitude": longitude, "accuracy": accuracy }),
        )
        .await;
    }

    /// Runs a script and returns its result.
    pub async fn js(&self, script: &str) -> Value {
        self.client
            .execute(script, vec![])
            .await
            .unwrap_or_else(|e| panic!("run {script}: {e}"))
    }

    /// Saves a screenshot of the viewport as `<name>.png` and checks the page
    /// does not scroll sideways at phone width.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        self.assert_no_horizontal_overflow(name).await;
        self.capture(name).await
    }

    /// Saves a screenshot of the viewport as `<name>.png`, at whatever
    /// width the viewport has.
    pub async fn capture(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.expect("screenshot");
        let path = screenshot_dir().join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write the screenshot");
        path
    }

    /// The page is laid out within a viewport `width` pixels wide.
    pub async fn assert_fits(&self, name: &str, width: u32) {
        let v = self
            .js("return [document.documentElement.scrollWidth, window.innerWidth];")
            .await;
        let (scroll, inner) = (v[0].as_u64().unwrap_or(0), v[1].as_u64().unwrap_or(0));
        assert_eq!(
            inner,
            u64::from(width),
            "{name}: the viewport is not {width} px wide"
        );
        assert!(
            scroll <= inner,
            "{name}: the page scrolls sideways at {inner} px (content is {scroll} px wide)"
        );
    }

    /// The page is laid out within the phone's width.
    pub async fn assert_no_horizontal_overflow(&self, name: &str) {
        self.assert_fits(name, PHONE_WIDTH).await;
    }

    /// Ends the browser session.
    pub async fn close(self) {
        self.client.close().await.ok();
    }
}
