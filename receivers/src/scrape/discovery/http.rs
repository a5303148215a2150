//! HTTP service discovery (`http_sd_configs`): target groups fetched from
//! an endpoint, as Prometheus's http_sd fetches them.
//!
//! The URL is fetched at start and every `refresh_interval`, each fetch
//! bounded to 10 seconds and [`MAX_SD_BYTES`]. The answer is a JSON list of
//! groups; Prometheus also requires `Content-Type: application/json`, and
//! proflow does not (the body is parsed as JSON whatever the header says),
//! so a hand-rolled endpoint that forgets the header still works.
//!
//! Every group gets `__meta_url`, the SD URL as configured. A fetch that
//! fails (no connection, a status other than 2xx, a body that is not a
//! group list) keeps the last good groups; the failure is logged once per
//! distinct error, and the recovery once.

use std::time::Duration;

use async_trait::async_trait;
use http::Uri;
use proflow_model::memory::MemoryBudget;
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::{
    Discoverer, Format, LogOnce, MAX_SD_BYTES, TargetGroup, Update, next_tick, parse_groups,
    send_if_changed,
};
use crate::scrape::client::{self, ClientSettings, FetchError, HttpClient};
use crate::scrape::config::{ClientTlsSettings, HttpSdConfig};

/// The label naming each group's SD URL (Prometheus's name).
pub const URL_LABEL: &str = "__meta_url";

/// Longest one fetch (connecting, and reading the answer) may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The discoverer of one `http_sd_configs` item.
pub struct HttpDiscoverer {
    url: Uri,
    /// The URL as configured, its password redacted: the `__meta_url`
    /// value.
    configured: String,
    refresh: Duration,
    client: HttpClient,
    /// Where an answer's memory is granted from, once given.
    memory: Option<MemoryBudget>,
}

impl HttpDiscoverer {
    /// Builds the discoverer and its HTTP client; an error names the field
    /// (`url`, `tls_config`, `basic_auth.password_file`, …).
    pub fn new(config: &HttpSdConfig) -> Result<Self, String> {
        let url: Uri = config
            .url
            .parse()
            .ok()
            .filter(|u: &Uri| {
                matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some()
            })
            .ok_or_else(|| {
                format!(
                    "url: {:?} is not an absolute http:// or https:// URL",
                    proflow_net::url::redact_userinfo(&config.url)
                )
            })?;
        // The client loads the system's CA roots only when a tls_config is
        // set (see client::build); an https SD URL needs them without one.
        let default_tls = ClientTlsSettings::default();
        let tls_config = config
            .tls_config
            .as_ref()
            .or((url.scheme_str() == Some("https")).then_some(&default_tls));
        let client = client::build(
            ClientSettings {
                basic_auth: config.basic_auth.as_ref(),
                authorization: config.authorization.as_ref(),
                tls_config,
                follow_redirects: config.follow_redirects,
            },
            FETCH_TIMEOUT,
        )?;
        Ok(HttpDiscoverer {
            url,
            // Shown in logs and as a label: never with its password.
            configured: proflow_net::url::redact_userinfo(&config.url),
            // Validation refuses 0; tokio's interval panics on it, so never pass it.
            refresh: config.refresh_interval.get().max(Duration::from_millis(1)),
            client,
            memory: None,
        })
    }

    /// One fetch: the groups with `__meta_url`, and the skipped entries; or
    /// why there are none.
    async fn fetch(&self) -> Result<(Vec<TargetGroup>, Vec<String>), String> {
        // The answer is granted as it arrives, and its parse before it is
        // made (the parse builds less than a JSON tree of it would take).
        let memory = self
            .memory
            .clone()
            .unwrap_or_else(|| MemoryBudget::new(usize::MAX));
        let mut grant = memory.grant();
        let body = match tokio::time::timeout(
            FETCH_TIMEOUT,
            self.client
                .get_granted(self.url.clone(), MAX_SD_BYTES, &mut grant),
        )
        .await
        {
            Err(_) => {
                return Err(format!(
                    "no complete answer within {}s: check that the endpoint is up and answers quickly",
                    FETCH_TIMEOUT.as_secs()
                ));
            }
            // The client's own message points at body_size_limit, which
            // does not apply here.
            Ok(Err(FetchError::TooLarge { .. })) => {
                return Err(format!(
                    "the answer is larger than {} MiB: serve fewer targets from one endpoint",
                    MAX_SD_BYTES >> 20
                ));
            }
            Ok(Err(e)) => return Err(format!("GET failed: {e}")),
            Ok(Ok(body)) => body,
        };
        let parse = proflow_model::json_shape::JsonShape::scan(&body).tree_bytes();
        grant
            .try_grow(parse)
            .map_err(|e| format!("no memory to read the answer now: {e}"))?;
        let parsed = parse_groups(&body, Format::Json).map_err(|e| format!("the answer {e}"))?;
        let groups = parsed
            .groups
            .into_iter()
            .map(|mut g| {
                g.labels
                    .insert(URL_LABEL.to_owned(), self.configured.clone());
                g
            })
            .collect();
        Ok((groups, parsed.skipped))
    }
}

#[async_trait]
impl Discoverer for HttpDiscoverer {
    fn describe(&self) -> String {
        format!("http_sd {}", self.configured)
    }

    fn grant_from(&mut self, memory: &MemoryBudget) {
        self.memory = Some(memory.clone());
    }

    async fn run(
        self: Box<Self>,
        provider: usize,
        updates: mpsc::Sender<Update>,
        shutdown: CancellationToken,
    ) {
        let source = self.describe();
        let mut log = LogOnce::default();
        let mut last_sent: Option<Vec<TargetGroup>> = None;
        // The first tick is at once: the first fetch is at start.
        let mut tick = tokio::time::interval(self.refresh);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            if !next_tick(&mut tick, &updates, &shutdown).await {
                return;
            }
            let fetched = tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                () = updates.closed() => return,
                fetched = self.fetch() => fetched,
            };
            match fetched {
                Ok((groups, skipped)) => {
                    log.succeeded(&source, skipped);
                    if !send_if_changed(&mut last_sent, groups, provider, &updates, &shutdown).await
                    {
                        return;
                    }
                }
                Err(e) => {
                    let kept = last_sent.iter().flatten().map(|g| g.targets.len()).sum();
                    log.failed(&source, &e, kept);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::scrape::discovery::tests::group;

    const WAIT: Duration = Duration::from_secs(5);

    /// What the test endpoint answers now: a status and a body.
    type Answer = Arc<Mutex<(u16, String)>>;

    /// A minimal HTTP/1.1 endpoint on 127.0.0.1: each connection gets the
    /// current answer, then is closed.
    async fn endpoint(answer: Answer) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let (status, body) = answer.lock().unwrap().clone();
                    let response = format!(
                        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = conn.write_all(response.as_bytes()).await;
                    let _ = conn.shutdown().await;
                });
            }
        });
        addr
    }

    fn config(url: String) -> HttpSdConfig {
        HttpSdConfig {
            url,
            refresh_interval: proflow_config::Duration::from_millis(20),
            basic_auth: None,
            authorization: None,
            tls_config: None,
            follow_redirects: true,
        }
    }

    async fn next(updates: &mut mpsc::Receiver<Update>) -> Vec<TargetGroup> {
        let update = tokio::time::timeout(WAIT, updates.recv())
            .await
            .expect("an update within 5s")
            .expect("the discoverer runs");
        assert_eq!(update.provider, 2);
        update.groups
    }

    async fn quiet(updates: &mut mpsc::Receiver<Update>) {
        if let Ok(update) = tokio::time::timeout(Duration::from_millis(300), updates.recv()).await {
            panic!("unexpected update {update:?}");
        }
    }

    fn set(answer: &Answer, status: u16, body: &str) {
        *answer.lock().unwrap() = (status, body.to_owned());
    }

    #[tokio::test]
    async fn groups_follow_the_endpoint_and_failures_keep_the_last_good() {
        let answer: Answer = Arc::new(Mutex::new((
            200,
            r#"[{"targets": ["a:1"], "labels": {"env": "prod"}}]"#.to_owned(),
        )));
        let url = format!("http://{}/sd", endpoint(answer.clone()).await);
        let d = HttpDiscoverer::new(&config(url.clone())).unwrap();
        assert_eq!(d.describe(), format!("http_sd {url}"));
        let (tx, mut updates) = mpsc::channel(16);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(Box::new(d).run(2, tx, shutdown.clone()));

        let first = [group(&["a:1"], &[("env", "prod"), (URL_LABEL, &url)])];
        assert_eq!(next(&mut updates).await, first);
        // Fetched again and again, unchanged: nothing more is sent.
        quiet(&mut updates).await;

        set(
            &answer,
            200,
            r#"[{"targets": ["a:1", "b:2"]}, {"targets": ["c:3", "bad"]}]"#,
        );
        assert_eq!(
            next(&mut updates).await,
            [
                group(&["a:1", "b:2"], &[(URL_LABEL, &url)]),
                group(&["c:3"], &[(URL_LABEL, &url)]),
            ]
        );

        set(&answer, 500, "internal error");
        quiet(&mut updates).await;
        set(&answer, 200, r#"[{"targets": ["a:1"]"#);
        quiet(&mut updates).await;

        set(&answer, 200, r#"[{"targets": ["d:4"]}]"#);
        assert_eq!(
            next(&mut updates).await,
            [group(&["d:4"], &[(URL_LABEL, &url)])]
        );

        shutdown.cancel();
        tokio::time::timeout(WAIT, task)
            .await
            .expect("run ends on shutdown")
            .unwrap();
    }

    #[tokio::test]
    async fn fetch_errors_say_what_went_wrong() {
        let answer: Answer = Arc::new(Mutex::new((503, "down for maintenance".to_owned())));
        let addr = endpoint(answer.clone()).await;
        let d = HttpDiscoverer::new(&config(format!("http://{addr}/sd"))).unwrap();
        assert_eq!(
            d.fetch().await.unwrap_err(),
            "GET failed: HTTP 503: down for maintenance"
        );
        set(&answer, 200, r#"{"targets": []}"#);
        let error = d.fetch().await.unwrap_err();
        assert!(
            error.starts_with("the answer is not a list of target groups"),
            "{error}"
        );
        set(&answer, 200, "");
        assert_eq!(
            d.fetch().await.unwrap_err(),
            "the answer is empty: write [] for no targets"
        );

        // Nothing listens on a port just freed.
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed_addr = closed.local_addr().unwrap();
        drop(closed);
        let d = HttpDiscoverer::new(&config(format!("http://{closed_addr}/sd"))).unwrap();
        let error = d.fetch().await.unwrap_err();
        assert!(error.starts_with("GET failed: "), "{error}");
    }

    #[tokio::test]
    async fn run_ends_on_shutdown_while_the_endpoint_is_down() {
        // A listener that accepts and never answers: the fetch hangs.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _keep = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                open.push(conn);
            }
        });
        let d = HttpDiscoverer::new(&config(format!("http://{addr}/sd"))).unwrap();
        let (tx, _updates) = mpsc::channel(16);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(Box::new(d).run(2, tx, shutdown.clone()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .expect("run ends on shutdown, mid-fetch")
            .unwrap();
    }

    #[test]
    fn urls_must_be_absolute_http() {
        for url in ["sd:8080", "/targets", "ftp://sd/t", "http://"] {
            let error = HttpDiscoverer::new(&config(url.to_owned())).err().unwrap();
            assert!(error.starts_with("url: "), "{url}: {error}");
        }
    }
}
