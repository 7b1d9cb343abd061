//! The dashboard in a real browser: Debian's chromium, driven through chromedriver (WebDriver)
//! with fantoccini. The running task's iteration advances on the page without a reload;
//! pressing pause pauses it in the daemon; "retry every failed task" brings two failed tasks
//! back; the task page shows the decoded checkpoint and the log tail; an action without the
//! token, or from a page of another origin, is refused and changes nothing.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

use crate::common::http::{free_port, get};
use crate::common::*;
use crate::web_dashboard::{fails_while, start_listening, ChildGuard};

const TEST: &str = "the_dashboard_in_chromium_follows_and_steers_the_queue";

/// Poll `probe` in the browser until it gives a value, or fail after [`DEADLINE`].
pub(crate) async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(crate) async fn text_of(client: &Client, css: &str) -> Option<String> {
    client.find(Locator::Css(css)).await.ok()?.text().await.ok()
}

/// The iteration the page shows for a task (`12/1000000` → 12).
pub(crate) async fn shown_iteration(client: &Client, id: &str) -> Option<u64> {
    let text = text_of(client, &format!("tr[data-id='{id}'] td.iteration")).await?;
    text.split('/').next()?.trim().parse().ok()
}

pub(crate) async fn click(client: &Client, css: &str) {
    client
        .wait()
        .at_most(DEADLINE)
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap_or_else(|e| panic!("clicking {css}: {e}"));
}

/// What `fetch` of an action answers from the page now open (status, or the error's name).
async fn fetch_from_page(client: &Client, url: &str, token: &str, mode: &str) -> String {
    let script = r#"
        const [url, token, mode, done] = arguments;
        const headers = mode === "no-cors" ? {"Content-Type": "text/plain"} : {"Content-Type": "application/json", "X-Cairn-Token": token};
        fetch(url, {method: "POST", mode, headers, body: JSON.stringify({id: "long"})})
          .then(r => done(String(r.status)), e => done("error: " + e.name));
    "#;
    let value = client
        .execute_async(script, vec![json!(url), json!(token), json!(mode)])
        .await
        .expect("running the page's fetch");
    value.as_str().unwrap_or_default().to_string()
}

/// Run `steps` in a fresh headless chromium (its profile under `queue`), driven through a
/// chromedriver that is ended, with the browsers it started, however the steps end. `false`
/// when chromium or chromedriver is missing (the test is skipped, said so by `require_tool`).
pub(crate) fn in_chromium<F, Fut>(test: &str, queue: &TestQueue, steps: F) -> bool
where
    F: FnOnce(Client) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let Some(chromium) = require_tool(test, "chromium", "chromium") else {
        return false;
    };
    let Some(chromedriver) = require_tool(test, "chromedriver", "chromium-driver") else {
        return false;
    };
    let driver_port = free_port();
    // In a process group of its own, which the browsers it starts join: ended as a whole.
    let driver = GroupGuard(
        Command::new(&chromedriver)
            .arg(format!("--port={driver_port}"))
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromedriver"),
    );
    // fantoccini's TLS stack (unused here: chromedriver is plain HTTP) wants a provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--disable-crash-reporter", "--disable-breakpad",
                         format!("--user-data-dir={}", queue.aux("chromium-profile").display())],
            }),
        );
        let driver_url = format!("http://127.0.0.1:{driver_port}");
        let client = eventually("chromedriver takes a session", || {
            let (capabilities, driver_url) = (capabilities.clone(), driver_url.clone());
            async move {
                ClientBuilder::rustls()
                    .ok()?
                    .capabilities(capabilities)
                    .connect(&driver_url)
                    .await
                    .ok()
            }
        })
        .await;
        let steps = std::panic::AssertUnwindSafe(steps(client.clone()));
        let outcome = futures::FutureExt::catch_unwind(steps).await;
        let _ = client.close().await;
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
    });
    drop(driver);
    true
}

#[test]
fn the_dashboard_in_chromium_follows_and_steers_the_queue() {
    if require_tool(TEST, "chromium", "chromium").is_none()
        || require_tool(TEST, "chromedriver", "chromium-driver").is_none()
    {
        return;
    }
    let queue = TestQueue::new();
    let mut long = loop_task("long", &queue.aux("long.side"), 1_000_000, 0.3);
    long["env"] = json!({"API_KEY": crate::web_dashboard::SECRET});
    // Each iteration says something on stderr, for the log tail.
    let command = long["phases"][0]["run"].clone();
    let mut run = vec![
        json!("sh"),
        json!("-c"),
        json!("echo log-line-from-long >&2; exec \"$@\""),
        json!("sh"),
    ];
    run.extend(command.as_array().unwrap().iter().cloned());
    long["phases"][0]["run"] = Value::from(run);
    queue.seed_task("long.json", &long);
    let flag = queue.aux("fail.flag");
    std::fs::write(&flag, "").unwrap();
    for id in ["bad1", "bad2"] {
        queue.seed_task(&format!("{id}.json"), &fails_while(id, &flag));
    }
    let (mut daemon, addr, token) = start_listening(&queue, true, &[]);
    queue.wait_failed("bad1");
    queue.wait_failed("bad2");

    // Another origin: a read-only cairn serve of an empty queue on another port.
    let other_queue = TestQueue::new();
    let other: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let other_serve = ChildGuard(
        other_queue
            .cairn()
            .args(["serve", "--listen", &other.to_string()])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cairn serve"),
    );
    wait_until("the other origin answers", DEADLINE, || {
        get(other, "/healthz").is_some()
    });

    let ran = in_chromium(TEST, &queue, |client| {
        let (queue, token, flag) = (&queue, &token, &flag);
        async move { browse(&client, queue, addr, other, token, flag).await }
    });
    assert!(ran, "chromium was found above");
    drop(other_serve);
    daemon.signal(SIGTERM);
    daemon.wait_exit(DEADLINE);
}

/// What the test does in the browser.
async fn browse(
    client: &Client,
    queue: &TestQueue,
    addr: SocketAddr,
    other: SocketAddr,
    token: &str,
    flag: &std::path::Path,
) {
    let client = client.clone();
    {
        // The first screen follows the running task without a reload.
        client
            .goto(&format!("http://{addr}/#token={token}"))
            .await
            .expect("opening the dashboard");
        let first = eventually("the page shows long's iteration", || {
            shown_iteration(&client, "long")
        })
        .await;
        client
            .execute("window.notReloaded = true;", vec![])
            .await
            .unwrap();
        eventually("the iteration advances on the page", || async {
            shown_iteration(&client, "long")
                .await
                .filter(|n| *n > first)
        })
        .await;
        let same_page = client
            .execute("return window.notReloaded === true;", vec![])
            .await
            .unwrap();
        assert_eq!(same_page, json!(true), "the page was reloaded");

        // Pause, pressed on the page, pauses the task in the daemon.
        click(&client, "tr[data-id='long'] button[data-action='pause']").await;
        eventually("the daemon pauses long", || async {
            queue
                .active_entry("long")
                .filter(|e| e["status"] == "paused")
        })
        .await;

        // Bulk retry of the failed tasks, which now pass.
        std::fs::remove_file(flag).unwrap();
        click(&client, "#bulk-retry-failed").await;
        for id in ["bad1", "bad2"] {
            eventually(&format!("{id} is done after the retry"), || async {
                queue.done(id)
            })
            .await;
        }

        // An action without the token (the page forgets it) is refused.
        client
            .execute("sessionStorage.clear();", vec![])
            .await
            .unwrap();
        let no_token = fetch_from_page(
            &client,
            &format!("http://{addr}/api/actions/resume"),
            "",
            "same-origin",
        )
        .await;
        assert_eq!(no_token, "403");
        // From a page of another origin, even with the token: the JSON request's preflight is
        // refused, and a simple request is refused by its origin.
        client.goto(&format!("http://{other}/")).await.unwrap();
        let cross = fetch_from_page(
            &client,
            &format!("http://{addr}/api/actions/resume"),
            token,
            "cors",
        )
        .await;
        assert!(
            cross.starts_with("error"),
            "a cross-origin action went through: {cross}"
        );
        let simple = fetch_from_page(
            &client,
            &format!("http://{addr}/api/actions/resume"),
            token,
            "no-cors",
        )
        .await;
        assert!(simple == "0" || simple.starts_with("error"), "{simple}");
        assert!(
            queue.list("control").is_empty(),
            "a refused action left a request"
        );
        assert_eq!(queue.active_entry("long").unwrap()["status"], "paused");

        // The task page: the decoded checkpoint and the log tail.
        client
            .goto(&format!("http://{addr}/task/long"))
            .await
            .unwrap();
        let state = eventually("the task page shows the decoded checkpoint", || async {
            text_of(&client, ".checkpoint-state")
                .await
                .filter(|t| t.contains("\"seen\""))
        })
        .await;
        assert!(state.contains("\"sum\""), "{state}");
        eventually("the task page shows the log tail", || async {
            text_of(&client, ".log-tail")
                .await
                .filter(|t| t.contains("log-line-from-long"))
        })
        .await;
        let shown = client.source().await.unwrap();
        assert!(!shown.contains(crate::web_dashboard::SECRET));
    }
}

/// A process group (a chromedriver and the browsers it started), killed when the test ends.
struct GroupGuard(std::process::Child);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(-(self.0.id() as i32));
        let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.0.wait();
    }
}
