//! Pieces of URLs that components build: query-string escaping (the
//! `pyroscope` exporter's `/ingest?name=…`, the `scrape` receiver's
//! `params`), and URLs as they may be shown (logs, `/targets`, error
//! messages): a user name and password, and query values, replaced by
//! [`SECRET`].

/// What a secret is shown as (Prometheus's word for its secrets).
pub const SECRET: &str = "<secret>";

/// Percent-encodes everything but unreserved characters (RFC 3986:
/// letters, digits, `-`, `_`, `.`, `~`), for a query name or value.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The user information of `text` (`user:password@` of a URL or of a
/// `host:port`), if it has any: what lies between the scheme (if any) and
/// the last `@` before the path.
fn userinfo_span(text: &str) -> Option<(usize, usize)> {
    let start = text.find("://").map_or(0, |i| i + 3);
    let rest = &text[start..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let at = rest[..end].rfind('@')?;
    Some((start, start + at))
}

/// True when `text` (a URL, or a `host:port`) names a user (and password).
pub fn has_userinfo(text: &str) -> bool {
    userinfo_span(text).is_some()
}

/// `text` (a URL, or a `host:port`) with its password replaced by
/// [`SECRET`] (`http://user:<secret>@host`), or its whole user information
/// when it has no `:` (a lone token: `http://<secret>@host`).
pub fn redact_userinfo(text: &str) -> String {
    let Some((start, end)) = userinfo_span(text) else {
        return text.to_owned();
    };
    let info = &text[start..end];
    let shown = match info.split_once(':') {
        Some((user, _)) => format!("{user}:{SECRET}"),
        None => SECRET.to_owned(),
    };
    format!("{}{shown}{}", &text[..start], &text[end..])
}

/// `url` as it may be shown: its user information redacted
/// ([`redact_userinfo`]) and the value of every query parameter but those
/// in `keep` replaced by [`SECRET`] (a token passed as a parameter is as
/// secret as a password).
pub fn redact_url(url: &str, keep: &[&str]) -> String {
    let url = redact_userinfo(url);
    let Some((base, query)) = url.split_once('?') else {
        return url;
    };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (query, None),
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if !keep.contains(&name) => format!("{name}={SECRET}"),
            _ => pair.to_owned(),
        })
        .collect();
    let mut shown = format!("{base}?{}", pairs.join("&"));
    if let Some(f) = fragment {
        shown.push('#');
        shown.push_str(f);
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_and_query_values_are_redacted() {
        assert_eq!(
            redact_userinfo("http://user:PASS@host:4040/x"),
            "http://user:<secret>@host:4040/x"
        );
        assert_eq!(
            redact_userinfo("user:PASS@10.0.0.1:6060"),
            "user:<secret>@10.0.0.1:6060"
        );
        assert_eq!(redact_userinfo("https://TOKEN@h/p"), "https://<secret>@h/p");
        // An @ in the path or query is not user information.
        assert_eq!(redact_userinfo("http://h:1/a@b?x=@"), "http://h:1/a@b?x=@");
        assert_eq!(redact_userinfo("h:1"), "h:1");
        assert!(has_userinfo("u:p@h:1") && !has_userinfo("http://h/@"));
        assert_eq!(
            redact_url(
                "http://u:p@h:1/debug/pprof/profile?seconds=14&token=abc",
                &["seconds"]
            ),
            "http://u:<secret>@h:1/debug/pprof/profile?seconds=14&token=<secret>"
        );
        assert_eq!(redact_url("http://h:1/p", &[]), "http://h:1/p");
    }

    #[test]
    fn only_unreserved_characters_stay() {
        assert_eq!(
            percent_encode("app.cpu{env=prod, x=1}"),
            "app.cpu%7Benv%3Dprod%2C%20x%3D1%7D"
        );
        assert_eq!(percent_encode("a-b_c.d~é"), "a-b_c.d~%C3%A9");
    }
}
