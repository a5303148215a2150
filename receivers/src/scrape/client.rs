//! The HTTP client of scrapes and HTTP SD: the collector's GET client
//! ([`proflow_net::http`]: pooled connections, rustls, redirects,
//! bounded bodies) with a job's settings: `basic_auth` or `authorization`
//! headers, `tls_config`, `follow_redirects`.

use std::time::Duration;

use http::header::HeaderValue;
pub use proflow_core::component::error_chain;
pub use proflow_net::http::{FetchError, HttpClient};
use proflow_net::http::{Options, header_value};

use super::config::{Authorization, BasicAuth, ClientTlsSettings};

/// The client settings of a job or an HTTP SD config.
#[derive(Debug, Clone, Copy)]
pub struct ClientSettings<'a> {
    pub basic_auth: Option<&'a BasicAuth>,
    pub authorization: Option<&'a Authorization>,
    pub tls_config: Option<&'a ClientTlsSettings>,
    pub follow_redirects: bool,
}

fn read_secret(path: &std::path::Path, field: &str) -> Result<String, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("{field} `{}`: {e}", path.display()))?;
    Ok(text.trim_end_matches(['\r', '\n']).to_owned())
}

/// A client for `settings`; reads password and credential files and the
/// TLS files now, so a missing file fails the start with its name.
pub fn build(
    settings: ClientSettings<'_>,
    connect_timeout: Duration,
) -> Result<HttpClient, String> {
    let tls = settings.tls_config.cloned().unwrap_or_default();
    let auth = auth_header(settings)?;
    HttpClient::new(Options {
        tls: (&tls).into(),
        // Roots are loaded only when TLS may be used: a job's targets may
        // turn to https by relabelling, so load them whenever tls_config
        // is set.
        load_roots: settings.tls_config.is_some(),
        auth,
        follow_redirects: settings.follow_redirects,
        connect_timeout,
    })
    .map_err(|e| format!("tls_config: {e}"))
}

/// The `Authorization` header `basic_auth` or `authorization` make.
pub(crate) fn auth_header(settings: ClientSettings<'_>) -> Result<Option<HeaderValue>, String> {
    Ok(match (settings.basic_auth, settings.authorization) {
        (Some(b), _) => {
            let password = match (&b.password, &b.password_file) {
                (Some(p), _) => p.clone(),
                (None, Some(f)) => read_secret(f, "basic_auth.password_file")?,
                (None, None) => String::new(),
            };
            use base64::Engine as _;
            let token = base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{password}", b.username));
            Some(header_value(&format!("Basic {token}"), "basic_auth")?)
        }
        (None, Some(a)) => {
            let credentials = match (&a.credentials, &a.credentials_file) {
                (Some(c), _) => c.clone(),
                (None, Some(f)) => read_secret(f, "authorization.credentials_file")?,
                (None, None) => String::new(),
            };
            Some(header_value(
                &format!("{} {credentials}", a.kind),
                "authorization",
            )?)
        }
        (None, None) => None,
    })
}
