//! `${env:VAR}` and `${env:VAR:-default}` expansion, as the OpenTelemetry
//! Collector writes it. `$$` is a literal `$`. An unset variable without a
//! default is an error (the Collector silently expands it to empty; a typo in a
//! variable name should not become an empty endpoint).

/// Expands every `${env:...}` in `s` using `lookup`. Returns `Ok(None)` when `s`
/// contains nothing to expand.
pub fn expand_env(
    s: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<String>, String> {
    if !s.contains('$') {
        return Ok(None);
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(body) = after.strip_prefix("{env:") {
            let end = body
                .find('}')
                .ok_or_else(|| format!("unclosed `${{env:` in {s:?}: write `${{env:NAME}}`"))?;
            let spec = &body[..end];
            let (name, default) = match spec.split_once(":-") {
                Some((n, d)) => (n, Some(d)),
                None => (spec, None),
            };
            if name.is_empty() || !name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_') {
                return Err(format!(
                    "invalid environment variable name {name:?} in {s:?}"
                ));
            }
            match (lookup(name), default) {
                (Some(v), _) => out.push_str(&v),
                (None, Some(d)) => out.push_str(d),
                (None, None) => {
                    return Err(format!(
                        "environment variable {name} is not set: set it, or give a default with `${{env:{name}:-default}}`"
                    ));
                }
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "PORT" => Some("4040".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn expands() {
        assert_eq!(expand_env("plain", &env), Ok(None));
        assert_eq!(
            expand_env("0.0.0.0:${env:PORT}", &env),
            Ok(Some("0.0.0.0:4040".into()))
        );
        assert_eq!(
            expand_env("${env:NOPE:-x}-${env:EMPTY}", &env),
            Ok(Some("x-".into()))
        );
        assert_eq!(
            expand_env("$${env:PORT} costs $5", &env),
            Ok(Some("${env:PORT} costs $5".into()))
        );
        assert!(
            expand_env("${env:NOPE}", &env)
                .unwrap_err()
                .contains("NOPE is not set")
        );
        assert!(expand_env("${env:PORT", &env).is_err());
        assert!(expand_env("${env:a-b}", &env).is_err());
    }
}
