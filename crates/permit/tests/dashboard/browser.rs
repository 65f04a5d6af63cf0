//! A headless Chromium driven through chromedriver with plain WebDriver HTTP calls.
//!
//! Both processes are started here, on a free port and with a fresh profile, and killed by PID
//! when the [`Browser`] is dropped (chromium and its helpers: every descendant of our
//! chromedriver, found in `/proc`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Longest chromedriver may take to say which port it listens on.
const DRIVER_START_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest one WebDriver command may take (starting the browser is the slowest).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether the browser tests can run here; the reason when they cannot.
pub fn available() -> Result<(), String> {
    let missing: Vec<&str> =
        [CHROMIUM, CHROMEDRIVER].into_iter().filter(|p| !Path::new(p).exists()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!("{} not installed", missing.join(" and ")))
}

pub struct Browser {
    http: reqwest::Client,
    base: String,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver on a free port and a headless Chromium session of `width`×`height`.
    pub async fn start(width: u32, height: u32) -> Browser {
        let profile = tempfile::tempdir().expect("profile dir");
        let log_path = profile.path().join("chromedriver.log");
        let log = std::fs::File::create(&log_path).expect("driver log");
        let driver = Command::new(CHROMEDRIVER)
            .arg("--port=0")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let http = reqwest::Client::builder().no_proxy().timeout(COMMAND_TIMEOUT).build().unwrap();
        let mut browser = Browser { http, base: String::new(), driver, _profile: profile };
        let port = browser.driver_port(&log_path).await;
        let data_dir = browser._profile.path().join("chromium");
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            &format!("--user-data-dir={}", data_dir.display()),
            &format!("--window-size={width},{height}"),
        ];
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": CHROMIUM, "args": args },
            "goog:loggingPrefs": { "browser": "ALL" },
            "unhandledPromptBehavior": "ignore",
        }}});
        let root = format!("http://127.0.0.1:{port}");
        let answer = browser.call_at(&format!("{root}/session"), "POST", Some(capabilities)).await;
        let session =
            answer["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {answer}")).to_owned();
        browser.base = format!("{root}/session/{session}");
        browser
    }

    async fn driver_port(&mut self, log: &Path) -> u16 {
        let deadline = Instant::now() + DRIVER_START_TIMEOUT;
        while Instant::now() < deadline {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if let Some(rest) = text.split("started successfully on port ").nth(1) {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                if let Ok(port) = digits.parse() {
                    return port;
                }
            }
            if let Ok(Some(status)) = self.driver.try_wait() {
                panic!("chromedriver exited with {status}: {text}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("chromedriver did not start within {DRIVER_START_TIMEOUT:?}");
    }

    async fn call_at(&self, url: &str, method: &str, body: Option<Value>) -> Value {
        match self.try_call_at(url, method, body).await {
            Ok(value) => value,
            Err(failure) => panic!("{failure}"),
        }
    }

    /// One WebDriver command; its failure as text (method, URL, status, WebDriver's error).
    async fn try_call_at(&self, url: &str, method: &str, body: Option<Value>) -> Result<Value, String> {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self.http.request(method.clone(), url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        let status = response.status();
        let value: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            return Err(format!("{method} {url}: {status} {value}"));
        }
        Ok(value["value"].clone())
    }

    /// Finds `css` and runs `commands` on the element, finding it again when the page replaced
    /// it in between (the dashboard re-renders its tables on every refresh, so an element found
    /// a moment ago can be gone: WebDriver's "stale element reference"). Bounded.
    async fn on_element(&self, css: &str, commands: &[(&str, Value)]) {
        const ATTEMPTS: usize = 5;
        for attempt in 1..=ATTEMPTS {
            let id = self.element(css).await;
            let mut stale = None;
            for (command, body) in commands {
                let url = format!("{}/element/{id}/{command}", self.base);
                match self.try_call_at(&url, "POST", Some(body.clone())).await {
                    Ok(_) => {}
                    Err(failure) if failure.contains("stale element reference") => {
                        stale = Some(failure);
                        break;
                    }
                    Err(failure) => panic!("{failure}"),
                }
            }
            match stale {
                None => return,
                Some(failure) if attempt == ATTEMPTS => panic!("{css} stayed stale: {failure}"),
                Some(_) => {
                    eprintln!("{css} was replaced by a re-render (attempt {attempt}); finding it again")
                }
            }
        }
    }

    /// One WebDriver command of this session.
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.call_at(&format!("{}{path}", self.base), method, body).await
    }

    pub async fn goto(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url }))).await;
    }

    /// Runs `script` (a function body) in the page and returns its value.
    pub async fn eval(&self, script: &str) -> Value {
        self.call("POST", "/execute/sync", Some(json!({ "script": script, "args": [] }))).await
    }

    async fn element(&self, css: &str) -> String {
        let found =
            self.call("POST", "/element", Some(json!({ "using": "css selector", "value": css }))).await;
        found
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .expect("element id")
            .to_owned()
    }

    pub async fn click(&self, css: &str) {
        self.on_element(css, &[("click", json!({}))]).await;
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        self.on_element(css, &[("clear", json!({})), ("value", json!({ "text": text }))]).await;
    }

    pub async fn accept_alert(&self) {
        self.call("POST", "/alert/accept", Some(json!({}))).await;
    }

    pub async fn resize(&self, width: u32, height: u32) {
        self.call("POST", "/window/rect", Some(json!({ "width": width, "height": height }))).await;
    }

    /// Saves a PNG of the viewport to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let encoded = self.call("GET", "/screenshot", None).await;
        let bytes = base64_decode(encoded.as_str().expect("base64 screenshot"));
        assert!(bytes.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }

    /// The browser's console and network log entries since the last call.
    pub async fn log(&self) -> Vec<Value> {
        let entries = self.call("POST", "/se/log", Some(json!({ "type": "browser" }))).await;
        entries.as_array().cloned().unwrap_or_default()
    }

    /// Ends the WebDriver session (the browser quits), then kills what is left by PID.
    pub async fn quit(self) {
        let _ = self.http.delete(&self.base).send().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        for pid in descendants(self.driver.id()) {
            // SAFETY: sending SIGKILL to a process this test started (a descendant of its own
            // chromedriver child), by PID.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Every live descendant of `root`, from `/proc/*/stat`.
fn descendants(root: u32) -> Vec<u32> {
    let mut parents = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // The command name may hold spaces and parentheses: the fields follow the last ')'.
        let Some(after) = stat.rsplit_once(')').map(|(_, rest)| rest) else { continue };
        if let Some(ppid) = after.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok()) {
            parents.push((pid, ppid));
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() && found.len() < 10_000 {
        let parent = found[i];
        found.extend(parents.iter().filter(|(_, ppid)| *ppid == parent).map(|(pid, _)| *pid));
        i += 1;
    }
    found.remove(0);
    found
}

/// Where the screenshots go: `target/dashboard-screenshots/`.
pub fn artifacts_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"), PathBuf::from);
    target.join("dashboard-screenshots")
}

fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let clean: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=').collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let mut bits = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            bits |= value(c) << (18 - 6 * i);
        }
        let bytes = bits.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}
