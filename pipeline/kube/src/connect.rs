//! Where the API server is, and how proflow authenticates to it.
//!
//! Three ways, in Prometheus's order of choice:
//! 1. `kubeconfig_file`: the current context's cluster (`server`,
//!    `certificate-authority[-data]`, `insecure-skip-tls-verify`) and user
//!    (`token`, `tokenFile`, `client-certificate[-data]` with
//!    `client-key[-data]`, `username`/`password`). Relative paths are
//!    relative to the kubeconfig's folder, as kubectl reads them. Exec and
//!    auth-provider plugins are refused with a message: proflow runs no
//!    programs to get a credential.
//! 2. `api_server`: that URL, with the component's own TLS settings and
//!    `Authorization` header.
//! 3. Neither: in-cluster, as a pod: `KUBERNETES_SERVICE_HOST` and
//!    `KUBERNETES_SERVICE_PORT`, the ServiceAccount's CA and token under
//!    `/var/run/secrets/kubernetes.io/serviceaccount/`. The token file is
//!    read again every minute (the kubelet renews projected tokens), as
//!    client-go does.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http::Uri;
use http::header::HeaderValue;
use proflow_net::http::{FetchError, HttpClient, Options, header_value};
use proflow_net::tls::ClientTls;
use serde::Deserialize;

/// Where a pod's ServiceAccount credentials are mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// How long a token read from a file is used before it is read again.
const TOKEN_REREAD: Duration = Duration::from_secs(60);
/// Longest a connection attempt to the API server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A component's connection settings, borrowed from its config.
#[derive(Debug, Clone, Default)]
pub struct Connect<'a> {
    /// The API server's URL (`https://host:port`); unset with
    /// `kubeconfig_file` unset means in-cluster.
    pub api_server: Option<&'a str>,
    /// A kubeconfig file; its current context says where and how.
    pub kubeconfig_file: Option<&'a Path>,
    /// TLS for `api_server` (unused with the other two ways, which carry
    /// their own).
    pub tls: ClientTls<'a>,
    /// `Authorization` for `api_server`.
    pub auth: Option<HeaderValue>,
    pub follow_redirects: bool,
}

/// A client of one API server; cheap to clone.
#[derive(Clone, Debug)]
pub struct Client {
    /// `https://host:port` with any path prefix, no trailing `/`.
    base: String,
    http: HttpClient,
    token: Option<std::sync::Arc<TokenFile>>,
    /// The namespace the pod runs in (in-cluster), or the kubeconfig
    /// context's; `default` when neither says.
    namespace: String,
}

/// A bearer token read from a file, read again when older than a minute.
#[derive(Debug)]
struct TokenFile {
    path: PathBuf,
    cached: Mutex<Option<(HeaderValue, Instant)>>,
}

impl TokenFile {
    fn header(&self) -> Result<HeaderValue, String> {
        let mut cached = self.cached.lock().map_err(|_| "token lock poisoned")?;
        if let Some((value, at)) = cached.as_ref()
            && at.elapsed() < TOKEN_REREAD
        {
            return Ok(value.clone());
        }
        let value = read_token(&self.path)?;
        *cached = Some((value.clone(), Instant::now()));
        Ok(value)
    }
}

fn read_token(path: &Path) -> Result<HeaderValue, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("the token file `{}`: {e}", path.display()))?;
    header_value(
        &format!("Bearer {}", text.trim()),
        &format!("the token file `{}`", path.display()),
    )
}

impl Client {
    /// Connects as `settings` say (see the module docs); reads the files
    /// it names now, so a missing one fails the start with its name.
    pub fn new(settings: &Connect<'_>) -> Result<Self, String> {
        match (settings.kubeconfig_file, settings.api_server) {
            (Some(_), Some(_)) => Err("set `api_server` or `kubeconfig_file`, not both".to_owned()),
            (Some(file), None) => from_kubeconfig(file, settings.follow_redirects),
            (None, Some(url)) => {
                let http = HttpClient::new(Options {
                    tls: settings.tls,
                    load_roots: true,
                    auth: settings.auth.clone(),
                    follow_redirects: settings.follow_redirects,
                    connect_timeout: CONNECT_TIMEOUT,
                })?;
                Ok(Client {
                    base: base_url(url)?,
                    http,
                    token: None,
                    namespace: "default".to_owned(),
                })
            }
            (None, None) => in_cluster(
                Path::new(SERVICE_ACCOUNT_DIR),
                std::env::var("KUBERNETES_SERVICE_HOST").ok(),
                std::env::var("KUBERNETES_SERVICE_PORT").ok(),
            ),
        }
    }

    /// The namespace of the pod proflow runs in (in-cluster), or of the
    /// kubeconfig's current context; `default` otherwise. Prometheus's
    /// `own_namespace`.
    pub fn own_namespace(&self) -> &str {
        &self.namespace
    }

    /// The API server's base URL (for logs).
    pub fn base(&self) -> &str {
        &self.base
    }

    fn url(&self, path_and_query: &str) -> Result<Uri, FetchError> {
        format!("{}{path_and_query}", self.base)
            .parse()
            .map_err(|e| FetchError::Connection(format!("bad URL {path_and_query:?}: {e}")))
    }

    fn auth(&self) -> Result<Option<HeaderValue>, FetchError> {
        match &self.token {
            Some(t) => t.header().map(Some).map_err(FetchError::Connection),
            None => Ok(None),
        }
    }

    /// GETs `path_and_query` (`/api/v1/pods?limit=500`), at most `limit`
    /// bytes of answer, every byte granted from `grant` as it arrives.
    pub async fn get_granted(
        &self,
        path_and_query: &str,
        limit: usize,
        grant: &mut proflow_model::memory::MemoryGrant,
    ) -> Result<Bytes, FetchError> {
        let url = self.url(path_and_query)?;
        let auth = self.auth()?;
        self.http
            .get_granted_as(url, limit, grant, auth.as_ref())
            .await
    }

    /// GETs `path_and_query` and gives the body as it arrives (a watch).
    pub async fn stream(&self, path_and_query: &str) -> Result<hyper::body::Incoming, FetchError> {
        let url = self.url(path_and_query)?;
        let auth = self.auth()?;
        self.http.get_streaming(url, auth.as_ref()).await
    }
}

/// `url` checked as an absolute http(s) URL, without a trailing `/`.
fn base_url(url: &str) -> Result<String, String> {
    let parsed: Uri = url
        .parse()
        .map_err(|_| format!("api_server: {url:?} is not a URL"))?;
    if !matches!(parsed.scheme_str(), Some("http" | "https")) || parsed.host().is_none() {
        return Err(format!(
            "api_server: {url:?} must be an absolute http:// or https:// URL (such as https://kubernetes.default.svc)"
        ));
    }
    if parsed.query().is_some() {
        return Err(format!("api_server: {url:?} must not have a query"));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

/// In-cluster settings from `dir` (the ServiceAccount mount) and the
/// service host and port the kubelet put in the environment.
pub(crate) fn in_cluster(
    dir: &Path,
    host: Option<String>,
    port: Option<String>,
) -> Result<Client, String> {
    let (Some(host), Some(port)) = (
        host.filter(|h| !h.is_empty()),
        port.filter(|p| !p.is_empty()),
    ) else {
        return Err("not running in a Kubernetes pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set): set `api_server` or `kubeconfig_file`".to_owned());
    };
    let host = if host.contains(':') {
        format!("[{host}]") // IPv6
    } else {
        host
    };
    let ca = dir.join("ca.crt");
    let token = dir.join("token");
    // Read now so that a pod without a mounted ServiceAccount fails at start.
    read_token(&token)?;
    let namespace = std::fs::read_to_string(dir.join("namespace"))
        .map(|n| n.trim().to_owned())
        .unwrap_or_else(|_| "default".to_owned());
    let http = HttpClient::new(Options {
        tls: ClientTls {
            ca_file: Some(&ca),
            ..Default::default()
        },
        load_roots: true,
        auth: None,
        follow_redirects: true,
        connect_timeout: CONNECT_TIMEOUT,
    })?;
    Ok(Client {
        base: format!("https://{host}:{port}"),
        http,
        token: Some(std::sync::Arc::new(TokenFile {
            path: token,
            cached: Mutex::new(None),
        })),
        namespace,
    })
}

// ---------------------------------------------------------------------------
// kubeconfig

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
struct Kubeconfig {
    current_context: String,
    contexts: Vec<Named<Context>>,
    clusters: Vec<Named<Cluster>>,
    users: Vec<Named<User>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Named<T> {
    name: String,
    #[serde(alias = "context", alias = "cluster", alias = "user")]
    item: T,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Context {
    cluster: String,
    user: String,
    namespace: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
struct Cluster {
    server: String,
    certificate_authority: Option<PathBuf>,
    certificate_authority_data: Option<String>,
    insecure_skip_tls_verify: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
struct User {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<PathBuf>,
    client_certificate: Option<PathBuf>,
    client_certificate_data: Option<String>,
    client_key: Option<PathBuf>,
    client_key_data: Option<String>,
    username: Option<String>,
    password: Option<String>,
    exec: Option<serde::de::IgnoredAny>,
    auth_provider: Option<serde::de::IgnoredAny>,
}

/// Most bytes of a kubeconfig file.
const MAX_KUBECONFIG_BYTES: u64 = 4 * 1024 * 1024;

/// A client for the current context of the kubeconfig `file`.
fn from_kubeconfig(file: &Path, follow_redirects: bool) -> Result<Client, String> {
    let k = KubeconfigFile {
        file,
        dir: file.parent().unwrap_or(Path::new(".")),
    };
    let config = k.read()?;
    let (context, cluster) = k.current_cluster(&config)?;
    let user = match config.users.iter().find(|u| u.name == context.user) {
        Some(u) => &u.item,
        None if context.user.is_empty() => &User::default(),
        None => {
            return Err(k.at(format!(
                "the user {:?} of the current context is not defined",
                context.user
            )));
        }
    };
    if user.exec.is_some() || user.auth_provider.is_some() {
        return Err(k.at(
            "the user gets its credential from an exec or auth-provider plugin, which proflow does not run: give it a `token`, `tokenFile` or client certificate (a ServiceAccount token works)".to_owned(),
        ));
    }
    let tls = KubeconfigTls::load(&k, cluster, user)?;
    let auth = k.auth(user)?;
    let token = k.token_file(user)?;
    let http = HttpClient::new(Options {
        tls: tls.client_tls(cluster.insecure_skip_tls_verify),
        load_roots: true,
        auth,
        follow_redirects,
        connect_timeout: CONNECT_TIMEOUT,
    })
    .map_err(|m| k.at(m))?;
    let base = base_url(&cluster.server)
        .map_err(|e| k.at(e.replacen("api_server", "the cluster's server", 1)))?;
    Ok(Client {
        base,
        http,
        token,
        namespace: if context.namespace.is_empty() {
            "default".to_owned()
        } else {
            context.namespace.clone()
        },
    })
}

/// A kubeconfig file being read: names itself in errors and resolves the
/// paths it holds.
struct KubeconfigFile<'a> {
    file: &'a Path,
    /// The file's folder, which relative paths in it start from.
    dir: &'a Path,
}

impl KubeconfigFile<'_> {
    /// `m` prefixed with the file it is about.
    fn at(&self, m: String) -> String {
        format!("kubeconfig_file `{}`: {m}", self.file.display())
    }

    /// `p` as kubectl reads it: a relative path starts at the file's folder.
    fn relative(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_owned()
        } else {
            self.dir.join(p)
        }
    }

    /// The base64 `data` of the field `what`, decoded.
    fn decode(&self, data: &str, what: &str) -> Result<Vec<u8>, String> {
        base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|e| self.at(format!("{what} is not base64: {e}")))
    }

    /// Reads and parses the file, refusing one too large to be a kubeconfig.
    fn read(&self) -> Result<Kubeconfig, String> {
        let len = std::fs::metadata(self.file)
            .map_err(|e| self.at(e.to_string()))?
            .len();
        if len > MAX_KUBECONFIG_BYTES {
            return Err(self.at(format!("is {len} bytes; a kubeconfig is far smaller")));
        }
        let text = std::fs::read_to_string(self.file).map_err(|e| self.at(e.to_string()))?;
        serde_saphyr::from_str(&text).map_err(|e| self.at(e.to_string()))
    }

    /// The current context and its cluster.
    fn current_cluster<'c>(
        &self,
        config: &'c Kubeconfig,
    ) -> Result<(&'c Context, &'c Cluster), String> {
        let context = config
            .contexts
            .iter()
            .find(|c| c.name == config.current_context)
            .map(|c| &c.item)
            .ok_or_else(|| {
                self.at(format!(
                    "current-context {:?} is not among its contexts; set current-context",
                    config.current_context
                ))
            })?;
        let cluster = config
            .clusters
            .iter()
            .find(|c| c.name == context.cluster)
            .map(|c| &c.item)
            .ok_or_else(|| {
                self.at(format!(
                    "the cluster {:?} of the current context is not defined",
                    context.cluster
                ))
            })?;
        Ok((context, cluster))
    }

    /// The `Authorization` header of `user`'s `token`, else of its
    /// `username` and `password`; none without either.
    fn auth(&self, user: &User) -> Result<Option<HeaderValue>, String> {
        Ok(match (&user.token, &user.username) {
            (Some(token), _) => Some(
                header_value(&format!("Bearer {}", token.trim()), "the user's token")
                    .map_err(|m| self.at(m))?,
            ),
            (None, Some(name)) => {
                let pair = format!("{name}:{}", user.password.as_deref().unwrap_or_default());
                Some(
                    header_value(
                        &format!(
                            "Basic {}",
                            base64::engine::general_purpose::STANDARD.encode(pair)
                        ),
                        "the user's username and password",
                    )
                    .map_err(|m| self.at(m))?,
                )
            }
            (None, None) => None,
        })
    }

    /// `user`'s `tokenFile` (unless it has a `token`), read once now so that
    /// a missing file fails at start.
    fn token_file(&self, user: &User) -> Result<Option<std::sync::Arc<TokenFile>>, String> {
        Ok(match (&user.token, &user.token_file) {
            (None, Some(path)) => {
                let path = self.relative(path);
                read_token(&path).map_err(|m| self.at(m))?;
                Some(std::sync::Arc::new(TokenFile {
                    path,
                    cached: Mutex::new(None),
                }))
            }
            _ => None,
        })
    }
}

/// The TLS material a kubeconfig's cluster and user name: inline PEM
/// decoded, file paths resolved; owned here so `ClientTls` can borrow it.
struct KubeconfigTls {
    ca_pem: Option<Vec<u8>>,
    cert_pem: Option<Vec<u8>>,
    key_pem: Option<Vec<u8>>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
}

impl KubeconfigTls {
    /// Decodes the `*-data` fields and resolves the file paths of `cluster` and `user`.
    fn load(k: &KubeconfigFile<'_>, cluster: &Cluster, user: &User) -> Result<Self, String> {
        let ca_pem = cluster
            .certificate_authority_data
            .as_deref()
            .map(|d| k.decode(d, "certificate-authority-data"))
            .transpose()?;
        let cert_pem = user
            .client_certificate_data
            .as_deref()
            .map(|d| k.decode(d, "client-certificate-data"))
            .transpose()?;
        let key_pem = user
            .client_key_data
            .as_deref()
            .map(|d| k.decode(d, "client-key-data"))
            .transpose()?;
        Ok(KubeconfigTls {
            ca_pem,
            cert_pem,
            key_pem,
            ca_file: cluster
                .certificate_authority
                .as_deref()
                .map(|p| k.relative(p)),
            cert_file: user.client_certificate.as_deref().map(|p| k.relative(p)),
            key_file: user.client_key.as_deref().map(|p| k.relative(p)),
        })
    }

    /// The client TLS settings borrowing this material.
    fn client_tls(&self, insecure_skip_verify: bool) -> ClientTls<'_> {
        ClientTls {
            ca_file: self.ca_file.as_deref(),
            cert_file: self.cert_file.as_deref(),
            key_file: self.key_file.as_deref(),
            insecure_skip_verify,
            ca_pem: self.ca_pem.as_deref(),
            cert_pem: self.cert_pem.as_deref(),
            key_pem: self.key_pem.as_deref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        path
    }

    #[test]
    fn a_kubeconfig_gives_the_current_contexts_server_and_namespace() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = write(
            dir.path(),
            "config",
            "apiVersion: v1\nkind: Config\ncurrent-context: b\n\
             clusters:\n- name: one\n  cluster: {server: 'https://one:6443/', insecure-skip-tls-verify: true}\n\
             - name: two\n  cluster: {server: 'https://two:443', insecure-skip-tls-verify: true}\n\
             users:\n- name: u\n  user: {token: abc}\n\
             contexts:\n- name: a\n  context: {cluster: one, user: u}\n- name: b\n  context: {cluster: two, user: u, namespace: team}\n",
        );
        let client = from_kubeconfig(&file, true).expect("kubeconfig");
        assert_eq!(client.base(), "https://two:443");
        assert_eq!(client.own_namespace(), "team");
    }

    #[test]
    fn kubeconfig_problems_say_what_to_do() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cases = [
            (
                "current-context: x\ncontexts: []\n",
                "current-context \"x\"",
            ),
            (
                "current-context: a\ncontexts: [{name: a, context: {cluster: c, user: u}}]\nclusters: [{name: c, cluster: {server: 'https://h'}}]\nusers: [{name: u, user: {exec: {command: aws}}}]\n",
                "exec or auth-provider plugin",
            ),
            (
                "current-context: a\ncontexts: [{name: a, context: {cluster: c}}]\nclusters: [{name: c, cluster: {server: 'ftp://h'}}]\n",
                "must be an absolute http",
            ),
            (
                "current-context: a\ncontexts: [{name: a, context: {cluster: c}}]\nclusters: [{name: c, cluster: {server: 'https://h', certificate-authority-data: '!!'}}]\n",
                "not base64",
            ),
        ];
        for (text, want) in cases {
            let file = write(dir.path(), "config", text);
            let e = from_kubeconfig(&file, true).expect_err(text);
            assert!(e.contains(want), "{e} lacks {want}");
        }
    }

    #[test]
    fn in_cluster_needs_the_service_env_and_a_token() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = in_cluster(dir.path(), None, None).expect_err("no env");
        assert!(e.contains("KUBERNETES_SERVICE_HOST"), "{e}");
        let e = in_cluster(dir.path(), Some("10.0.0.1".into()), Some("443".into()))
            .expect_err("no token");
        assert!(e.contains("token"), "{e}");
    }

    #[test]
    fn a_token_file_is_read_again_after_a_minute() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write(dir.path(), "token", "one\n");
        let t = TokenFile {
            path: path.clone(),
            cached: Mutex::new(None),
        };
        assert_eq!(t.header().expect("token"), "Bearer one");
        std::fs::write(&path, "two").expect("write");
        assert_eq!(t.header().expect("cached"), "Bearer one");
        if let Ok(mut c) = t.cached.lock()
            && let Some((_, at)) = c.as_mut()
            && let Some(earlier) = at.checked_sub(TOKEN_REREAD)
        {
            *at = earlier;
        }
        assert_eq!(t.header().expect("reread"), "Bearer two");
    }
}
