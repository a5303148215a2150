//! `auth` of a receiver: bearer tokens from a file and/or HTTP basic auth
//! from an htpasswd file (bcrypt). Both files are read again when they change
//! (checked every [`RELOAD_EVERY`](super::watch::RELOAD_EVERY)); a change that
//! does not load is logged and the previous credentials stay.
//!
//! Token file: one token per line, optionally followed by whitespace and the
//! tenant requests with that token belong to (their `X-Scope-OrgID` is then
//! ignored, so a token cannot write as another tenant). Empty lines and lines
//! starting with `#` are skipped.
//!
//! htpasswd file: `user:hash` per line, bcrypt hashes only (`htpasswd -B`);
//! other hash kinds are refused when the file is loaded, naming the line.
//! A verified user and password is remembered (by a digest, never the
//! password) until the file changes, since bcrypt is slow by design.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use base64::Engine;
use hyper::header::{AUTHORIZATION, HeaderMap};
use md5::Digest;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use proflow_config::FieldError;

/// `auth.basic_auth`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BasicAuthSettings {
    /// An htpasswd file with bcrypt hashes (`htpasswd -B -c FILE USER`).
    pub htpasswd_file: PathBuf,
}

/// `auth` of a receiver: requests must carry one of the credentials.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    /// A file of bearer tokens (`Authorization: Bearer <token>`), one per
    /// line, each optionally followed by the tenant it writes as.
    #[serde(default)]
    pub bearer_tokens_file: Option<PathBuf>,
    /// HTTP basic auth against an htpasswd file.
    #[serde(default)]
    pub basic_auth: Option<BasicAuthSettings>,
}

impl AuthSettings {
    /// Every problem, under `prefix` (`auth`): the files are loaded once.
    pub fn problems(&self, prefix: &str) -> Vec<FieldError> {
        let mut out = Vec::new();
        if self.bearer_tokens_file.is_none() && self.basic_auth.is_none() {
            out.push(FieldError::new(
                prefix,
                "names no credentials: set bearer_tokens_file and/or basic_auth.htpasswd_file (or remove auth)",
            ));
        }
        if let Some(path) = &self.bearer_tokens_file
            && let Err(e) = load_tokens(path)
        {
            out.push(FieldError::new(format!("{prefix}.bearer_tokens_file"), e));
        }
        if let Some(b) = &self.basic_auth
            && let Err(e) = load_htpasswd(&b.htpasswd_file)
        {
            out.push(FieldError::new(
                format!("{prefix}.basic_auth.htpasswd_file"),
                e,
            ));
        }
        out
    }

    fn files(&self) -> Vec<&Path> {
        let mut out: Vec<&Path> = self
            .bearer_tokens_file
            .iter()
            .map(PathBuf::as_path)
            .collect();
        out.extend(self.basic_auth.iter().map(|b| b.htpasswd_file.as_path()));
        out
    }
}

#[derive(Debug, Default)]
struct Credentials {
    /// Token → the tenant it writes as, if any.
    tokens: HashMap<String, Option<Arc<str>>>,
    /// User → bcrypt hash.
    users: HashMap<String, String>,
    /// A hash of the file's highest cost that no password matches: checked
    /// for unknown users, so they take as long as known ones.
    dummy_hash: String,
}

/// Why a request was turned away (401 / `UNAUTHENTICATED`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unauthenticated(pub &'static str);

impl std::fmt::Display for Unauthenticated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// Who a request was authenticated as.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Authenticated {
    /// The tenant its token writes as (overrides `X-Scope-OrgID`).
    pub tenant: Option<Arc<str>>,
}

/// The credentials of a running receiver, reloaded when the files change.
#[derive(Debug)]
pub struct Authenticator {
    settings: AuthSettings,
    current: RwLock<Arc<Credentials>>,
    /// Digests of `user:password` pairs bcrypt accepted (cleared on reload).
    verified: Mutex<HashSet<[u8; 16]>>,
    /// bcrypt runs on the blocking pool, this many at once: a flood of wrong
    /// passwords waits here instead of taking the async workers.
    bcrypt_slots: tokio::sync::Semaphore,
}

/// bcrypt checks running at once.
const BCRYPT_AT_ONCE: usize = 2;
/// The highest bcrypt cost accepted in an htpasswd file: each step doubles
/// the time of every first check (cost 14 is about a second here).
const MAX_BCRYPT_COST: u32 = 14;

/// Most verified basic-auth pairs remembered.
const VERIFIED_MAX: usize = 4096;

impl Authenticator {
    /// Loads the files and watches them until `stop`.
    pub fn start(
        settings: AuthSettings,
        what: &str,
        stop: CancellationToken,
    ) -> Result<Arc<Authenticator>, String> {
        // Stamped before reading, so a change made meanwhile is seen.
        let stamped = super::watch::stamps(&settings.files());
        let credentials = load(&settings)?;
        let auth = Arc::new(Authenticator {
            settings,
            current: RwLock::new(Arc::new(credentials)),
            verified: Mutex::new(HashSet::new()),
            bcrypt_slots: tokio::sync::Semaphore::new(BCRYPT_AT_ONCE),
        });
        let watched = auth.clone();
        let what = what.to_owned();
        super::watch::watch_files(&auth.settings.files(), stamped, stop, move || {
            match load(&watched.settings) {
                Ok(c) => {
                    *watched
                        .current
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(c);
                    watched
                        .verified
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .clear();
                    tracing::info!(receiver = %what, "credential files changed; reloaded");
                }
                Err(e) => {
                    tracing::error!(receiver = %what, error = %e, "credential files changed but do not load; the previous credentials stay");
                }
            }
        });
        Ok(auth)
    }

    /// Checks a request's `Authorization` header. Basic auth runs bcrypt
    /// (slow by design) once per distinct pair until the file changes, on
    /// the blocking pool; an unknown user costs the same as a wrong password.
    pub async fn check(&self, headers: &HeaderMap) -> Result<Authenticated, Unauthenticated> {
        let Some(value) = headers.get(AUTHORIZATION) else {
            return Err(Unauthenticated(
                "credentials required (Authorization header)",
            ));
        };
        let value = value
            .to_str()
            .map_err(|_| Unauthenticated("the Authorization header is not text"))?;
        let credentials = self
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let (scheme, rest) = value.split_once(' ').unwrap_or((value, ""));
        if scheme.eq_ignore_ascii_case("bearer") {
            return match credentials.tokens.get(rest.trim()) {
                Some(tenant) if self.settings.bearer_tokens_file.is_some() => Ok(Authenticated {
                    tenant: tenant.clone(),
                }),
                _ => Err(Unauthenticated("the bearer token is not valid")),
            };
        }
        if scheme.eq_ignore_ascii_case("basic") && self.settings.basic_auth.is_some() {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(rest.trim())
                .map_err(|_| Unauthenticated("the basic credentials are not base64"))?;
            let pair = String::from_utf8(decoded)
                .map_err(|_| Unauthenticated("the basic credentials are not UTF-8"))?;
            let (user, password) = pair.split_once(':').ok_or(Unauthenticated(
                "the basic credentials have no `user:password`",
            ))?;
            let (hash, known) = match credentials.users.get(user) {
                Some(hash) => (hash.as_str(), true),
                None => (credentials.dummy_hash.as_str(), false),
            };
            let digest: [u8; 16] = md5::Md5::new()
                .chain_update(hash.as_bytes())
                .chain_update([0])
                .chain_update(pair.as_bytes())
                .finalize()
                .into();
            let remembered = self
                .verified
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .contains(&digest);
            if remembered {
                return Ok(Authenticated::default());
            }
            let Ok(_slot) = self.bcrypt_slots.acquire().await else {
                return Err(Unauthenticated("unknown user or wrong password"));
            };
            let (password, hash_owned) = (password.to_owned(), hash.to_owned());
            let ok = tokio::task::spawn_blocking(move || {
                bcrypt::verify(password, &hash_owned).unwrap_or(false)
            })
            .await
            .unwrap_or(false);
            if ok && known {
                let mut verified = self
                    .verified
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if verified.len() >= VERIFIED_MAX {
                    verified.clear();
                }
                verified.insert(digest);
                return Ok(Authenticated::default());
            }
            return Err(Unauthenticated("unknown user or wrong password"));
        }
        Err(Unauthenticated(
            "unsupported Authorization scheme for this receiver",
        ))
    }
}

fn load(settings: &AuthSettings) -> Result<Credentials, String> {
    let mut c = Credentials::default();
    if let Some(path) = &settings.bearer_tokens_file {
        c.tokens = load_tokens(path)?;
    }
    if let Some(b) = &settings.basic_auth {
        c.users = load_htpasswd(&b.htpasswd_file)?;
        let cost = c
            .users
            .values()
            .filter_map(|h| cost_of(h))
            .max()
            .unwrap_or(10);
        c.dummy_hash = bcrypt::hash_with_salt(b"proflow: no user has this", cost, [0x5a; 16])
            .map(|h| h.format_for_version(bcrypt::Version::TwoY))
            .map_err(|e| format!("bcrypt: {e}"))?;
    }
    Ok(c)
}

fn load_tokens(path: &Path) -> Result<HashMap<String, Option<Arc<str>>>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("`{}`: {e}", path.display()))?;
    let mut out = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(token), tenant) = (parts.next(), parts.next()) else {
            continue;
        };
        if let Some(t) = tenant
            && hyper::header::HeaderValue::from_str(t).is_err()
        {
            return Err(format!(
                "`{}`: the tenant of a token must be printable text (it becomes X-Scope-OrgID), got {t:?}",
                path.display()
            ));
        }
        out.insert(token.to_owned(), tenant.map(Arc::from));
    }
    if out.is_empty() {
        return Err(format!(
            "`{}` holds no token: write one token per line",
            path.display()
        ));
    }
    Ok(out)
}

/// The cost of a `$2y$NN$...` hash.
fn cost_of(hash: &str) -> Option<u32> {
    hash.get(4..6)?.parse().ok()
}

fn load_htpasswd(path: &Path) -> Result<HashMap<String, String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("`{}`: {e}", path.display()))?;
    let mut out = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((user, hash)) = line.split_once(':') else {
            return Err(format!(
                "`{}` line {}: not `user:hash`",
                path.display(),
                n + 1
            ));
        };
        if !["$2a$", "$2b$", "$2y$", "$2x$"]
            .iter()
            .any(|p| hash.starts_with(p))
        {
            return Err(format!(
                "`{}` line {}: user `{user}` has a hash that is not bcrypt; make the file with `htpasswd -B`",
                path.display(),
                n + 1
            ));
        }
        match cost_of(hash) {
            Some(cost) if cost <= MAX_BCRYPT_COST => {}
            _ => {
                return Err(format!(
                    "`{}` line {}: user `{user}` has a bcrypt cost above {MAX_BCRYPT_COST} (or none): every first check of a password would take seconds; make the hash with `htpasswd -B -C 10`",
                    path.display(),
                    n + 1
                ));
            }
        }
        out.insert(user.to_owned(), hash.to_owned());
    }
    if out.is_empty() {
        return Err(format!("`{}` holds no user", path.display()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, value.parse().unwrap());
        h
    }

    #[tokio::test]
    async fn tokens_and_basic_auth_are_checked_and_reloaded() {
        let dir = tempdir();
        let tokens = dir.join("tokens");
        std::fs::write(&tokens, "# comment\nsecret-a team-a\nsecret-b\n").unwrap();
        let htpasswd = dir.join("htpasswd");
        let hash = bcrypt::hash_with_salt("pw", 4, [7u8; 16])
            .unwrap()
            .format_for_version(bcrypt::Version::TwoY);
        std::fs::write(&htpasswd, format!("alice:{hash}\n")).unwrap();
        let stop = CancellationToken::new();
        let auth = Authenticator::start(
            AuthSettings {
                bearer_tokens_file: Some(tokens.clone()),
                basic_auth: Some(BasicAuthSettings {
                    htpasswd_file: htpasswd,
                }),
            },
            "test",
            stop.clone(),
        )
        .unwrap();
        assert_eq!(
            auth.check(&headers("Bearer secret-a"))
                .await
                .unwrap()
                .tenant
                .as_deref(),
            Some("team-a")
        );
        assert_eq!(
            auth.check(&headers("bearer secret-b"))
                .await
                .unwrap()
                .tenant,
            None
        );
        assert!(auth.check(&headers("Bearer nope")).await.is_err());
        assert!(auth.check(&HeaderMap::new()).await.is_err());
        let basic = |pair: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            )
        };
        assert!(auth.check(&headers(&basic("alice:pw"))).await.is_ok());
        assert!(
            auth.check(&headers(&basic("alice:pw"))).await.is_ok(),
            "remembered"
        );
        assert!(auth.check(&headers(&basic("alice:wrong"))).await.is_err());
        assert!(auth.check(&headers(&basic("bob:pw"))).await.is_err());
        // The token file changes: the new token works within seconds.
        std::fs::write(&tokens, "secret-c\n").unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while auth.check(&headers("Bearer secret-c")).await.is_err() {
            assert!(std::time::Instant::now() < deadline, "not reloaded");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert!(auth.check(&headers("Bearer secret-a")).await.is_err());
        stop.cancel();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn files_that_do_not_load_are_named() {
        let dir = tempdir();
        let bad = dir.join("htpasswd");
        std::fs::write(&bad, "alice:$apr1$abc$def\n").unwrap();
        let settings = AuthSettings {
            bearer_tokens_file: Some(dir.join("missing")),
            basic_auth: Some(BasicAuthSettings { htpasswd_file: bad }),
        };
        let problems: Vec<String> = settings
            .problems("auth")
            .iter()
            .map(|p| format!("{}: {}", p.path, p.message))
            .collect();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].contains("auth.bearer_tokens_file"),
            "{problems:?}"
        );
        assert!(problems[1].contains("htpasswd -B"), "{problems:?}");
        let none = AuthSettings {
            bearer_tokens_file: None,
            basic_auth: None,
        };
        assert_eq!(none.problems("auth").len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempdir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "proflow-auth-{}-{}",
            std::process::id(),
            proflow_model::model::now_unix_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
